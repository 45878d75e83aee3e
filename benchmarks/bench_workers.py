"""Worker benchmarks against floors measured in the same run.

    .venv/bin/python benchmarks/bench_workers.py [--quick]

Rows: sequential no-op round trip on a warm worker; no-op throughput with 2 workers; the
first result from a new worker in a built environment (pool creation, spawn, handshake,
first call); an env_vars-only environment's first task through the real (embedded) agent.
Floors: a raw pipe round trip between two processes; a venv python start + ``import
cloudpickle``. Targets come from issue 4.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable

from _common import noop, pipe_rtt, python_start

from jupyter_runtimeenv import api
from jupyter_runtimeenv.agent import RuntimeEnvAgent
from jupyter_runtimeenv.client import EmbeddedClient
from jupyter_runtimeenv.context import EnvContext
from jupyter_runtimeenv.workers.executor import LocalExecutor, resolve_driver_sys_path
from jupyter_runtimeenv.workers.future import RemoteFuture, Task
from jupyter_runtimeenv.workers.output import OutputTarget
from jupyter_runtimeenv.workers.pool import Pool
from jupyter_runtimeenv.workers.serialize import dump_call

QUICK = "--quick" in sys.argv


def submit(pool: Pool, function: Callable[[], object]) -> RemoteFuture[object]:
    future: RemoteFuture[object] = RemoteFuture("noop")
    task = Task(b"", future, OutputTarget.capture("noop"))
    task.payload = dump_call(task.id, function, (), {}, "noop")
    pool.submit(task)
    return future


def context() -> EnvContext:
    return EnvContext(python=sys.executable, driver_sys_path=resolve_driver_sys_path())


def task_rtt(rounds: int) -> float:
    pool = Pool(context, max_workers=1)
    try:
        for _ in range(200):
            submit(pool, noop).result()
        start = time.perf_counter()
        for _ in range(rounds):
            submit(pool, noop).result()
        return (time.perf_counter() - start) / rounds
    finally:
        pool.close()


def throughput(tasks: int) -> float:
    pool = Pool(context, max_workers=2)
    try:
        for f in [submit(pool, noop) for _ in range(200)]:
            f.result()
        start = time.perf_counter()
        futures = [submit(pool, noop) for _ in range(tasks)]
        for f in futures:
            f.result()
        return tasks / (time.perf_counter() - start)
    finally:
        pool.close()


def first_result(repeat: int) -> float:
    times = []
    for _ in range(repeat):
        ctx = context()
        start = time.perf_counter()
        pool = Pool(lambda c=ctx: c, max_workers=1)
        submit(pool, noop).result()
        times.append(time.perf_counter() - start)
        pool.close()
    return statistics.median(times)


def env_vars_first_task(repeat: int) -> float:
    times = []
    with tempfile.TemporaryDirectory() as cache:
        client = EmbeddedClient(RuntimeEnvAgent(cache))
        try:
            for _ in range(repeat):
                executor = LocalExecutor(acquire=client.acquire_sync, release=client.release_sync)
                api.init(executor=executor)
                f = api.remote(runtime_env={"env_vars": {"RUN": uuid.uuid4().hex}})(noop)
                start = time.perf_counter()  # a new env each time: the agent builds it
                f.remote().result()
                times.append(time.perf_counter() - start)
                executor.shutdown()
        finally:
            api.shutdown()
            client.close()
    return statistics.median(times)


def main() -> None:
    scale = 0.2 if QUICK else 1.0
    floor_rtt = statistics.median(pipe_rtt(int(20000 * scale)))
    floor_start = statistics.median(python_start(max(3, int(10 * scale))))
    rtt = task_rtt(int(10000 * scale))
    rate = throughput(int(40000 * scale))
    first = first_result(max(3, int(10 * scale)))
    env_first = env_vars_first_task(max(3, int(5 * scale)))
    rows = [
        ("floor: raw pipe round trip", f"{floor_rtt * 1e3:.3f} ms", "", "1.00x"),
        ("floor: python start + import cloudpickle", f"{floor_start * 1e3:.1f} ms", "", "1.00x"),
        (
            "sequential no-op round trip",
            f"{rtt * 1e3:.3f} ms",
            "<= 0.3 ms",
            f"{rtt / floor_rtt:.1f}x pipe",
        ),
        (
            "no-op throughput, 2 workers",
            f"{rate:,.0f} tasks/s",
            ">= 5,000/s",
            f"{rate * floor_rtt:.2f}x 1/pipe",
        ),
        (
            "first result from a new worker",
            f"{first * 1e3:.1f} ms",
            "<= 60 ms",
            f"{first / floor_start:.2f}x start",
        ),
        (
            "env_vars-only env, first task",
            f"{env_first * 1e3:.1f} ms",
            "",
            f"{env_first / floor_start:.2f}x start",
        ),
    ]
    widths = [
        max(len(r[i]) for r in [*rows, ("measure", "value", "target", "ratio")]) for i in range(4)
    ]
    header = ("measure", "value", "target", "ratio")
    print(f"cpus: {os.cpu_count()}  python: {sys.version.split()[0]}")
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
