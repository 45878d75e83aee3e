"""Sticky workers: tasks with the same ``Task.affinity`` key run in one worker kept for them
(where a ``%%remote`` namespace lives), with real worker processes.

A key's worker takes no other task, is not stopped for being idle and does not count
towards ``max_workers`` (a cell never waits behind busy tasks, nor holds them back);
``release_affinity`` stops it; its death unbinds the key.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jupyter_runtimeenv.workers.future import RemoteFuture, Task
from jupyter_runtimeenv.workers.output import OutputTarget
from jupyter_runtimeenv.workers.pool import Pool
from jupyter_runtimeenv.workers.serialize import dump_call
from tests.workers.helpers import wait_gone


def pid() -> int:
    return os.getpid()


def wait_for(path: str) -> int:
    deadline = time.monotonic() + 120
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.getpid()


def submit(
    pool: Pool, function: Callable[..., Any], *args: Any, affinity: str | None = None
) -> RemoteFuture[Any]:
    name = function.__name__
    future: RemoteFuture[Any] = RemoteFuture(name)
    task = Task(b"", future, OutputTarget.capture(name), affinity=affinity)
    task.payload = dump_call(task.id, function, args, {}, name)
    assert pool.submit(task)
    return future


def test_a_key_keeps_its_worker_which_takes_no_other_task(
    make_pool: Callable[..., Pool],
) -> None:
    pool = make_pool(max_workers=2)
    first = submit(pool, pid, affinity="ns-a").result(60)
    for _ in range(3):
        assert submit(pool, pid, affinity="ns-a").result(60) == first
    others = {submit(pool, pid).result(60) for _ in range(4)}
    assert first not in others  # general tasks never land in the kept worker
    other_key = submit(pool, pid, affinity="ns-b").result(60)
    assert other_key != first
    assert submit(pool, pid, affinity="ns-a").result(60) == first
    sticky = {w["pid"]: w["sticky"] for w in pool.stats()["workers"]}  # type: ignore[union-attr]
    assert sticky[first] == "ns-a"
    assert sticky[other_key] == "ns-b"


def test_a_cell_does_not_wait_behind_busy_tasks(
    make_pool: Callable[..., Pool], tmp_path: Path
) -> None:
    pool = make_pool(max_workers=1)
    flag = tmp_path / "go"
    busy = submit(pool, wait_for, str(flag))  # takes the one general worker
    cell = submit(pool, pid, affinity="ns")
    cell_pid = cell.result(60)  # it ran while the general worker is still busy
    assert not busy.done()
    flag.touch()
    assert busy.result(60) != cell_pid


def test_the_kept_worker_is_not_stopped_for_being_idle(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(max_workers=1, idle_timeout=0.2)
    kept = submit(pool, pid, affinity="ns").result(60)
    general = submit(pool, pid).result(60)
    wait_gone([general])  # the idle general worker goes
    assert pool.affinity_pid("ns") == kept
    assert submit(pool, pid, affinity="ns").result(60) == kept


def test_release_stops_the_worker_and_a_new_one_is_kept_next(
    make_pool: Callable[..., Pool],
) -> None:
    pool = make_pool(max_workers=1)
    kept = submit(pool, pid, affinity="ns").result(60)
    assert pool.release_affinity("ns")
    assert not pool.release_affinity("ns")  # once
    wait_gone([kept])
    assert pool.affinity_pid("ns") is None
    again = submit(pool, pid, affinity="ns").result(60)
    assert again != kept


def test_a_dead_worker_unbinds_its_key(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(max_workers=1)
    kept = submit(pool, pid, affinity="ns").result(60)
    os.kill(kept, 9)
    wait_gone([kept])
    deadline = time.monotonic() + 30
    while pool.affinity_pid("ns") is not None:  # the reader thread reports the death
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert submit(pool, pid, affinity="ns").result(60) not in (kept, None)


def test_an_idle_worker_is_taken_for_a_new_key(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(max_workers=1)
    general = submit(pool, pid).result(60)
    # The idle (prestarted, warmed) worker becomes the key's: no new process start.
    assert submit(pool, pid, affinity="ns").result(60) == general
    assert submit(pool, pid).result(60) != general
