"""``RemoteFuture`` as a ``concurrent.futures.Future``, and what it costs the cyclic GC.

Real workers run the calls (an ``agent_executor``: two workers, a real embedded agent). The
futures share one lock and wake only their own waiters (``workers/future.py``): each test
here fails if that breaks ``concurrent.futures.wait``/``as_completed``, ``result(timeout)``,
``await``, done-callbacks, or if a pending or settled call keeps its per-call objects
(a Condition and its RLock, closures per task) tracked by the GC again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.context import EnvContext
from jupyter_runtimeenv.errors import RemoteTaskError
from jupyter_runtimeenv.workers.executor import LocalExecutor, resolve_driver_sys_path
from jupyter_runtimeenv.workers.future import RemoteFuture


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def fail() -> None:
    raise ValueError("no")


def noop() -> None:
    return None


def test_wait_and_as_completed_see_results_errors_and_cancels(
    agent_executor: LocalExecutor,
) -> None:
    napping = jre.remote(nap)
    quick = [napping.remote(0.0) for _ in range(3)]
    failed = jre.remote(fail).remote()
    long = napping.remote(120.0)
    done, pending = concurrent.futures.wait([*quick, failed], timeout=60)
    assert not pending
    assert len(done) == 4
    assert isinstance(failed.exception(), RemoteTaskError)

    # A cancelled future is done for concurrent.futures.wait at once (it was counted as
    # pending until the timeout: Future.cancel() alone never wakes wait()'s waiters).
    assert long.cancel()
    started = time.monotonic()
    done, pending = concurrent.futures.wait([long], timeout=60)
    assert done == {long}
    assert not pending
    assert time.monotonic() - started < 30  # far below the timeout, not a speed claim

    order = [napping.remote(s) for s in (0.6, 0.0, 0.3)]
    finished = [f.result() for f in concurrent.futures.as_completed(order, timeout=60)]
    assert sorted(finished) == [0.0, 0.3, 0.6]
    first, rest = concurrent.futures.wait(
        [napping.remote(120.0), napping.remote(0.0)],
        timeout=60,
        return_when=concurrent.futures.FIRST_COMPLETED,
    )
    assert [f.result() for f in first] == [0.0]
    jre.cancel(list(rest))


def test_result_times_out_then_gets_the_value(agent_executor: LocalExecutor) -> None:
    future = jre.remote(nap).remote(1.0)
    with pytest.raises(concurrent.futures.TimeoutError):
        future.result(timeout=0.01)
    with pytest.raises(concurrent.futures.TimeoutError):
        future.exception(timeout=0)
    assert future.result(timeout=60) == 1.0
    assert future.exception(timeout=0) is None
    cancelled = jre.remote(nap).remote(120.0)
    cancelled.cancel()
    with pytest.raises(concurrent.futures.CancelledError):
        cancelled.result(timeout=0)


def test_each_waiting_thread_wakes_for_its_own_future(agent_executor: LocalExecutor) -> None:
    # Threads blocked in result() of different futures (one shared lock underneath): each
    # gets its own value, whichever settles first.
    napping = jre.remote(nap)
    futures = [napping.remote(0.1 * (i % 3)) for i in range(12)]
    got: dict[int, Any] = {}

    def wait_for(i: int) -> None:
        got[i] = futures[i].result(timeout=120)

    threads = [threading.Thread(target=wait_for, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(150)
    assert got == {i: 0.1 * (i % 3) for i in range(12)}


def test_await_and_done_callbacks(agent_executor: LocalExecutor) -> None:
    napping = jre.remote(nap)

    async def both() -> list[float]:
        return list(await asyncio.gather(napping.remote(0.2), napping.remote(0.0)))

    assert asyncio.run(both()) == [0.2, 0.0]
    calls: list[object] = []
    future = napping.remote(0.2)
    future.add_done_callback(lambda f: calls.append(f.result()))
    future.add_done_callback(lambda f: calls.append("second"))
    assert future.result(timeout=60) == 0.2
    deadline = time.monotonic() + 30
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # callbacks run in the settling thread, after result() may return
    assert calls == [0.2, "second"]
    future.add_done_callback(lambda f: calls.append("late"))  # done: runs at once, here
    assert calls == [0.2, "second", "late"]


def _tracked() -> Counter[str]:
    gc.collect()
    return Counter(type(o).__name__ for o in gc.get_objects())


@pytest.fixture
def blocked_executor() -> Iterator[tuple[LocalExecutor, threading.Event]]:
    """An executor whose environment comes only when the event is set: calls stay queued."""
    ready = threading.Event()
    ctx = EnvContext(python=sys.executable, driver_sys_path=resolve_driver_sys_path())

    def acquire(_spec: Any, _holder: str) -> EnvContext:
        ready.wait(120)
        return ctx

    executor = LocalExecutor(acquire=acquire, release=lambda _c, _h: None, max_workers=2)
    jre.init(executor=executor)
    try:
        yield executor, ready
    finally:
        ready.set()
        executor.shutdown()
        jre.shutdown()


def test_pending_and_settled_calls_keep_few_objects_for_the_gc(
    blocked_executor: tuple[LocalExecutor, threading.Event],
) -> None:
    # Every object the cyclic GC tracks is scanned by each full collection: a notebook
    # holding 100,000 futures paid for ~28 tracked objects each (a Condition, its RLock and
    # bound methods, closures per task) in every .remote() that triggered one.
    _executor, ready = blocked_executor
    f = jre.remote(noop)
    warm = [f.remote() for _ in range(10)]  # the pool, the function's pickle: made once
    n = 2_000
    before = _tracked()
    pending = [f.remote() for _ in range(n)]
    grown = _tracked() - before
    per_call = sum(grown.values()) / n
    assert per_call <= 8, f"{per_call:.1f} tracked objects per pending call: {grown}"
    ready.set()
    jre.get(warm)
    assert jre.get(pending, timeout=300) == [None] * n
    before = _tracked()
    del pending
    freed = before - _tracked()
    per_done = sum(freed.values()) / n
    assert per_done <= 3, f"{per_done:.1f} tracked objects per settled future: {freed}"
    assert not any(isinstance(o, RemoteFuture) and o._task is not None for o in gc.get_objects())


def test_a_fork_while_another_thread_holds_the_futures_lock() -> None:
    # The lock every RemoteFuture shares is reset in a forked child: a reader thread may
    # hold it at the instant of the fork, and the child's futures would hang on it.
    from jupyter_runtimeenv.workers import future as future_module

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with future_module._CONDITION:
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(60)
        pid = os.fork()
        if pid == 0:  # the child: a future must work without the parent's holder
            code = 1
            try:
                child = RemoteFuture[int]("child")
                child.set_result(7)
                code = 0 if child.result(timeout=5) == 7 and child.done() else 1
            finally:
                os._exit(code)
        deadline = time.monotonic() + 60
        while (waited := os.waitpid(pid, os.WNOHANG)) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("the forked child hung on the futures' lock")
            time.sleep(0.05)
        assert os.waitstatus_to_exitcode(waited[1]) == 0
    finally:
        release.set()
        holder.join(60)


def test_a_settle_after_a_cancel_loses_quietly_and_callbacks_run_once() -> None:
    """``settle_result`` does ``set_result``'s steps itself (wire10b): a cancel that came
    first wins without an error, each done-callback runs once, a failing one does not stop
    the next, and a settled future wakes its waiters and lets its task go."""
    seen: list[object] = []
    cancelled: RemoteFuture[int] = RemoteFuture("c")
    cancelled.add_done_callback(lambda f: seen.append(("c", f.cancelled())))
    assert cancelled.cancel()
    cancelled.settle_result(1)  # the reader thread's answer, after the cancel: no error
    assert cancelled.cancelled()
    assert seen == [("c", True)]

    settled: RemoteFuture[int] = RemoteFuture("s")
    settled.add_done_callback(lambda f: 1 / 0)  # logged, as Future does
    settled.add_done_callback(lambda f: seen.append(("s", f.result())))
    waiting = threading.Thread(target=lambda: seen.append(("w", settled.result(60))))
    waiting.start()
    deadline = time.monotonic() + 30
    while not settled._waiters and time.monotonic() < deadline:
        time.sleep(0.001)
    settled.settle_result(2)
    settled.settle_result(3)  # a second settle loses quietly too
    waiting.join(60)
    assert settled.result(0) == 2
    assert settled._task is None
    assert sorted(seen, key=str) == [("c", True), ("s", 2), ("w", 2)]
