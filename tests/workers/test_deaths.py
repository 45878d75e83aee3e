"""A dead worker leaves nothing behind: the next task runs on a fresh worker (issue 8, item 5).

Deaths of every kind (``os._exit``, SIGKILL from outside, a segfault, a channel the task
closed) through the real executor and an embedded agent, with and without a spare worker;
then the state a death could leave behind: the pool's accounting, the agent's references,
processes (the autouse fixture checks that no worker process, live or zombie, is left).
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.client import EmbeddedClient
from jupyter_runtimeenv.context import EnvContext
from jupyter_runtimeenv.errors import BrokenWorker
from jupyter_runtimeenv.workers.executor import LocalExecutor
from jupyter_runtimeenv.workers.future import RemoteFuture, Task
from jupyter_runtimeenv.workers.output import OutputTarget
from jupyter_runtimeenv.workers.pool import Pool, PoolState
from jupyter_runtimeenv.workers.serialize import dump_call
from tests.workers.helpers import submit, wait_gone


def pid() -> int:
    return os.getpid()


def nap_pid(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def die(how: str, marker: str = "") -> None:
    """End this worker the way ``how`` says, from inside the task."""
    if how == "exit":
        os._exit(7)
    if how == "segfault":
        import ctypes

        ctypes.string_at(0)
    if how == "closed channel":
        os.close(int(sys.argv[sys.argv.index("--fd") + 1]))
        return  # the RETURN cannot be sent: the worker exits
    if how == "sigkill":  # from outside: the test kills the pid written here
        part = Path(f"{marker}.part")  # written whole: a poll never reads part of the pid
        part.write_text(str(os.getpid()))
        part.rename(marker)
        time.sleep(60)
    raise AssertionError(how)


DEATHS = ["exit", "sigkill", "segfault", "closed channel"]
EXPECTED = {
    "exit": "exit code 7",
    "sigkill": "SIGKILL",
    "segfault": "SIGSEGV",
    "closed channel": "exit code 3",
}


@pytest.fixture(params=[False, True], ids=["no-spare", "spare"])
def executor(request: pytest.FixtureRequest, client: EmbeddedClient) -> Iterator[LocalExecutor]:
    """The real executor over an embedded agent (pools close when idle, as in a notebook)."""
    executor = LocalExecutor(
        max_workers=2,
        keep_spare=request.param,
        acquire=client.acquire_sync,
        release=client.release_sync,
    )
    jre.init(executor=executor)
    yield executor
    executor.shutdown()


def kill_when_written(marker: Path) -> threading.Thread:
    def run() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.kill(int(marker.read_text()), signal.SIGKILL)
                return
            except (FileNotFoundError, ValueError):
                time.sleep(0.01)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def run_death(how: str, tmp_path: Path, index: int = 0) -> BrokenWorker:
    marker = tmp_path / f"pid-{index}"
    killer = kill_when_written(marker) if how == "sigkill" else None
    with pytest.raises(BrokenWorker) as info:
        jre.get(jre.remote(die).remote(how, str(marker)), timeout=60)
    if killer is not None:
        killer.join()
    return info.value


@pytest.mark.parametrize("how", DEATHS)
def test_after_any_death_the_next_task_runs_on_a_fresh_worker(
    executor: LocalExecutor, tmp_path: Path, how: str
) -> None:
    before = jre.get(jre.remote(pid).remote(), timeout=60)
    error = run_death(how, tmp_path)
    assert EXPECTED[how] in str(error)
    assert "while running die" in str(error)
    # Submitted at once, while the dead worker's pool may be closing: it must run.
    after = jre.get(jre.remote(pid).remote(), timeout=60)
    assert after != before
    assert after not in _dead_pids(error)


def _dead_pids(error: BrokenWorker) -> set[int]:
    text = str(error)
    return {int(text.split("worker pid ")[1].split()[0])} if "worker pid " in text else set()


def test_twenty_tasks_alternating_death_and_work(
    executor: LocalExecutor, tmp_path: Path, client: EmbeddedClient
) -> None:
    deaths = ["exit", "segfault", "closed channel", "sigkill"]
    seen_dead: set[int] = set()
    for i in range(20):
        if i % 2 == 0:
            seen_dead |= _dead_pids(run_death(deaths[(i // 2) % len(deaths)], tmp_path, i))
        else:
            assert jre.get(jre.remote(pid).remote(), timeout=60) not in seen_dead
    # Pools emptied by a death closed and released their reference: at most the live one
    # holds the environment.
    _wait_until(lambda: len(_holders(client)) <= 1)
    live = [p for p in executor.pools if not p.closed]
    assert len(live) <= 1


def test_concurrent_tasks_survive_one_death(executor: LocalExecutor) -> None:
    nap = jre.remote(nap_pid)
    before = [nap.remote(0.3) for _ in range(3)]
    doomed = jre.remote(die).remote("exit")
    after = [nap.remote(0.3) for _ in range(3)]
    with pytest.raises(BrokenWorker):
        jre.get(doomed, timeout=60)
    pids = jre.get(before + after, timeout=60)
    assert len(pids) == 6
    assert len({p for pool in executor.pools for p in pool.pids}) <= 2


def test_a_worker_killed_before_reading_its_task_does_not_fail_it(
    make_pool: Callable[..., Pool],
) -> None:
    """SIGKILL of an idle worker (the OOM killer, say) races the next submit: the task it was
    handed never ran there, so it runs on a fresh worker instead of failing."""
    pool = make_pool(max_workers=1)
    idle = submit(pool, pid).result(30)
    os.kill(idle, signal.SIGSTOP)  # the CALL will sit unread
    future = submit(pool, pid)
    assert _holder_of(pool, future) == idle
    os.kill(idle, signal.SIGKILL)
    assert future.result(30) not in (idle, os.getpid())
    wait_gone([idle])


def test_a_task_handed_to_three_dying_workers_fails(make_pool: Callable[..., Pool]) -> None:
    """Redelivery is bounded: a task whose every worker dies unread fails after three."""
    pool = make_pool(max_workers=4)
    futures = [submit(pool, nap_pid, 0.5) for _ in range(4)]
    workers = {f.result(30) for f in futures}
    assert len(workers) == 4
    for worker in workers:
        os.kill(worker, signal.SIGSTOP)  # four idle workers that will never read a CALL
    future = submit(pool, pid)
    for _ in range(3):
        holder = _holder_of(pool, future)
        os.kill(holder, signal.SIGKILL)  # it goes to the next stopped idle worker
        _wait_until(lambda h=holder: h not in pool.pids)
    with pytest.raises(BrokenWorker, match="died while running pid"):
        future.result(30)
    for worker in pool.pids:
        os.kill(worker, signal.SIGKILL)
    wait_gone(list(workers))


def _holder_of(pool: Pool, future: RemoteFuture[Any]) -> int:
    """The pid of the worker ``future``'s task was handed to (white box: the pool's set)."""
    _wait_until(lambda: any(w.task is not None and w.task.future is future for w in _all(pool)))
    return next(w.pid for w in _all(pool) if w.task is not None and w.task.future is future)


def _all(pool: Pool) -> list[Any]:
    with pool._lock:
        return list(pool._workers)


def test_a_finished_future_keeps_neither_task_nor_arguments(
    make_pool: Callable[..., Pool],
) -> None:
    pool = make_pool(max_workers=1)
    future: RemoteFuture[Any] = RemoteFuture("len")
    task = Task(b"", future, OutputTarget.capture("len"))
    task.payload = dump_call(task.id, len, (b"x" * (8 << 20),), {}, "len")
    gone = weakref.ref(task)
    assert pool.submit(task)
    del task
    assert future.result(30) == 8 << 20
    gc.collect()
    assert gone() is None  # the future (which a notebook keeps) let the task go


def test_a_pool_closed_while_acquiring_releases_once_and_starts_nothing(
    ctx: EnvContext,
) -> None:
    go = threading.Event()
    released: list[str] = []

    def acquire() -> EnvContext:
        go.wait(30)
        return ctx

    pool = Pool(acquire, lambda c: released.append("x"), keep_spare=True)
    queued = submit(pool, pid)
    pool.close()
    assert queued.cancelled()
    go.set()
    _wait_until(lambda: released == ["x"])
    assert pool.state is PoolState.CLOSED
    assert pool.pids == []
    time.sleep(0.2)  # a spare started after the close would show up now (and fail below)
    assert released == ["x"]


def _holders(client: EmbeddedClient) -> list[str]:
    status = asyncio.run(client.status())
    return [h for env in status for h in env.get("holders", [])]


def _wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def lie_about_length() -> None:
    """Write a RETURN header claiming 512 GiB, then die: a buffer that size cannot exist."""
    fd = int(sys.argv[sys.argv.index("--fd") + 1])
    os.write(fd, bytes([3]) + (1 << 39).to_bytes(8, "big") + b"only this")
    os._exit(0)


def test_a_frame_that_lies_about_its_length_is_a_broken_worker(
    make_pool: Callable[..., Pool],
) -> None:
    pool = make_pool(max_workers=1)
    with pytest.raises(BrokenWorker, match="inside a frame"):
        submit(pool, lie_about_length).result(30)
    assert submit(pool, pid).result(30) != os.getpid()


def test_a_broken_output_stream_does_not_lose_the_result(make_pool: Callable[..., Pool]) -> None:
    class Broken:
        def write(self, text: str) -> int:
            raise RuntimeError("this stream is broken")

        def flush(self) -> None:
            raise RuntimeError("this stream is broken")

    pool = make_pool(max_workers=1)
    future: RemoteFuture[Any] = RemoteFuture("print")
    sink = OutputTarget("print", Broken(), Broken(), contextvars.copy_context())  # type: ignore[arg-type]
    task = Task(b"", future, sink)
    task.payload = dump_call(task.id, print, ("lost, and that is fine",), {}, "print")
    assert pool.submit(task)
    assert future.result(30) is None
