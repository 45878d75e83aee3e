"""Only the worker process answers (issue 16 item 8, the protocol's part).

A task's forked child that writes a forged answer on a copy of the channel is ignored
(the driver reads the writer's pid with every chunk); a child of ``os.fork()`` that returns
into the worker's loop exits without answering and steals no call; a wrapper that starts
the interpreter as its child (``uv run``) is admitted because its worker is a descendant.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from collections.abc import Callable
from pathlib import Path

from jupyter_runtimeenv.workers import protocol
from jupyter_runtimeenv.workers.future import RemoteFuture, Task
from jupyter_runtimeenv.workers.output import OutputTarget
from jupyter_runtimeenv.workers.pool import Pool
from jupyter_runtimeenv.workers.serialize import dump_call
from tests.workers.helpers import submit, wait_gone

MakePool = Callable[..., Pool]


def _channel_fd() -> int:
    return int(sys.argv[sys.argv.index("--fd") + 1])


def _forged(task_id: int) -> list[bytes]:
    head = protocol.RETURN_HEAD.pack(task_id, 1, 0)
    return [bytes(b) for b in protocol.frame(protocol.RETURN, head, pickle.dumps("forged"))]


def forge(task_id: int, pids: str) -> str:
    """Fork a child that writes a well-formed RETURN of ``forged`` for this very call on a
    duplicate of the channel, then answer ``real`` once the child is gone."""
    copy = os.dup(_channel_fd())  # kept across the fork: the at-fork hook cannot see it
    child = os.fork()
    if child == 0:
        try:
            os.write(copy, b"".join(_forged(task_id)))
        finally:
            os._exit(0)
    os.close(copy)
    os.waitpid(child, 0)
    Path(pids).write_text(str(child))
    time.sleep(0.2)  # the forged frame reached the driver first
    return "real"


def test_a_forked_childs_forged_answer_is_ignored(make_pool: MakePool, tmp_path: Path) -> None:
    pool = make_pool(max_workers=1)
    worker = submit(pool, os.getpid).result(60)
    future: RemoteFuture[str] = RemoteFuture("forge")
    task = Task(b"", future, OutputTarget.capture("forge"))
    # The forged answer names this very call: it would be taken if it were read.
    task.payload = dump_call(task.id, forge, (task.id, str(tmp_path / "child")), {}, "forge")
    assert pool.submit(task)
    assert future.result(60) == "real"
    assert submit(pool, os.getpid).result(60) == worker  # the channel is intact
    channel = next(iter(pool._workers)).channel
    assert channel is not None
    assert channel.reader.foreign == len(b"".join(_forged(task.id)))


def fork_and_return(marker: str) -> str:
    """``os.fork()`` and return in both processes: the child must not answer."""
    child = os.fork()
    if child == 0:
        Path(marker).write_text(str(os.getpid()))
        return "child"
    os.waitpid(child, 0)
    return "parent"


def test_a_child_of_fork_returning_into_the_loop_answers_nothing(
    make_pool: MakePool, tmp_path: Path
) -> None:
    pool = make_pool(max_workers=1)
    worker = submit(pool, os.getpid).result(60)
    marker = tmp_path / "child"
    assert submit(pool, fork_and_return, str(marker)).result(60) == "parent"
    child = int(marker.read_text())
    wait_gone([child])
    # No call of the next ones is stolen by the child: all run in the worker.
    assert [submit(pool, os.getpid).result(60) for _ in range(5)] == [worker] * 5


def fork_a_sleeper(marker: str) -> int:
    """A child that keeps running (it does not touch the channel: its copy is /dev/null)."""
    child = os.fork()
    if child == 0:
        try:
            Path(marker + ".tmp").write_text(os.readlink(f"/proc/self/fd/{_channel_fd()}"))
            os.replace(marker + ".tmp", marker)  # whole: the test polls for it
            time.sleep(30)
        finally:
            os._exit(0)
    return child


def test_a_forked_child_does_not_hold_the_channel(make_pool: MakePool, tmp_path: Path) -> None:
    pool = make_pool(max_workers=1)
    marker = tmp_path / "fd"
    child = submit(pool, fork_a_sleeper, str(marker)).result(60)
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() or not marker.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert marker.read_text() == os.devnull
    finally:
        os.kill(child, 9)
