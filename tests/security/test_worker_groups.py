"""Threat: what a task starts outlives the worker that ran it (issue 16, items 7 and 8).

A task's children (``subprocess``), its forks (``os.fork``) and anything else in the
worker's process group used to survive ``cancel()``, the pool's close, the idle timeout and
a SIGKILL of the worker from outside (the sidebar's Stop); a fork holding the worker's pipes
delayed ``BrokenWorker`` until it exited; a task that closed fds 1 and 2 broke every later
task on that worker.

Rules under test (``workers/process.py``, ``workers/lifeline.py``): a worker is the leader
of its own session and process group; whenever it ends, by any path, the driver SIGKILLs the
whole group before it reaps the worker; the driver learns of the worker's death from the
worker's own exit (a pidfd), not from EOF on pipes its forks may hold; a worker whose stdout
or stderr a task closed answers that task, then exits, and the pool starts another.

Real worker processes (spawned, and forked from a template), real children (``sleep``) and
real forks.
"""

from __future__ import annotations

import contextvars
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from processes import Proc, kill_all, of, survivors, wait_for

from jupyter_runtimeenv.context import EnvContext
from jupyter_runtimeenv.errors import BrokenWorker, RemoteTaskError
from jupyter_runtimeenv.workers import zygote
from jupyter_runtimeenv.workers.executor import resolve_driver_sys_path
from jupyter_runtimeenv.workers.future import RemoteFuture, Task
from jupyter_runtimeenv.workers.output import OutputTarget
from jupyter_runtimeenv.workers.pool import Pool
from jupyter_runtimeenv.workers.serialize import dump_call

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups")

#: Generous: the machine is shared and loaded; the point is "gone", not how fast.
GONE_WITHIN = 20.0


# -- what the tasks do (run in the worker; importable there through the driver's sys.path) --


def start_child() -> int:
    """Start a long ``sleep`` in the worker's group and return its pid at once."""
    return subprocess.Popen(["sleep", "300"]).pid


def child_then_hang(marker: str) -> None:
    child = subprocess.Popen(["sleep", "300"])
    write_marker(marker, f"{os.getpid()} {child.pid}")
    time.sleep(300)


def write_marker(marker: str, text: str) -> None:
    """Whole or not at all: the test polls for the file and must never read half of it."""
    Path(marker + ".tmp").write_text(text)
    os.replace(marker + ".tmp", marker)


def fork_then(marker: str, how: str) -> int:
    """Fork a child that holds every fd of the worker (its pipes too) and sleeps; then the
    worker exits (``exit``, once the test has seen both processes and written ``<marker>.go``)
    or returns normally (``return``)."""
    child = os.fork()
    if child == 0:
        time.sleep(300)
        os._exit(0)
    write_marker(marker, f"{os.getpid()} {child}")
    if how == "exit":
        go = Path(marker + ".go")
        while not go.exists():
            time.sleep(0.01)
        os._exit(9)
    return child


def close_stdio() -> int:
    os.close(1)
    os.close(2)
    return os.getpid()


def say(text: str) -> int:
    print(text)
    return os.getpid()


# -- plumbing --------------------------------------------------------------------------------


@pytest.fixture(params=["spawned", "forked"])
def make_pool(request: pytest.FixtureRequest) -> Iterator[Callable[..., Pool]]:
    """Pools whose workers are spawned, or forked from a template (``workers/zygote.py``):
    the same rules hold for both."""
    ctx = EnvContext(python=sys.executable, driver_sys_path=resolve_driver_sys_path())
    pools: list[Pool] = []
    if request.param == "spawned":
        request.getfixturevalue("monkeypatch").setenv(zygote.ZYGOTE_VAR, "0")
    else:
        wait_for_template(Pool(lambda: ctx), ctx.python)

    def make(**kwargs: Any) -> Pool:
        pool = Pool(lambda: ctx, **kwargs)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()
    forks = sum(t.forks for t in zygote.templates())
    zygote.stop_all()
    if request.param == "forked":
        assert forks, "no worker of the test was forked"


def wait_for_template(pool: Pool, python: str) -> None:
    """Start the template of ``python`` (through a first worker) and wait until it forks."""
    try:
        submit(pool, os.getpid).result(120)
    finally:
        pool.close()
    deadline = time.monotonic() + 120
    while not [t for t in zygote.templates() if t.python == python and t.state == "ready"]:
        assert time.monotonic() < deadline, f"no template ready: {zygote.templates()}"
        time.sleep(0.02)


@pytest.fixture
def tracked() -> Iterator[list[Proc]]:
    """Processes a test saw; any still alive at the end is killed (and fails the test where
    the test did not check it itself)."""
    procs: list[Proc] = []
    yield procs
    kill_all(procs)


