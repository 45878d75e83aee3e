"""An idle worker's one call takes the short path through the driver's layers (issue 19, W2):
its CALL written as one buffer (``Channel.one_call``), its RETURN read by the waiting thread
without a second poll for output, handed back by ``Pool.task_answered`` and unpickled by
``Channel.returned``; everything else takes the general path as before.

Real pools and workers, but for the channel's and the loader's own cases, which are plain
functions of bytes. Whether a waiter polls or blocks is injected as the machine's load (the
file the driver's ``_cpuload.Gauge`` reads), as in test_answer_read.py.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jupyter_runtimeenv.context import EnvContext
from jupyter_runtimeenv.errors import BrokenWorker, SerializationError
from jupyter_runtimeenv.spec import parse
from jupyter_runtimeenv.workers import answers, protocol
from jupyter_runtimeenv.workers.channel import Channel
from jupyter_runtimeenv.workers.executor import (
    LocalExecutor,
    _report_files,
    resolve_driver_sys_path,
)
from jupyter_runtimeenv.workers.future import RemoteFuture, Task
from jupyter_runtimeenv.workers.output import OutputTarget
from jupyter_runtimeenv.workers.pool import Pool
from jupyter_runtimeenv.workers.serialize import (
    SMALL_VALUE,
    load_outcome,
    load_small_return,
    prepare_call,
)
from tests.workers.helpers import echo, nap, noop, submit


@pytest.fixture
def channel() -> Iterator[Channel]:
    ours, theirs = socket.socketpair()
    try:
        yield Channel(ours, os.getpid())
    finally:
        ours.close()
        theirs.close()


def big(size: int) -> str:
    return "x" * size


def answer_again_later() -> int:
    """Answered, then (from a thread, once the worker is idle: its status word cleared after
    the answer went) a RETURN nobody asked for."""
    import gc

    serve = sys.modules["_jupyter_runtimeenv_serve"]
    (loop,) = [o for o in gc.get_objects() if isinstance(o, serve.Worker)]
    head = protocol.RETURN_HEAD.pack(1, 0, 0) + pickle.dumps(None)

    def forge() -> None:
        time.sleep(0.05)
        while protocol.STATUS.unpack_from(loop.status)[0]:  # this call runs until answered
            time.sleep(0.001)
        os.write(loop.fd, protocol.HEADER.pack(protocol.RETURN, len(head)) + head)

    threading.Thread(target=forge).start()
    return os.getpid()


def _task(function: Callable[..., Any], *args: Any) -> Task:
    name = function.__name__
    future: RemoteFuture[Any] = RemoteFuture(name)
    return Task.of(prepare_call(0, function, args, {}, name), future, OutputTarget.capture(name))


# -- the call out ----------------------------------------------------------------------------


def test_an_idle_worker_s_one_call_is_one_buffer_as_encode_made_it(channel: Channel) -> None:
    task = _task(echo, 3)
    assert channel.one_call([task]) is None  # its function is new there: FUNC goes first
    first = channel.encode([task], spare=True)
    call = task.call
    for spare in (False, True):
        flags = protocol.RESULT_SHARED | (protocol.SPARE if spare else 0)
        head = protocol.CALL_HEAD.pack(call.task_id, call.key, flags, 0)
        frame = protocol.frame(protocol.CALL, head, call.body)
        if spare:  # the first time: FUNC, then the same CALL
            assert [buffer[0] for buffer in first[0][0]] == [protocol.FUNC, protocol.CALL]
            assert first[0][0][1] == frame[0]
        assert channel.one_call([task], spare) == frame[0]
        assert channel.encode([task], spare) == [(frame, [])]


def test_the_general_encoding_where_more_than_one_call_goes(channel: Channel) -> None:
    task, other = _task(echo, 1), _task(echo, 2)
    channel.encode([task])  # the function is known from now on
    assert channel.one_call([task, other]) is None
    assert channel.one_call([]) is None
    channel.results.freed.append(7)  # a FREE is due: it goes with the call
    try:
        assert channel.one_call([task]) is None
    finally:
        channel.results.freed.clear()
    large = _task(big, 0)
    large.call.body = b"y" * (1 << 16)  # past one buffer's size
    channel.encode([large])
    assert channel.one_call([large]) is None
    assert [len(buffers) for buffers, _ in channel.encode([large])] == [3]  # header, head, body


# -- the answer back -------------------------------------------------------------------------


def _return(task_id: int, value: Any, spans: int = 0) -> bytes:
    return protocol.RETURN_HEAD.pack(task_id, 123, spans) + pickle.dumps(value, protocol=5)


def test_a_small_return_loads_as_the_general_loader_does() -> None:
    for value in (None, 3, "text", [1, 2.5, {"a": b"b"}], "x" * (SMALL_VALUE - 40)):
        payload = _return(41, value)
        assert load_small_return(payload, 41, "f") == load_outcome(3, payload, 41, "f") == value
    with pytest.raises(protocol.ProtocolError, match="RETURN for task 41, expected 42"):
        load_small_return(_return(41, 1), 42, "f")
    broken = protocol.RETURN_HEAD.pack(41, 0, 0) + b"not a pickle"
    with pytest.raises(SerializationError, match="the result of f could not be unpickled"):
        load_small_return(broken, 41, "f")


def test_the_channel_loads_other_returns_the_general_way(channel: Channel) -> None:
    task = _task(echo, 1)
    tid = task.call.task_id
    assert channel.returned(task, _return(tid, 5)) == 5
    large = "z" * (SMALL_VALUE + 10)
    assert channel.returned(task, _return(tid, large)) == large  # through a view
    task.raw = True  # a Dask node's task: the bytes as they came
    assert channel.returned(task, _return(tid, 5)) == (protocol.RETURN, _return(tid, 5))
    task.raw = False
    with pytest.raises(protocol.ProtocolError):  # names a buffer of a segment never sent
        channel.returned(task, _return(tid, 5, spans=1) + bytes(protocol.SPAN.size))


def test_the_waiter_reads_an_idle_worker_s_answer_without_a_second_poll(
    make_pool: Callable[..., Pool], machine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, every answer a waiter read was followed by a poll for output
    (``_frames_after_output``); the one answer of an idle worker's one call needs none (the
    poll that saw it looked at the pipes after the socket). The reader thread still does."""
    general: list[threading.Thread] = []
    before = answers.Answers._frames_after_output

    def spy(self: answers.Answers, *args: Any) -> None:
        general.append(threading.current_thread())
        before(self, *args)

    monkeypatch.setattr(answers.Answers, "_frames_after_output", spy)
    pool = make_pool(max_workers=1)
    assert submit(pool, noop).result(timeout=60) is None
    settled_in: list[threading.Thread] = []
    for _ in range(200):
        future = submit(pool, noop)
        future.add_done_callback(lambda _f: settled_in.append(threading.current_thread()))
        assert future.result(timeout=60) is None
    here = threading.current_thread()
    assert here in settled_in  # this thread read answers (some, at least)
    assert here not in general


