"""W10: a 200 MB numpy array, and a 200 MB pandas DataFrame, as the argument and the result
of a task on a local worker, against a ``memcpy`` of the same bytes measured in the same run.

    .venv/bin/python benchmarks/bench_w10.py [--reps N]      (also a step of run.py)

The driver needs numpy and pandas, so it runs in an environment built by the agent from the
wheelhouse (``pip: [numpy, pandas]``, layered over this venv), as a child process that
prints its numbers as JSON. There: a ``LocalExecutor`` with one worker of that environment;
the task returns its argument (so the result is 200 MB too); the first call (worker start,
numpy imported there, shared memory segments made) is left out, each measured call's
result is dropped before the next. The floor is ``numpy.copyto`` of 200 MB into an array
already written once (a memcpy, no page faults), the median of as many runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MB = 1 << 20
SIZE = 200 * MB


def identity(value: Any) -> Any:
    return value


def child(reps: int) -> dict[str, Any]:
    """In the environment with numpy and pandas: the measurements, as a dict."""
    import numpy as np
    import pandas as pd

    import jupyter_runtimeenv as jre
    from jupyter_runtimeenv.context import EnvContext
    from jupyter_runtimeenv.workers.executor import resolve_driver_sys_path

    ctx = EnvContext(python=sys.executable, driver_sys_path=resolve_driver_sys_path())
    executor = jre.LocalExecutor(
        acquire=lambda _spec, _holder: ctx, release=lambda _env, _holder: None, max_workers=1
    )
    jre.init(executor=executor)
    array = np.arange(SIZE // 8, dtype=np.float64)
    frame = pd.DataFrame({f"c{i}": np.arange(SIZE // 8 // 5, dtype=np.float64) for i in range(5)})
    target = np.empty_like(array)
    np.copyto(target, array)  # written once: the floor copies into pages that are there

    def floor() -> float:
        start = time.perf_counter()
        np.copyto(target, array)
        return time.perf_counter() - start

    def ours(value: Any) -> float:
        start = time.perf_counter()
        result = jre.remote(identity).remote(value).result(600)
        elapsed = time.perf_counter() - start
        del result
        return elapsed

    sizes = {"numpy": array.nbytes, "pandas": int(frame.memory_usage().sum())}
    out: dict[str, Any] = {"bytes": sizes}
    try:
        for label, value in (("numpy", array), ("pandas", frame)):
            check = jre.remote(identity).remote(value).result(600)  # the first, left out
            same = check.equals(value) if label == "pandas" else bool((check == value).all())
            if not same:
                raise SystemExit(f"W10 {label}: the result differs from the argument")
            del check
            out[label] = [ours(value) for _ in range(reps)]
            out[f"{label} floor"] = [floor() for _ in range(reps)]
    finally:
        executor.shutdown()
        jre.shutdown()
    return out


def env_python(tmp: Path, wheelhouse: Path) -> str:
    """An environment with numpy and pandas from the wheelhouse, built by the agent."""
    from jupyter_runtimeenv.agent import RuntimeEnvAgent
    from jupyter_runtimeenv.client import EmbeddedClient

    wanted = {"numpy", "pandas"}
    have = {p.name.split("-")[0].lower() for p in wheelhouse.glob("*.whl")}
    if not wanted <= have:
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:"),
                *("--dest", str(wheelhouse), *sorted(wanted)),
            ],
            check=True,
        )
    cache = tmp / "w10-agent"
    cache.mkdir(mode=0o700, exist_ok=True)
    client = EmbeddedClient(RuntimeEnvAgent(cache))
    try:
        options = ["--no-index", "--find-links", str(wheelhouse)]
        spec = {"pip": {"packages": sorted(wanted), "install_options": options}}
        return client.acquire_sync(spec, "w10").python
    finally:
        client.close()


def run(tmp: Path, wheelhouse: Path, reps: int) -> dict[str, Any]:
    """W10 in a child driver; its samples in seconds."""
    python = env_python(tmp, wheelhouse)
    done = subprocess.run(
        [python, __file__, "--child", "--reps", str(reps)],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
    )
    data: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.reps)))
        return
    import tempfile

    from _common import wheelhouse

    with tempfile.TemporaryDirectory(prefix="jre-bench-w10-") as name:
        data = run(Path(name), wheelhouse(), args.reps)
    for label in ("numpy", "pandas"):
        ours, floor = statistics.median(data[label]), statistics.median(data[f"{label} floor"])
        print(
            f"W10 {label} {data['bytes'][label] / MB:.0f} MB: {ours * 1e3:.1f} ms, "
            f"memcpy {floor * 1e3:.1f} ms, {ours / floor:.2f}x (target <= 3x), "
            f"load {os.getloadavg()[0]:.1f}"
        )


if __name__ == "__main__":
    main()
