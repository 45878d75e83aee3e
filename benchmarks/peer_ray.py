"""Ray's side of ``run.py --peers``: the same workloads through Ray's ``runtime_env``.

    benchmarks/.peers/ray/bin/python benchmarks/peer_ray.py CONFIG.json

Runs in its own venv (``ray[default]``, made by ``run.py``), on 127.0.0.1 (a local
cluster started by ``ray.init``, no dashboard). Prints one JSON object, workload -> result
(see ``_common``), on stdout; progress on stderr. Every ``pip`` env uses the run's wheelhouse
through ``pip_install_options`` (``--no-index --find-links``); a distinct pin per run makes
each a new env. Workers that must be new (W2b, W5, W6) come from ``max_calls=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _common
import ray
import ray.cloudpickle
from _common import (
    FOUR,
    MISSING,
    SMALL,
    Emitted,
    change_one_byte,
    count_files,
    descendants,
    error_runs,
    import_all,
    na,
    noop,
    pinned,
    pip_workloads,
    progress,
    repeat,
    rss_mb,
    stats,
    timed,
)

ray.cloudpickle.register_pickle_by_value(_common)  # the workers need not import it


def main(config: dict[str, Any]) -> None:
    wh, reps, tree = config["wheelhouse"], config["reps"], Path(config["tree"])
    pip_cache = tempfile.mkdtemp(prefix="ray-pip-cache-")
    out = Emitted(ray.__version__)
    start = time.perf_counter()
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        configure_logging=False,
    )
    progress(f"ray {ray.__version__}: started in {time.perf_counter() - start:.1f} s")
    agent = [p for p in descendants() if b"runtime_env" in _cmdline(p)]
    out["M1 agent idle"] = stats([rss_mb(agent)], "MB") if agent else na("agent not found")
    out["S1"] = na("no server in a notebook's path to measure")

    task = ray.remote(import_all)
    nop = ray.remote(noop)
    nop_once = ray.remote(max_calls=1)(noop)  # a new worker for every call

    def pip_env(packages: list[str], cache: list[str]) -> dict[str, Any]:
        options = ["--no-index", "--find-links", wh, *cache]
        return {"pip": {"packages": packages, "pip_install_options": options}}

    def w1(packages: list[str], cache: list[str], tag: int) -> float:
        env = pip_env(pinned(packages, tag), cache)
        return timed(lambda: ray.get(task.options(runtime_env=env).remote(packages)))

    cold, warm = ["--no-cache-dir"], ["--cache-dir", pip_cache]
    out.update(pip_workloads("ray", w1, reps, cold, warm))

    progress("ray W2 / W2b")
    env = pip_env(pinned(SMALL, 200), warm)  # built in W1 warm
    ray.get(nop.options(runtime_env=env).remote())
    out["W2"] = stats(
        repeat(
            reps["rtt"], lambda _i: timed(lambda: ray.get(nop.options(runtime_env=env).remote()))
        )
    )
    fresh = nop_once.options(runtime_env=env)
    ray.get([fresh.remote() for _ in range(2)])  # ends the idle workers W2 left in this env
    out["W2b"] = stats(repeat(reps["start"], lambda _i: timed(lambda: ray.get(fresh.remote()))))

    progress("ray W3")

    def w3(i: int) -> float:
        envs = [pip_env(pinned(p, 300 + i), warm) for p in FOUR]
        return timed(
            lambda: ray.get(
                [task.options(runtime_env=e).remote(p) for e, p in zip(envs, FOUR, strict=True)]
            )
        )

    out["W3"] = stats(repeat(reps["w3"], w3))
    if agent:
        out["M1 agent after W3"] = stats([rss_mb(agent)], "MB")

    progress("ray W4")
    ray.get([nop.remote() for _ in range(200)])

    def burst(_i: int) -> float:
        return 1000 / timed(lambda: ray.get([nop.remote() for _ in range(1000)]))

    out["W4 throughput"] = stats(repeat(reps["burst"], burst), "tasks/s")
    out["W4 round trip"] = stats(repeat(100, lambda _i: timed(lambda: ray.get(nop.remote()))))
    out["M1 processes after W4"] = stats([rss_mb(descendants())], "MB")

    progress("ray W5")
    address = ray.get_runtime_context().gcs_address

    def w5(change: bool) -> float:
        # Ray ships a local directory only at the job level: each run is a new job on this
        # cluster, started by a new driver (its connect time included), as a user would.
        if change:
            change_one_byte(tree)
        argv = [sys.executable, __file__, "--w5", address, str(tree)]
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        return float(done.stdout.strip().splitlines()[-1])

    # Ray has no incremental path: a changed tree is zipped, uploaded and unpacked whole, as a
    # first one is; after the first run, "first" runs are trees it has not seen (a byte off).
    first = [w5(False)]
    out["W5 first"] = stats(first + repeat(reps["wd"] - 1, lambda _i: w5(True)), note="new job")
    out["W5 unchanged"] = stats(repeat(reps["wd"], lambda _i: w5(False)), note="new job")
    out["W5 one byte"] = stats(repeat(reps["wd"], lambda _i: w5(True)), note="new job")

    progress("ray W6 / W8")

    def w6(_i: int) -> float:
        env = {"env_vars": {"JRE_BENCH_RUN": uuid.uuid4().hex}}
        return timed(lambda: ray.get(nop_once.options(runtime_env=env).remote()))

    out["W6"] = stats(repeat(reps["start"], w6))

    def w8(i: int) -> tuple[float, str | None]:
        env = pip_env([MISSING, f"six>=0.0.{400 + i}"], warm)
        start = time.perf_counter()
        try:
            ray.get(nop.options(runtime_env=env).remote(), timeout=300)
        except Exception as exc:  # RuntimeEnvSetupError
            return time.perf_counter() - start, str(exc)
        return time.perf_counter() - start, None

    out["W8"] = error_runs(reps["w8"], w8)
    ray.shutdown()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def w5_job(address: str, tree: str) -> float:
    """One W5 run as its own job: connect with the tree as working_dir, run, disconnect."""
    start = time.perf_counter()
    ray.init(address=address, runtime_env={"working_dir": tree}, log_to_driver=False)
    assert ray.get(ray.remote(count_files).remote()) > 0
    elapsed = time.perf_counter() - start
    ray.shutdown()
    return elapsed


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # 127.0.0.1 only, one user
    if sys.argv[1] == "--w5":
        print(w5_job(sys.argv[2], sys.argv[3]))
        sys.exit(0)
    cfg = json.loads(Path(sys.argv[1]).read_text())
    main(cfg)