def test_large_and_small_answers_each_way(make_pool: Callable[..., Pool], machine: str) -> None:
    """A RETURN of one buffer (the worker's short path) and one too large for it."""
    pool = make_pool(max_workers=1)
    for size in (0, 10, SMALL_VALUE + 1, 1 << 16, 1 << 20, 5):
        assert submit(pool, big, size).result(timeout=60) == "x" * size


def test_an_answer_nobody_asked_for_breaks_the_worker(
    make_pool: Callable[..., Pool], machine: str
) -> None:
    """A RETURN from a worker that holds no call (``task_answered``: none) is a protocol
    error: the worker is killed, and the next call runs on a new one."""
    pool = make_pool(max_workers=1)
    first = submit(pool, answer_again_later).result(timeout=60)
    deadline = time.monotonic() + 30
    while first in pool.pids:
        assert time.monotonic() < deadline, "the worker was not killed"
        time.sleep(0.01)
    assert submit(pool, os.getpid).result(timeout=60) != first


def test_a_death_during_an_idle_worker_s_call_fails_that_call_only(
    make_pool: Callable[..., Pool], machine: str
) -> None:
    pool = make_pool(max_workers=1)
    assert submit(pool, noop).result(timeout=60) is None
    for _ in range(3):
        with pytest.raises(BrokenWorker):
            submit(pool, os._exit, 3).result(timeout=60)
        assert submit(pool, nap, 0.0).result(timeout=60) == "rested"


def test_a_task_of_an_env_without_a_tree_reports_no_files() -> None:
    """``LocalExecutor`` sets no ``finish`` (the files a task wrote) on a task whose pool's
    env has no tree of ours; one whose env is not known yet gets it (it may have one)."""
    acquired = threading.Event()
    release = threading.Event()

    def acquire(spec: Any, holder: str) -> EnvContext:
        acquired.set()
        release.wait(30)
        return EnvContext(
            env_id=spec.env_id, python=sys.executable, driver_sys_path=resolve_driver_sys_path()
        )

    executor = LocalExecutor(acquire=acquire, release=lambda *_: None, max_workers=1)
    try:
        spec = parse({"env_vars": {"JRE_TEST_IDLE_PATH": "1"}})
        first = executor.submit(nap, (0.0,), {}, runtime_env=spec, name="nap")
        assert acquired.wait(30)
        assert first._task is not None
        assert first._task.finish is _report_files
        release.set()
        assert first.result(timeout=60) == "rested"
        second = executor.submit(nap, (0.5,), {}, runtime_env=spec, name="nap")
        assert second._task is not None
        assert second._task.finish is None
        assert second.result(timeout=60) == "rested"
        assert second.files is None
    finally:
        release.set()
        executor.shutdown()
