"""The sidebar's Stop on a worker ends what its tasks started too (issue 16, item 7).

Against a real Jupyter server, a real kernel and real workers: a task starts a ``sleep``
child and returns while it runs (the worker idle, its child alive in the worker's process
group). ``DELETE kernels/{kid}/workers/{pid}`` (what Stop sends) kills the worker; the
kernel that owns it sees it exit and kills the rest of its group. Both kinds of worker: the
kernel's first one is spawned (and starts the interpreter's template), a worker of a second
env is forked from that template (``workers/zygote.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from processes import Proc, kill_all, of, survivors

from jupyter_runtimeenv.server.kernels import WORKERS_SCHEMA_ID
from tests.kernels.test_kernels import run, start_kernel
from tests.server.test_panel import call, next_report

#: Bounded: the group kill follows the worker's exit at once; this only absorbs the load.
GONE_WITHIN = 30.0

FIRST = """
%load_ext jupyter_runtimeenv
import os, subprocess, time
from jupyter_runtimeenv.workers import zygote

def start_child():
    child = subprocess.Popen(["sleep", "300"])
    return os.getpid(), child.pid

pid, child = remote(start_child).remote().result(timeout=120)
print("spawned", pid, child)
deadline = time.monotonic() + 120
while not [t for t in zygote.templates() if t.state == "ready"] and time.monotonic() < deadline:
    time.sleep(0.05)
print("templates", [t.state for t in zygote.templates()])
"""

SECOND = """
pid, child = remote(start_child).options(
    runtime_env={"env_vars": {"JRE_STOP_TEST": "1"}}
).remote().result(timeout=120)
print("forked", pid, child, open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")[-2].decode())
"""


@pytest.fixture
def extension_config() -> dict[str, Any]:
    return {"kernel_sweep_interval": 0.2}


async def gone(procs: list[Proc]) -> list[Proc]:
    """Those of ``procs`` alive after up to ``GONE_WITHIN`` s (polled without blocking the
    server, which runs on this event loop)."""
    deadline = asyncio.get_running_loop().time() + GONE_WITHIN
    while (left := survivors(procs, 0)) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    return left


def pids_of(output: str, word: str) -> tuple[int, int]:
    line = next(line for line in output.splitlines() if line.startswith(word))
    words = line.split()
    return int(words[1]), int(words[2])


async def test_stop_from_the_sidebar_kills_the_workers_group(
    jp_fetch: Any, jp_serverapp: Any
) -> None:
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def listener(logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        events.put_nowait(data)

    jp_serverapp.event_logger.add_listener(schema_id=WORKERS_SCHEMA_ID, listener=listener)
    kernel_id = await start_kernel(jp_fetch, "python3")
    tracked: list[Proc] = []
    try:
        first = await run(jp_serverapp, kernel_id, FIRST)
        assert "templates ['ready']" in first, first
        second = await run(jp_serverapp, kernel_id, SECOND)
        assert second.split()[-1] == "--forked", second  # the second env's worker was forked
        for word, output in (("spawned", first), ("forked", second)):
            pid, child = pids_of(output, word)
            procs = [of(pid), of(child)]
            tracked += procs

            def reported(event: dict[str, Any], pid: int = pid) -> bool:
                return any(w["pid"] == pid for p in event.get("pools", []) for w in p["workers"])

            await next_report(events, reported)
            stopped = await call(jp_fetch, "DELETE", "kernels", kernel_id, "workers", str(pid))
            assert stopped == {"kernel_id": kernel_id, "pid": pid, "stopped": True}
            left = await gone(procs)
            assert left == [], (word, [p.describe() for p in left])
    finally:
        kill_all(tracked)
        await jp_fetch("api", "kernels", kernel_id, method="DELETE")
