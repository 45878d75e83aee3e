"""W2 (an idle worker's round trip) alone, with its floor, optionally against another checkout.

    .venv/bin/python benchmarks/bench_w2.py [--reps 1000] [--pairs 3] [--base DIR]

Each run is a fresh process (an embedded agent on a new cache, a ``LocalExecutor`` of two
workers, an env_vars env): after 300 warm-up calls, the raw pipe round trip floor
(``_common.pipe_rtt``), then W2 as ``ours.py`` times it (``remote().result()`` one by one:
median, best, p90), the same with 1 ms between calls (a notebook's pace: no call comes back
to back), and three W4 bursts of 1,000 calls (tasks/s). The load average is printed with
each run. ``--base DIR``: each pair runs another checkout's package too (``DIR`` first on
``PYTHONPATH``), back to back with this one, alternating which goes first; that is how
docs/benchmarks.md's A/B of polling before blocking was measured. No test runs this script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import HERE, noop, pipe_rtt


def one(reps: int) -> dict[str, Any]:
    """One run in this process (``--one``)."""
    import jupyter_runtimeenv as jre
    from jupyter_runtimeenv.agent import RuntimeEnvAgent
    from jupyter_runtimeenv.client import EmbeddedClient

    out: dict[str, Any] = {"package": str(Path(jre.__file__).parent), "load": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as cache:
        client = EmbeddedClient(RuntimeEnvAgent(cache))
        try:
            executor = jre.LocalExecutor(
                acquire=client.acquire_sync, release=client.release_sync, max_workers=2
            )
            jre.init(executor=executor)
            f = jre.remote(noop).options(runtime_env={"env_vars": {"JRE_BENCH_W2": "1"}})
            for _ in range(300):
                f.remote().result()
            floor = pipe_rtt(reps)
            w2 = []
            for _ in range(reps):
                start = time.perf_counter()
                f.remote().result()
                w2.append(time.perf_counter() - start)
            paced = []
            for _ in range(min(reps, 300)):
                time.sleep(0.001)
                start = time.perf_counter()
                f.remote().result()
                paced.append(time.perf_counter() - start)
            bursts = []
            for _ in range(3):
                start = time.perf_counter()
                jre.get([f.remote() for _ in range(1000)])
                bursts.append(1000 / (time.perf_counter() - start))
            executor.shutdown()
            jre.shutdown()
        finally:
            client.close()
    w2.sort()
    out.update(
        floor_ms=statistics.median(floor) * 1e3,
        w2_ms=statistics.median(w2) * 1e3,
        w2_best_ms=w2[0] * 1e3,
        w2_p90_ms=w2[int(len(w2) * 0.9)] * 1e3,
        paced_ms=statistics.median(paced) * 1e3,
        w4_per_s=sorted(round(b) for b in bursts),
        load_end=os.getloadavg()[0],
    )
    return out


def run(package: Path | None, reps: int) -> dict[str, Any]:
    env = dict(os.environ)
    if package is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(package), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(HERE / "bench_w2.py"), "--one", "--reps", str(reps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if package is not None and not result["package"].startswith(str(package)):
        raise SystemExit(f"--base {package}: jupyter_runtimeenv came from {result['package']}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=1000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--base", type=Path, help="another checkout, run back to back")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.reps)))
        return
    sides: list[tuple[str, Path | None]] = [("this", None)]
    if args.base is not None:
        sides.append(("base", args.base.resolve()))
    print("side  load       pipe ms  W2 ms   best    p90     paced   W4 bursts/s")
    for pair in range(args.pairs):
        for label, package in sides if pair % 2 == 0 else sides[::-1]:
            r = run(package, args.reps)
            print(
                f"{label:5} {r['load']:4.1f}-{r['load_end']:<4.1f} {r['floor_ms']:7.4f}  "
                f"{r['w2_ms']:.4f}  {r['w2_best_ms']:.4f}  {r['w2_p90_ms']:.4f}  "
                f"{r['paced_ms']:.4f}  {r['w4_per_s']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
