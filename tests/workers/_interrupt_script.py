"""Run by ``test_interrupt`` as ``python _interrupt_script.py MODE``: wait on remote tasks
the way MODE says until a real SIGINT arrives, then print a JSON report.

Line 1 (once the main thread is inside the wait): ``{"pids": [...]}``, the workers running
the tasks. Line 2: what the interrupt raised, the futures' states, whether the workers are
gone, and the pid a task submitted afterwards ran on. Uses the default (embedded) agent on
``$JUPYTER_RUNTIMEENV_CACHE``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from typing import Any

import psutil

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.workers.executor import LocalExecutor


def crunch(x: int) -> None:
    time.sleep(600)


def waiting_main_thread() -> bool:
    """Is the main thread blocked in a wait (a condition, or the event loop's select)?"""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    while frame is not None:
        name, path = frame.f_code.co_name, frame.f_code.co_filename
        if (name == "wait" and path.endswith("threading.py")) or (
            name == "select" and path.endswith("selectors.py")
        ):
            return True
        frame = frame.f_back
    return False


def announce(pids: list[int]) -> None:
    while not waiting_main_thread():
        time.sleep(0.01)
    time.sleep(0.05)
    print(json.dumps({"pids": pids}), flush=True)


def main(mode: str) -> dict[str, Any]:
    executor = LocalExecutor(max_workers=2)
    jre.init(executor=executor)
    f = jre.remote(crunch)
    futures = [f.remote(i) for i in range(1 if mode in ("result", "await") else 3)]
    running = min(len(futures), 2)
    deadline = time.monotonic() + 120
    while sum(fut.running() for fut in futures) < running:
        assert time.monotonic() < deadline, "tasks did not start"
        time.sleep(0.01)
    pids = [pid for pool in executor.pools for pid in pool.pids]
    threading.Thread(target=announce, args=(pids,), daemon=True).start()
    report: dict[str, Any] = {"raised": None}
    try:
        if mode == "get":
            jre.get(futures)
        elif mode == "result":
            futures[0].result()
        elif mode == "wait":
            jre.wait(futures, num_returns=len(futures))
        elif mode == "await":

            async def wait_for() -> None:
                await futures[0]

            asyncio.run(wait_for())
    except KeyboardInterrupt as interrupt:
        report["raised"] = type(interrupt).__name__
        report["message"] = str(interrupt)
        report["suppressed_context"] = interrupt.__suppress_context__
    report["cancelled"] = [fut.cancelled() for fut in futures]
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    report["alive_after"] = [pid for pid in pids if _alive(pid)]
    report["next_pid"] = jre.get(jre.remote(os.getpid).remote(), timeout=60)
    executor.shutdown()
    report["children_left"] = [
        c.pid
        for c in psutil.Process().children(recursive=True)
        if _alive(c.pid) and not _template(c)
    ]
    return report


def _template(proc: psutil.Process) -> bool:
    """A template that forks workers (``workers/zygote.py``): it outlives executors, not
    its process, and stops when idle."""
    try:
        return proc.cmdline()[-1:] == ["--zygote"]
    except psutil.Error:
        return False


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


if __name__ == "__main__":
    # SIGINT raises KeyboardInterrupt here however the suite was started: a command run with
    # ``&`` by a shell without job control inherits SIGINT ignored, Python keeps an ignored
    # SIGINT as it found it, and the test's SIGINT then did nothing (the script waited for
    # its 600 s tasks; tests/ipython/test_tasks.py's ``sigint_raises`` is the same fix).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(json.dumps(main(sys.argv[1])), flush=True)
