"""What ties a worker's life to the process that started it (the driver side).

Who calls it: ``process.WorkerProcess`` (every worker start and stop) and ``zygote`` (the
template processes). The worker side is ``_entry.watchdog``.

- **The lifeline**: one pipe per process. The driver keeps the write end (close-on-exec,
  never written); each worker gets the read end and a thread of its blocks reading it. When
  the driver dies, however it dies, the kernel closes the write end and the read returns
  EOF: the worker kills its own process group (itself, the task's children). Works on every
  platform.
- **The launcher thread**: on Linux the worker also asks for ``PR_SET_PDEATHSIG``. That
  signal fires when the *thread* that started the child exits, not the process: a worker
  started from a short-lived thread (a pool's spare, a reader thread replacing a dead
  worker) would be told its parent died while it lives. So every child is started from
  one thread that lives as long as the process.
- **The group**: every worker and template leads a process group of its own (``OWN_GROUP``,
  in the driver's session); ``kill_group`` SIGKILLs the whole group (the task's forks and
  children). Call it only while the leader is not yet reaped: a zombie keeps its pid, so
  the group id cannot name someone else's group.
- **Exit watching**: ``exit_fd`` opens a pidfd (Linux 5.3+), readable once the process
  exits, even while a fork of it still holds the worker's pipes open.

After ``os.fork()`` in the driver (a notebook's multiprocessing), the child drops the
inherited lifeline (closing its copies, so the parent's workers still see EOF when the
parent dies) and starts its own launcher when it first needs one.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["OWN_GROUP", "exit_fd", "kill_group", "launch", "launcher_tid", "lifeline_fd"]

T = TypeVar("T")

#: ``Popen`` keywords for a worker or a template: the leader of a process group of its own
#: (``kill_group`` ends it with whatever its task started; a Ctrl-C, or a kernel interrupt
#: sent to the driver's group, does not reach it), in the driver's session, not a session of
#: its own. Linux (autogroup) shares the CPUs among sessions first: a kernel's template and
#: workers in sessions of their own each took as large a share as a whole kernel, and with
#: 16 kernels starting their first workers at once up to 30 sessions were runnable beside the
#: Jupyter server's (``benchmarks/bench_kernels_tail.py``); in the driver's session they
#: share the kernel's. Python 3.10 has no ``process_group``: a session there, as before.
OWN_GROUP: dict[str, Any] = (
    {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
)

_lock = threading.Lock()
_lifeline: tuple[int, int] | None = None  # (read end, write end)
_requests: queue.SimpleQueue[tuple[Callable[[], object], Future[object]]] | None = None
_tid = 0


def lifeline_fd() -> int:
    """The read end of this process's lifeline, to pass to a child (``pass_fds``)."""
    global _lifeline
    with _lock:
        if _lifeline is None:
            _lifeline = os.pipe()  # both close-on-exec; pass_fds opens the read end to one child
        return _lifeline[0]


def launch(start: Callable[[], T]) -> T:
    """Run ``start`` (which starts a child process) on the launcher thread; its result, or
    its exception raised here."""
    done: Future[object] = Future()
    _launcher()[0].put((start, done))
    return done.result()  # type: ignore[return-value]


def launcher_tid() -> int:
    """The launcher thread's id in the kernel: what a child it starts inherits of a thread
    (niceness, CPU affinity: per thread on Linux) can be read from any thread with it."""
    return _launcher()[1]


def _launcher() -> tuple[queue.SimpleQueue[tuple[Callable[[], object], Future[object]]], int]:
    global _requests, _tid
    with _lock:
        if _requests is None:
            requests: queue.SimpleQueue[tuple[Callable[[], object], Future[object]]]
            requests = queue.SimpleQueue()
            started: Future[int] = Future()
            threading.Thread(
                target=_serve,
                args=(requests, started),
                name="jupyter-runtimeenv-launcher",
                daemon=True,
            ).start()
            _tid = started.result()
            _requests = requests
        return _requests, _tid


def _serve(
    requests: queue.SimpleQueue[tuple[Callable[[], object], Future[object]]],
    started: Future[int],
) -> None:
    # Never returns: its exit would fire PR_SET_PDEATHSIG in every child it started.
    started.set_result(threading.get_native_id())
    while True:
        start, done = requests.get()
        try:
            done.set_result(start())
        except BaseException as exc:
            done.set_exception(exc)
        del start, done


def exit_fd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits (a pidfd); None where there is
    none (not Linux, a kernel before 5.3, the process already reaped)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        fd: int = opener(pid)
    except OSError:
        return None
    return fd


def kill_group(pgid: int) -> bool:
    """SIGKILL process group ``pgid``; False if it has no member left. The caller makes sure
    the leader ``pgid`` is not reaped yet (see the module's docstring)."""
    if pgid <= 1 or pgid == os.getpgrp():
        return False  # never ourselves, never init's
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # a member changed its uid (setuid helper): what we may kill is dead
    return True


def _after_fork_in_child() -> None:
    global _lifeline, _requests
    # The launcher thread did not survive the fork; the parent's lifeline is not ours.
    if _lifeline is not None:
        for fd in _lifeline:
            with contextlib.suppress(OSError):
                os.close(fd)
    _lifeline = None
    _requests = None
    globals()["_lock"] = threading.Lock()


if sys.platform != "win32":
    os.register_at_fork(after_in_child=_after_fork_in_child)
