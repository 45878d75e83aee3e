"""How deep a worker's pipeline should be: W4 and W2 for each depth, with their floor.

    .venv/bin/python benchmarks/bench_pipeline.py [--depths 1,2,4,8,16,32] [--bursts N]

For each depth: W4 (bursts of 1,000 no-op tasks on 2 workers, tasks/s, median of the
bursts, and the driver's CPU time per task: on a loaded machine the steadier measure) and
W2 (sequential round trips on an idle worker, median of batches of 100), both
through the public API on a ``LocalExecutor`` (no agent: a fixed context), the function
pickled by value as a notebook's is. The floor is measured in the same run: a raw pipe
round trip between two processes (1 / that, for throughput). The machine is shared: the
load average is printed with the numbers. ``habits.PIPELINE_DEPTH`` was chosen from this.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import _common
import cloudpickle
from _common import noop, pipe_rtt

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.context import EnvContext
from jupyter_runtimeenv.workers.executor import resolve_driver_sys_path

cloudpickle.register_pickle_by_value(_common)  # as a notebook's function goes


def cpu() -> float:
    times = os.times()
    return times.user + times.system


def measure(depth: int, bursts: int) -> tuple[float, float, float]:
    ctx = EnvContext(python=sys.executable, driver_sys_path=resolve_driver_sys_path())
    executor = jre.LocalExecutor(
        acquire=lambda _spec, _holder: ctx,
        release=lambda _env, _holder: None,
        max_workers=2,
        pipeline_depth=depth,
    )
    jre.init(executor=executor)
    try:
        f = jre.remote(noop)
        jre.get([f.remote() for _ in range(2000)])  # both workers up, noop known short
        rates = []
        used = cpu()
        for _ in range(bursts):
            start = time.perf_counter()
            jre.get([f.remote() for _ in range(1000)])
            rates.append(1000 / (time.perf_counter() - start))
        per_task = (cpu() - used) / (1000 * bursts)
        trips = []
        for _ in range(bursts):
            start = time.perf_counter()
            for _ in range(100):
                f.remote().result()
            trips.append((time.perf_counter() - start) / 100)
        return statistics.median(rates), statistics.median(trips), per_task
    finally:
        executor.shutdown()
        jre.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="1,2,4,8,16,32")
    parser.add_argument("--bursts", type=int, default=9)
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    floor = statistics.median(pipe_rtt(20_000))
    print(f"floor: raw pipe round trip {floor * 1e3:.4f} ms (1/floor {1 / floor:,.0f}/s)")
    print("| depth | W4 tasks/s | W4 driver CPU per task | W2 ms | load |")
    print("|---|---|---|---|---|")
    for depth in depths:
        rate, trip, per_task = measure(depth, args.bursts)
        load = os.getloadavg()[0]
        print(
            f"| {depth} | {rate:,.0f} | {per_task * 1e6:.0f} us | {trip * 1e3:.3f} | {load:.1f} |"
        )


if __name__ == "__main__":
    main()
