"""Forwarding a worker's output: one very long line, and many short lines, against a floor.

    .venv/bin/python benchmarks/bench_output.py [--quick]

Each row times a task that writes N bytes to its stdout (one ``write``, line-buffered as in
every worker) until its result arrives in the driver, the output forwarded to an
``OutputTarget`` writing to ``/dev/null``. The floor is the same N bytes read from a pipe
by the driver as a child ``python`` writes them (start-up subtracted). Forwarding must be
linear: the ratio to the floor stays flat as N grows (issue 8, item 10).
"""

from __future__ import annotations

import contextvars
import os
import subprocess
import sys
import time

from jupyter_runtimeenv.context import EnvContext
from jupyter_runtimeenv.workers.executor import resolve_driver_sys_path
from jupyter_runtimeenv.workers.future import RemoteFuture, Task
from jupyter_runtimeenv.workers.output import OutputTarget
from jupyter_runtimeenv.workers.pool import Pool
from jupyter_runtimeenv.workers.serialize import dump_call

QUICK = "--quick" in sys.argv
MB = 1 << 20


def write_out(size: int, line: int) -> int:
    """The task: ``size`` bytes to stdout, a newline every ``line`` bytes (0: none)."""
    if line:
        row = "x" * (line - 1) + "\n"
        text = row * (size // line)
    else:
        text = "x" * size
    sys.stdout.write(text)
    return len(text)


def floor(size: int) -> float:
    """Seconds to read ``size`` bytes from a pipe as a child writes them, start excluded."""
    code = "import sys; sys.stdin.read(1); sys.stdout.write('x' * %d); sys.stdout.flush()"
    child = subprocess.Popen(
        [sys.executable, "-c", code % size],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        bufsize=0,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    time.sleep(0.3)  # let it start
    start = time.perf_counter()
    child.stdin.write(b"go")
    child.stdin.close()
    fd, got = child.stdout.fileno(), 0
    while chunk := os.read(fd, 65536):
        got += len(chunk)
    elapsed = time.perf_counter() - start
    child.wait()
    assert got == size, (got, size)
    return elapsed


def forwarded(pool: Pool, size: int, line: int, sink: OutputTarget) -> float:
    future: RemoteFuture[int] = RemoteFuture("write_out")
    task = Task(b"", future, sink)
    task.payload = dump_call(task.id, write_out, (size, line), {}, "write_out")
    start = time.perf_counter()
    pool.submit(task)
    future.result()
    return time.perf_counter() - start


def main() -> None:
    ctx = EnvContext(python=sys.executable, driver_sys_path=resolve_driver_sys_path())
    pool = Pool(lambda: ctx, max_workers=1)
    sizes = [1, 4, 10] if QUICK else [1, 4, 10, 40]
    with open(os.devnull, "w") as devnull:
        sink = OutputTarget("write_out", devnull, devnull, contextvars.copy_context())
        try:
            forwarded(pool, 1000, 0, sink)  # a warm worker
            print(f"cpus: {os.cpu_count()}  python: {sys.version.split()[0]}")
            print(f"{'output':<28}{'floor':>10}{'forwarded':>12}{'ratio':>8}")
            for line, label in ((0, "one line"), (80, "80-byte lines")):
                for mb in sizes:
                    size = mb * MB
                    base = min(floor(size) for _ in range(2))
                    took = min(forwarded(pool, size, line, sink) for _ in range(2))
                    name = f"{mb} MB, {label}"
                    print(f"{name:<28}{base:>9.3f}s{took:>11.3f}s{took / base:>7.1f}x")
        finally:
            pool.close()


if __name__ == "__main__":
    main()
