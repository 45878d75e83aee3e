"""Dask's side of ``run.py --peers``: the same workloads through ``distributed``.

    benchmarks/.peers/dask/bin/python benchmarks/peer_dask.py CONFIG.json

Runs in its own venv (``distributed``, made by ``run.py``) on a ``LocalCluster`` of two
single-threaded worker processes with nannies on 127.0.0.1, no dashboard. Prints one JSON
object, workload -> result (see ``_common``), on stdout; progress on stderr.

Dask has no per-task environments: ``PipInstall`` installs into the one environment every
worker shares (here the venv itself, from the run's wheelhouse), so W1 measures that install
plus the task, with the packages uninstalled between runs (``packaging`` stays: Dask needs
it); ``UploadDirectory`` zips and ships the whole tree at each registration; the ``Environ``
nanny plugin sets variables by restarting the workers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _common
import cloudpickle
import dask
import distributed
from _common import (
    MISSING,
    Emitted,
    change_one_byte,
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
from distributed import Client, LocalCluster, PipInstall
from distributed.diagnostics.plugin import Environ, UploadDirectory

cloudpickle.register_pickle_by_value(_common)  # the workers cannot import it


def uploaded_files(name: str) -> int:
    """W5's task: count the files of the uploaded directory on this worker (its nanny
    unpacks it in the nanny's directory, the parent of the worker's)."""
    root = os.path.join(os.path.dirname(distributed.get_worker().local_directory), name)
    return sum(len(files) for _, _, files in os.walk(root))


def ignore(_item: object) -> None:
    """W4's no-op for ``client.map`` (which passes each item)."""


def main(config: dict[str, Any]) -> None:
    wh, reps, tree = config["wheelhouse"], config["reps"], Path(config["tree"])
    out = Emitted(distributed.__version__)
    base_rss = rss_mb([os.getpid()])
    dask.config.set({"distributed.worker.daemon": False})
    start = time.perf_counter()
    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
    )
    client = Client(cluster)
    progress(f"dask {distributed.__version__}: started in {time.perf_counter() - start:.1f} s")

    def uninstall(packages: list[str]) -> None:
        names = [p for p in packages if p != "packaging"]
        argv = [sys.executable, "-m", "pip", "uninstall", "-q", "-y", *names]
        subprocess.run(argv, check=True, capture_output=True)

    def w1(packages: list[str], cache: list[str], tag: int) -> float:
        options = ["--no-index", "--find-links", wh, "-q", *cache]
        plugin = PipInstall(pinned(packages, tag), pip_options=options)

        def run() -> None:
            client.register_plugin(plugin)
            client.submit(import_all, packages, pure=False).result()

        try:
            return timed(run)
        finally:
            client.unregister_scheduler_plugin(plugin.name)
            uninstall(packages)

    out["W3"] = na("no per-task environments: PipInstall changes the one env all workers share")
    out["M1 agent idle"] = na("no agent: PipInstall runs pip in the scheduler and each worker")
    out["S1"] = na("no server in a notebook's path to measure")
    cold, warm = ["--no-cache-dir"], []
    out.update(pip_workloads("dask", w1, reps, cold, warm))

    progress("dask W2 / W4")
    client.submit(noop, pure=False).result()
    out["W2"] = stats(
        repeat(reps["rtt"], lambda _i: timed(lambda: client.submit(noop, pure=False).result()))
    )
    client.gather(client.map(ignore, range(200), pure=False))

    def burst(_i: int) -> float:
        return 1000 / timed(lambda: client.gather(client.map(ignore, range(1000), pure=False)))

    out["W4 throughput"] = stats(repeat(reps["burst"], burst), "tasks/s")
    out["W4 round trip"] = stats(
        repeat(100, lambda _i: timed(lambda: client.submit(noop, pure=False).result()))
    )
    # The scheduler runs in this process: its growth counts with the nannies and workers.
    own = max(0.0, rss_mb([os.getpid()]) - base_rss)
    out["M1 processes after W4"] = stats([rss_mb(descendants()) + own], "MB")

    progress("dask W5")

    def w5(change: bool) -> float:
        if change:
            change_one_byte(tree)

        def run() -> None:
            client.register_plugin(UploadDirectory(str(tree), update_path=True))
            assert client.submit(uploaded_files, tree.name, pure=False).result() > 0

        return timed(run)

    out["W5 first"] = stats(repeat(reps["wd"], lambda _i: w5(False)))
    out["W5 unchanged"] = stats(repeat(reps["wd"], lambda _i: w5(False)))
    out["W5 one byte"] = stats(repeat(reps["wd"], lambda _i: w5(True)))

    progress("dask W8")

    def w8(i: int) -> tuple[float, str | None]:
        plugin = PipInstall(
            [MISSING, f"six>=0.0.{400 + i}"], pip_options=["--no-index", "--find-links", wh]
        )
        start = time.perf_counter()
        try:
            client.register_plugin(plugin)
            client.submit(noop, pure=False).result()
        except Exception as exc:  # RuntimeError from pip, raised by register_plugin
            return time.perf_counter() - start, str(exc)
        return time.perf_counter() - start, None

    out["W8"] = error_runs(reps["w8"], w8)

    # Last: these restart the workers (the slowest runs here, and the first a tight budget
    # cuts short).
    progress("dask W2b / W6")

    def restarted(run: Callable[[], object]) -> Callable[[int], float]:
        return lambda _i: timed(lambda: (run(), client.submit(noop, pure=False).result()))

    out["W2b"] = stats(
        repeat(reps["start"], restarted(client.restart)), note="client.restart(), then the task"
    )

    def environ() -> None:
        client.register_plugin(Environ({"JRE_BENCH_RUN": uuid.uuid4().hex}))

    out["W6"] = stats(
        repeat(reps["start"], restarted(environ)), note="Environ plugin (restarts the workers)"
    )
    client.close()
    cluster.close()


if __name__ == "__main__":
    cfg = json.loads(Path(sys.argv[1]).read_text())
    main(cfg)
