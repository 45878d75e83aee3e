"""What a kernel reports to the server about its pools (``Pool.stats``, ``workers/report.py``),
with real worker processes. The report's way to the server is tested in
``tests/server/test_panel.py`` with a real kernel."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from types import SimpleNamespace

from conftest import submit

from jupyter_runtimeenv.context import EnvContext
from jupyter_runtimeenv.workers.future import RemoteFuture, Task
from jupyter_runtimeenv.workers.output import OutputTarget
from jupyter_runtimeenv.workers.pool import Pool, observe
from jupyter_runtimeenv.workers.report import rss_of, snapshot


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
        {"pid": worker_pid, "busy": False, "tasks_done": 1, "tasks_failed": 1}
    ]
    mine = [p for p in snapshot()["pools"] if p["name"] == pool.name]
    assert mine[0]["workers"][0]["rss"] > 1_000_000  # psutil here; /proc without it


def test_a_task_cancelled_before_it_is_assigned_is_counted_without_deadlock(
    make_pool: Callable[..., Pool],
) -> None:
    # Its done-callback runs at once, inside _assign, where the pool's lock is held.
    pool = make_pool()
    task = Task(b"", RemoteFuture("t"), OutputTarget.capture("t"))
    task.future.cancel()
    worker = SimpleNamespace(pid=4242, task=None)

    def assign() -> None:
        with pool._lock:
            pool._assign(worker, task)  # type: ignore[arg-type]

    thread = threading.Thread(target=assign, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "deadlock: _assign waited for its own lock"
    assert pool._counts == {4242: [0, 1]}


def test_rss_of_a_live_and_a_gone_process() -> None:
    assert (rss_of(os.getpid()) or 0) > 1_000_000
    assert rss_of(2**22 + 12345) is None
