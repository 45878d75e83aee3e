"""Pools of real worker processes, driven directly (no agent): the task life cycle."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from jupyter_runtimeenv.context import EnvContext
from jupyter_runtimeenv.errors import (
    BrokenWorker,
    RemoteTaskError,
    SerializationError,
    WorkerError,
)
from jupyter_runtimeenv.workers import zygote
from jupyter_runtimeenv.workers.future import RemoteFuture, Task
from jupyter_runtimeenv.workers.output import OutputTarget
from jupyter_runtimeenv.workers.pool import Pool, PoolState
from tests.workers.helpers import submit, wait_gone, worker_children

MakePool = Callable[..., Pool]


def add(a: int, b: int = 0, *, scale: int = 1) -> int:
    return (a + b) * scale


def pid() -> int:
    return os.getpid()


def env(name: str) -> str | None:
    return os.environ.get(name)


def test_results_args_and_kwargs(make_pool: MakePool) -> None:
    pool = make_pool()
    assert submit(pool, add, 2).result(30) == 2
    assert submit(pool, add, 2, 3, scale=10).result(30) == 50
    assert submit(pool, add, a=1, b=1).result(30) == 2


def test_runs_in_a_separate_process_with_the_context_env(make_pool: MakePool) -> None:
    pool = make_pool()
    assert submit(pool, pid).result(30) != os.getpid()
    assert submit(pool, env, "JRE_TEST").result(30) == "direct"


def test_idle_workers_are_reused_up_to_the_maximum(make_pool: MakePool) -> None:
    # Without learned imports: a second worker importing what the first learned (pytest,
    # psutil: this module's imports) may not be ready before the first is free again.
    pool = make_pool(max_workers=2, learn_imports=False)
    first = submit(pool, pid).result(30)
    assert {submit(pool, pid).result(30) for _ in range(5)} == {first}
    # Two slow tasks at once need two workers; a third waits for one of them.
    futures = [submit(pool, _sleep_pid, 0.5) for _ in range(3)]
    pids = {f.result(30) for f in futures}
    assert len(pids) == 2
    assert len(pool.pids) == 2


def _sleep_pid(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def test_large_payloads_round_trip(make_pool: MakePool) -> None:
    pool = make_pool()
    payload = os.urandom(1 << 20) * 100  # 100 MiB

    def echo_reversed(data: bytes) -> bytes:
        return data[::-1]

    result = submit(pool, echo_reversed, payload).result(120)
    assert len(result) == len(payload)
    assert result == payload[::-1]


class Custom(Exception):
    pass


def test_exceptions_keep_type_and_remote_traceback(make_pool: MakePool) -> None:
    pool = make_pool()

    def lookup(mapping: dict[str, int], key: str) -> int:
        return mapping[key]

    with pytest.raises(KeyError) as info:
        submit(pool, lookup, {}, "missing").result(30)
    error = info.value
    assert isinstance(error, RemoteTaskError)
    assert isinstance(error.cause, KeyError)
    assert "in lookup" in error.remote_traceback
    assert "return mapping[key]" in error.remote_traceback or "line" in error.remote_traceback
    assert "KeyError: 'missing'" in str(error)

    def custom() -> None:
        raise Custom("mine")

    with pytest.raises(Custom, match="mine"):
        submit(pool, custom).result(30)
    # The worker survives a task that raised.
    assert submit(pool, add, 1).result(30) == 1


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_worker_dying_mid_task_is_a_broken_worker_and_is_replaced(
    make_pool: MakePool, how: str
) -> None:
    pool = make_pool(max_workers=1)
    before = submit(pool, pid).result(30)

    def die() -> None:
        if how == "exit":
            os._exit(7)
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(BrokenWorker) as info:
        submit(pool, die).result(30)
    assert ("exit code 7" if how == "exit" else "SIGKILL") in str(info.value)
    assert "while running die" in str(info.value)
    wait_gone([before])
    after = submit(pool, pid).result(30)
    assert after != before


def test_cancelling_a_running_task_kills_its_worker(make_pool: MakePool) -> None:
    pool = make_pool(max_workers=1)
    running = submit(pool, _sleep_pid, 60)
    queued = submit(pool, pid)
    deadline = time.monotonic() + 30
    while not running.running() and time.monotonic() < deadline:
        time.sleep(0.01)
    victim = pool.pids[0]
    assert running.cancel()
    assert running.cancelled()
    wait_gone([victim])
    # The queued task runs on the replacement worker.
    assert queued.result(30) not in (victim, os.getpid())


def test_cancelling_a_queued_task_never_runs_it(make_pool: MakePool, tmp_path: Any) -> None:
    pool = make_pool(max_workers=1)
    marker = tmp_path / "ran"
    blocker = submit(pool, time.sleep, 0.5)
    queued = submit(pool, marker.write_text, "yes")
    assert queued.cancel()
    blocker.result(30)
    assert submit(pool, add, 1).result(30) == 1
    assert not marker.exists()


def test_unpicklable_arguments_and_results_are_named(make_pool: MakePool) -> None:
    pool = make_pool()
    with pytest.raises(SerializationError, match=r"argument 1 of add \(lock\)"):
        submit(pool, add, 1, threading.Lock())
    with pytest.raises(SerializationError, match=r"keyword argument 'scale' of add"):
        submit(pool, add, 1, scale=threading.Lock())

    def make_lock() -> Any:
        import threading

        return threading.Lock()

    with pytest.raises(SerializationError, match="the result of make_lock cannot be pickled"):
        submit(pool, make_lock).result(30)


def test_a_framing_error_kills_the_worker(make_pool: MakePool) -> None:
    pool = make_pool(max_workers=1)

    def scribble() -> None:
        fd = int(sys.argv[sys.argv.index("--fd") + 1])
        os.write(fd, b"\xff" + b"\0" * 8)  # an unknown frame kind
        time.sleep(30)

    victim = submit(pool, pid).result(30)
    with pytest.raises(BrokenWorker, match="broke the protocol"):
        submit(pool, scribble).result(30)
    wait_gone([victim])
    assert submit(pool, add, 5).result(30) == 5


def test_a_worker_that_cannot_start_fails_its_tasks(make_pool: MakePool, ctx: EnvContext) -> None:
    missing = make_pool(ctx.replace(python="/nonexistent/python"))
    with pytest.raises(WorkerError, match="cannot start a worker"):
        submit(missing, add, 1).result(30)
    quitter = make_pool(ctx.replace(command_prefix=["false"]))
    with pytest.raises(WorkerError, match="before it was ready"):
        submit(quitter, add, 1).result(30)


def test_idle_workers_stop_and_the_pool_releases_once(ctx: EnvContext) -> None:
    released: list[str] = []
    pool = Pool(lambda: ctx, lambda c: released.append("x"), idle_timeout=0.2, close_when_idle=True)
    worker = submit(pool, pid).result(30)
    wait_gone([worker])
    deadline = time.monotonic() + 10
    while pool.state is not PoolState.CLOSED and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pool.state is PoolState.CLOSED
    assert released == ["x"]
    pool.close()
    assert released == ["x"]
    task = Task(b"", RemoteFuture("late"), OutputTarget.capture("late"))
    assert pool.submit(task) is False  # the executor then makes a new pool


def test_a_pool_reaps_idle_workers_again_after_its_janitor_ended(make_pool: MakePool) -> None:
    # The janitor thread ends once no worker is idle, and the pool starts it again (by
    # ``Pool._janitor`` alone, without asking the thread whether it lives) for the next.
    pool = make_pool(max_workers=1, idle_timeout=0.2)
    for _ in range(2):
        worker = submit(pool, pid).result(30)
        wait_gone([worker])
        deadline = time.monotonic() + 10
        while (pool._janitor is not None or pool.pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pool._janitor is None
        assert pool.pids == []
        assert pool.state is PoolState.READY


def test_close_ends_every_worker_and_cancels_tasks(ctx: EnvContext) -> None:
    released: list[str] = []
    pool = Pool(lambda: ctx, lambda c: released.append(c.env_id), max_workers=2)
    busy = submit(pool, _sleep_pid, 60)
    idle_pid = submit(pool, pid).result(30)
    pids = pool.pids
    assert idle_pid in pids
    pool.close()
    assert busy.cancelled()
    wait_gone(pids)
    assert not worker_children()
    assert released == [""]
    assert psutil.Process().children() == [] or all(
        p.pid not in pids for p in psutil.Process().children()
    )


def _wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_a_spare_worker_takes_the_next_task_and_none_outlives_close(
    make_pool: MakePool,
) -> None:
    pool = make_pool(max_workers=2, keep_spare=True)
    first = submit(pool, pid).result(30)
    _wait_until(lambda: len(pool.pids) == 2)  # the spare, started while the first task ran
    workers = pool.pids
    busy = submit(pool, _sleep_pid, 60)
    second = submit(pool, pid).result(30)
    assert {first, second} == set(workers)  # both tasks ran on workers already started
    assert pool.pids == workers  # the spare counts towards max_workers: no third process
    pool.close()
    assert busy.cancelled()
    wait_gone(workers)
    assert not worker_children()


def test_no_spare_beyond_max_workers(make_pool: MakePool) -> None:
    pool = make_pool(max_workers=1, keep_spare=True)
    pids = {submit(pool, pid).result(30) for _ in range(3)}
    assert len(pids) == 1
    assert len(pool.pids) == 1


def test_a_spare_reserved_as_the_pool_closes_is_never_started(ctx: EnvContext) -> None:
    for _ in range(5):  # close races the spare's start: the worker must not outlive it
        pool = Pool(lambda: ctx, max_workers=2, keep_spare=True)
        submit(pool, pid).result(30)
        pool.close()
    _wait_until(lambda: not worker_children())


def test_a_spawned_worker_imports_cloudpickle_only_when_a_task_needs_it(
    make_pool: MakePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Spawned: a worker forked from a template has it from the template, where it cost
    # nothing on the way to a result.
    monkeypatch.setenv(zygote.ZYGOTE_VAR, "0")
    pool = make_pool(max_workers=1)
    loaded = "'cloudpickle' in __import__('sys').modules"
    assert submit(pool, eval, loaded).result(30) is False  # a builtin goes by reference
    assert submit(pool, lambda: 1).result(30) == 1  # a lambda goes by value
    assert submit(pool, eval, loaded).result(30) is True


def test_a_new_workers_first_call_is_sent_before_its_hello(
    make_pool: MakePool, ctx: EnvContext, tmp_path: Any
) -> None:
    # The worker's setup hook (run before HELLO) waits for a gate: meanwhile the driver has
    # handed it its call and sent it (held, outbox empty) although it is not ready; once the
    # gate opens, it runs that call without waiting for the driver again.
    gate = tmp_path / "gate"
    (tmp_path / "gatehook.py").write_text(
        "import os, time\n"
        "def wait():\n"
        "    deadline = time.monotonic() + 120\n"
        f"    while not os.path.exists({str(gate)!r}) and time.monotonic() < deadline:\n"
        "        time.sleep(0.01)\n"
    )
    pool = make_pool(
        ctx.replace(
            env_vars={
                **ctx.env_vars,
                "JUPYTER_RUNTIMEENV_SETUP_HOOK": '{"import": "gatehook.wait"}',
            },
            driver_sys_path=[*ctx.driver_sys_path, str(tmp_path)],
        ),
        max_workers=1,
    )
    future = submit(pool, pid)
    deadline = time.monotonic() + 120

    def sent_workers() -> list[Any]:
        with pool._lock:
            return [w for w in pool._workers if w.held and not w.outbox]

    while not (sent := sent_workers()):
        assert time.monotonic() < deadline, "no worker was sent the call before its HELLO"
        time.sleep(0.01)
    (worker,) = sent
    assert not worker.ready  # its setup hook still waits: no HELLO yet
    gate.write_text("open")
    assert future.result(120) == worker.pid
