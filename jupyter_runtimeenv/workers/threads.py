"""Daemon threads for the driver's short jobs, reused: ``run(target, name)``.

Who calls it: ``Pool`` (each pool's acquire: the agent's answer, then its first workers'
start) and ``WorkerProcess`` (each worker's reader thread). Both are on the path of a new
env's first result, and ``threading.Thread.start`` there cost a new thread's start (a stack
mapped, a clone) and a wait for it to run: 0.1-0.2 ms on an idle VM, 0.8-3.4 ms at load 3-4
(the new thread's first turn on a CPU, which its starter waits for). A thread whose job
ended waits ``IDLE_S`` for another before it exits; ``run`` hands a job to such a thread
(a lock released: it runs when it next gets a CPU, and the caller does not wait for that),
else starts a new one.

Each job runs in a fresh ``contextvars.Context`` under its own name (``Thread.name``, as
the thread it replaces was named), and an exception it raises goes to
``threading.excepthook`` as a thread's would. A forked child starts with no idle thread
(those are its parent's).
"""

from __future__ import annotations

import contextvars
import os
import sys
import threading
from collections.abc import Callable

__all__ = ["IDLE_S", "Job", "run"]

#: How long a thread with no job waits for one before it exits.
IDLE_S = 30.0


class Job:
    """One ``target`` run by ``run``: ``join``, ``is_alive`` and ``is_current`` as a
    ``threading.Thread``'s (``is_current``: whether the caller is the thread running it)."""

    def __init__(self, target: Callable[[], object], name: str) -> None:
        self.target = target
        self.name = name
        self.ident = 0
        self.started = threading.Event()
        self._done = threading.Event()

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def is_current(self) -> bool:
        return self.ident == threading.get_ident() and self.is_alive()


class _Slot:
    """An idle thread's mailbox: ``job`` is set, then ``wake`` released."""

    def __init__(self) -> None:
        self.job: Job | None = None
        self.wake = threading.Lock()
        self.wake.acquire()


_lock = threading.Lock()
_idle: list[_Slot] = []


def run(target: Callable[[], object], name: str, *, wait: bool = False) -> Job:
    """Run ``target`` in a daemon thread (an idle one if there is one); returns at once,
    or with ``wait`` once it runs (as ``Thread.start`` does: the caller then lets it go
    first, where it would otherwise wait for the caller's next steps to let go of the GIL)."""
    job = Job(target, name)
    with _lock:
        slot = _idle.pop() if _idle else None
    if slot is None:
        threading.Thread(target=_serve, args=(job,), name=name, daemon=True).start()
    else:
        slot.job = job
        slot.wake.release()
    if wait:
        job.started.wait()
    return job


def _serve(job: Job | None) -> None:
    while job is not None:
        _run_one(job)
        slot = _Slot()
        with _lock:
            _idle.append(slot)
        if not slot.wake.acquire(timeout=IDLE_S):
            with _lock:
                if slot in _idle:  # nobody took it: this thread ends
                    _idle.remove(slot)
                    return
            slot.wake.acquire()  # taken as the wait ended: its job is on the way
        job = slot.job


def _run_one(job: Job) -> None:
    thread = threading.current_thread()
    thread.name = job.name
    job.ident = threading.get_ident()
    job.started.set()
    try:
        contextvars.Context().run(job.target)
    except BaseException:
        exc_type, exc, tb = sys.exc_info()
        if exc_type is not None:
            threading.excepthook(threading.ExceptHookArgs((exc_type, exc, tb, thread)))
    finally:
        job.target = _nothing  # what it held (a pool, a worker) is not kept by an idle thread
        job._done.set()


def _nothing() -> None:
    return None


def _forget_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _idle.clear()


if sys.platform != "win32":
    os.register_at_fork(after_in_child=_forget_in_child)
