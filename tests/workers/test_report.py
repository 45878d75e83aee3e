"""What a kernel reports to the server about its pools (``Pool.stats``, ``workers/report.py``),
with real worker processes. The report's way to the server is tested in
``tests/server/test_panel.py`` with a real kernel."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from jupyter_runtimeenv.context import EnvContext
from jupyter_runtimeenv.workers.pool import Pool, observe
from jupyter_runtimeenv.workers.report import rss_of, snapshot
from tests.workers.helpers import submit


def fail() -> None:
    raise ValueError("no")


def pid() -> int:
    return os.getpid()


def test_stats_count_each_workers_tasks_and_observers_hear_of_changes(
    make_pool: Callable[..., Pool], ctx: EnvContext
) -> None:
    changes = threading.Event()
    forget = observe(changes.set)
    try:
        pool = make_pool(dataclasses.replace(ctx, env_id="e" * 64), max_workers=1)
        worker_pid = submit(pool, pid).result(timeout=60)
        assert changes.is_set()
    finally:
        forget()
    error = submit(pool, fail).exception(timeout=60)
    assert isinstance(error, ValueError)
    stats = pool.stats()
    assert stats["state"] == "ready"
    assert stats["env_id"] == "e" * 64
    assert stats["workers"] == [
        {
            "pid": worker_pid,
            "busy": False,
            "tasks_done": 1,
            "tasks_failed": 1,
            "sticky": None,
            "task": None,
            # its identity: the server's Stop refuses a pid whose process started otherwise
            "started": psutil.Process(worker_pid).create_time(),
        }
    ]
    mine = [p for p in snapshot()["pools"] if p["name"] == pool.name]
    assert mine[0]["workers"][0]["rss"] > 1_000_000  # psutil here; /proc without it


def test_cancelled_calls_count_as_failed_on_the_worker_that_held_them(
    make_pool: Callable[..., Pool], tmp_path: Path
) -> None:
    """A call cancelled while it runs (its worker is killed) and one cancelled while it
    waited in that worker's pipeline both count as failed for that worker."""
    pool = make_pool(max_workers=1)
    # Under load a warm call may take longer than the real threshold: that must not decide
    # whether the second call is pipelined.
    pool.habits.short_call = 60.0
    trigger, started = tmp_path / "trigger", tmp_path / "started"
    for _ in range(3):  # calls of known duration: the pool pipelines this function from now on
        worker_pid = submit(pool, nap_if, str(trigger), str(started)).result(timeout=60)
    trigger.write_text("sleep now")
    running = submit(pool, nap_if, str(trigger), str(started))
    waiting = submit(pool, nap_if, str(tmp_path / "never"), str(started))  # pipelined:
    deadline = time.monotonic() + 60
    while [t.future for t in next(iter(pool._workers)).held] != [running, waiting]:
        assert time.monotonic() < deadline, "the worker never held both calls"
        time.sleep(0.01)
    while not started.exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert waiting.cancel()
    assert running.cancel()
    deadline = time.monotonic() + 60
    while pool._counts.get(worker_pid, [0, 0])[1] < 2:
        assert time.monotonic() < deadline, pool._counts
        time.sleep(0.01)
    assert pool._counts[worker_pid] == [3, 2]


def nap_if(trigger: str, started: str) -> int:
    if os.path.exists(trigger):
        Path(started).write_text("yes")
        time.sleep(60)
    return os.getpid()


def test_rss_of_a_live_and_a_gone_process() -> None:
    assert (rss_of(os.getpid()) or 0) > 1_000_000
    assert rss_of(2**22 + 12345) is None