def submit(
    pool: Pool, function: Callable[..., Any], *args: Any, out: io.StringIO | None = None
) -> RemoteFuture[Any]:
    name = function.__name__
    future: RemoteFuture[Any] = RemoteFuture(name)
    target = OutputTarget.capture(name)
    if out is not None:
        target = OutputTarget(name, out, out, contextvars.copy_context())
    task = Task(b"", future, target)
    task.payload = dump_call(task.id, function, args, {}, name)
    assert pool.submit(task)
    return future


def read_marker(marker: Path, timeout: float = 120) -> list[int]:
    deadline = time.monotonic() + timeout
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline, "the task never started"
        time.sleep(0.02)
    return [int(word) for word in marker.read_text().split()]


# -- item 7: every stop path ends the whole group ---------------------------------------------


def test_cancel_kills_the_tasks_children(
    make_pool: Callable[..., Pool], tracked: list[Proc], tmp_path: Path
) -> None:
    pool = make_pool()
    future = submit(pool, child_then_hang, str(tmp_path / "pids"))
    worker, child = (of(pid) for pid in read_marker(tmp_path / "pids"))
    tracked += [worker, child]
    assert os.getpgid(child.pid) == worker.pid, "the child is not in the worker's group"
    assert future.cancel()
    assert survivors([worker, child], GONE_WITHIN) == []


def test_close_kills_the_tasks_children(
    make_pool: Callable[..., Pool], tracked: list[Proc]
) -> None:
    pool = make_pool()
    future = submit(pool, start_child)
    child = of(future.result(120))
    tracked.append(child)
    worker = of(pool.pids[0])
    pool.close()
    assert survivors([worker, child], GONE_WITHIN) == []


def test_the_idle_timeout_kills_the_tasks_children(
    make_pool: Callable[..., Pool], tracked: list[Proc]
) -> None:
    pool = make_pool(idle_timeout=0.3)
    future = submit(pool, start_child)
    child = of(future.result(120))
    tracked.append(child)
    assert survivors([child], GONE_WITHIN) == []
    # The group goes before the worker is reaped and leaves the pool: polled, not read once.
    wait_for(lambda: pool.pids == [], GONE_WITHIN, "the idle worker to leave the pool")


def test_a_worker_killed_from_outside_takes_its_group(
    make_pool: Callable[..., Pool], tracked: list[Proc]
) -> None:
    """What the sidebar's Stop does: the server SIGKILLs the worker's pid; the kernel that
    owns it sees it exit and ends the rest of its group."""
    pool = make_pool()
    future = submit(pool, start_child)
    child = of(future.result(120))
    worker = of(pool.pids[0])
    tracked += [worker, child]
    os.kill(worker.pid, signal.SIGKILL)
    assert survivors([worker, child], GONE_WITHIN) == []


# -- item 8: forks and broken stdio ---------------------------------------------------------


def test_a_fork_holding_the_pipes_does_not_delay_broken_worker(
    make_pool: Callable[..., Pool], tracked: list[Proc], tmp_path: Path
) -> None:
    pool = make_pool()
    future = submit(pool, fork_then, str(tmp_path / "pids"), "exit")
    # The worker exits only once both are held here: it could otherwise be gone (and its fork
    # ended by the driver) before the test had a handle on either.
    worker, fork = (of(pid) for pid in read_marker(tmp_path / "pids"))
    tracked += [worker, fork]
    (tmp_path / "pids.go").touch()
    # The fork sleeps 300 s with the worker's pipes open: before, the driver waited for it.
    with pytest.raises(BrokenWorker, match="exit code 9"):
        future.result(60)
    assert survivors([worker, fork], GONE_WITHIN) == []


def test_a_fork_does_not_outlive_its_worker(
    make_pool: Callable[..., Pool], tracked: list[Proc], tmp_path: Path
) -> None:
    pool = make_pool()
    future = submit(pool, fork_then, str(tmp_path / "pids"), "return")
    fork = of(future.result(120))
    worker = of(pool.pids[0])
    tracked += [worker, fork]
    pool.close()
    assert survivors([worker, fork], GONE_WITHIN) == []


def test_a_worker_whose_stdio_a_task_closed_is_replaced(
    make_pool: Callable[..., Pool], tracked: list[Proc]
) -> None:
    pool = make_pool(max_workers=1)
    first = submit(pool, close_stdio).result(120)
    out = io.StringIO()
    future = submit(pool, say, "still heard", out=out)
    try:
        second = future.result(120)
    except RemoteTaskError as exc:  # what a later task got before: EBADF on its print
        pytest.fail(f"a later task ran on the broken worker: {exc}")
    assert second != first
    assert f"(say pid={second}) still heard" in out.getvalue()
    assert pool.pids == [second]
