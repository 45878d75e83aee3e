"""``RemoteFuture`` (what ``f.remote()`` returns) and ``Task`` (what a pool queues).

``RemoteFuture`` is a ``concurrent.futures.Future`` that can also be awaited. It stays in the
PENDING state while its task runs (``running()`` is answered from the worker's status word),
so that the standard ``cancel()`` succeeds for a running task too; the pool then kills the
worker that runs it. Completion comes from a worker's reader thread via
``settle_result``/``settle_exception``, which lose quietly to a concurrent ``cancel()``.
A ``KeyboardInterrupt`` while ``result()`` waits cancels the task too (see ``interrupt``).

Light on the cyclic GC: a notebook may hold 100,000 futures, pending or done, and every
object the garbage collector tracks is scanned by each full collection (in whichever thread
triggers it, the GIL held), so a submit got slower with the number pending (the tasks
curve: 2.8x per task from 1k to 100k). A standard ``Future`` brings a ``Condition``, its
``RLock``, a deque and five bound methods; the pool added a closure per task for cancelling,
one for probing whether it runs, one for its files. Here every future shares one
``Condition`` (only its lock is used: ``concurrent.futures.wait``/``as_completed`` and the
base methods take it; a thread waiting in ``result()`` blocks on a lock of its own, installed
as one of the future's waiters, so a settle wakes only the threads waiting for that future),
done-callbacks get a list only when one is added, and what the pool needs lives on the
``Task`` (``pool``, ``worker``, ``finish``), which a settled future lets go: a pending call
keeps ~6 tracked objects alive instead of ~28, a done one 2.
"""

from __future__ import annotations

import _thread
import asyncio
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    PENDING,
    _Waiter,
)
from typing import Any, Protocol, TypeVar

from .interrupt import interrupted
from .output import OutputTarget
from .serialize import Call, unpack_call

T = TypeVar("T")

log = logging.getLogger(__name__)
_task_ids = itertools.count(1)
#: How often a task is handed to a worker that dies before reading it, before it fails.
MAX_DELIVERIES = 3


class _SharedLock(_thread.RLock):  # type: ignore[misc]  # final in typeshed only
    """The lock of every ``RemoteFuture`` (see the module docstring), as its ``_condition``.
    Re-entrant, as ``concurrent.futures.wait`` takes each future's lock in turn. Nothing
    waits on it (a waiter blocks on a lock of its own), so ``notify_all`` has nothing to do.

    Not a ``threading.Condition``: its ``__enter__`` is Python code, and an interrupt (the
    main thread's KeyboardInterrupt) raised as that code returns from taking the lock left
    it taken for good: every future of the process then hung (found by
    tests/workers/test_answer_read.py, interrupting ``result()`` at random instants). An
    RLock's own ``__enter__`` takes it and enters the ``with`` block in one step."""

    def notify_all(self) -> None:
        pass

    def wait(self, timeout: float | None = None) -> bool:
        # Only Future.result(0)/exception(0) call it, on a future not done: nothing to wait.
        return False


_CONDITION = _SharedLock()


def _unlock_after_fork() -> None:
    # A fork (multiprocessing's default start method on Linux, os.fork in a notebook) while
    # another thread held the lock -- a reader thread settling a future -- would leave it held
    # for good in the child, and the child's first future would hang. threading resets its
    # own locks the same way.
    _CONDITION._at_fork_reinit()  # type: ignore[attr-defined]


os.register_at_fork(after_in_child=_unlock_after_fork)
_DONE = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)
#: A future's states once done, for a look at ``_state`` without its lock (``answers``).
SETTLED = frozenset(_DONE)
_NO_CALLBACKS: list[Any] = []  # never appended to: replaced by a list of its own first


class Holder(Protocol):
    """What holds a task (``Pool``): cancelling its future takes the task back."""

    def cancel_task(self, task: Task) -> None: ...


class Runner(Protocol):
    """What a task was handed to (``WorkerProcess``)."""

    def running(self) -> int:
        """The id of the call it runs, or 0."""
        ...

    def read_answer(self, task: Task, timeout: float | None) -> None:
        """Read ``task``'s answer in this thread if it can, briefly (see ``WorkerProcess``)."""
        ...


class _Wake(_Waiter):
    """One thread waiting in ``result()``/``exception()``: it blocks on ``lock``, released
    when the future is done (called as a ``concurrent.futures`` waiter, under ``_CONDITION``:
    one releaser at a time)."""

    __slots__ = ("lock",)

    def __init__(self) -> None:  # not _Waiter's: no Event, no list of futures
        self.lock = threading.Lock()
        self.lock.acquire()

    def add_result(self, future: Future[Any]) -> None:
        if self.lock.locked():
            self.lock.release()

    add_exception = add_cancelled = add_result


class RemoteFuture(Future[T]):
    """The result of one remote call: ``.result(timeout)``, ``await fut``, ``cancel()``."""

    def __init__(self, name: str = "task") -> None:
        # Not Future.__init__: its own Condition per future is what this class avoids.
        self._condition = _CONDITION  # type: ignore[assignment]  # see _SharedLock
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters = []
        self._done_callbacks = _NO_CALLBACKS
        self.name = name
        self._started = False
        self._probe: Callable[[], bool] | None = None
        self._cancel_hook: Callable[[RemoteFuture[Any]], None] | None = None
        self._finishers: tuple[Callable[[], None], ...] = ()
        #: The pool's task, until the future is settled or cancelled (``Task.__init__``).
        self._task: Task | None = None
        #: The files the task wrote in its working directory, and those copied back
        #: (``workers.files.FilesWritten``), once it ended; None where there is no tree.
        self.files: Any = None

    def __repr__(self) -> str:
        state = "running" if self.running() else super().__repr__().split(" state=")[-1][:-1]
        return f"<RemoteFuture {self.name} {state}>"

    def running(self) -> bool:
        """Whether its worker has started it (a call waiting in a worker's pipeline has
        not: the worker's status word tells)."""
        if not self._started or self._state in _DONE:
            return False
        task = self._task
        if task is not None and task.worker is not None:
            return task.worker.running() == task.call.task_id
        probe = self._probe
        return probe is None or probe()

    def cancel(self) -> bool:
        """Cancel the task; if it is running, its worker is killed (the pool replaces it)."""
        if not super().cancel():
            return False
        with _CONDITION:
            # As an executor does for a cancelled future it picks up: the waiters of
            # concurrent.futures.wait/as_completed (and result()'s) count it done now.
            if self._state == CANCELLED:
                self._state = CANCELLED_AND_NOTIFIED
                for waiter in self._waiters:
                    waiter.add_cancelled(self)
        task, hook = self._task, self._cancel_hook
        self._task = self._cancel_hook = self._probe = None  # they hold the worker
        if task is not None and task.pool is not None:
            task.pool.cancel_task(task)
        if hook is not None:
            hook(self)
        return True

    def add_done_callback(self, fn: Callable[[Future[T]], object]) -> None:
        with _CONDITION:
            if self._done_callbacks is _NO_CALLBACKS:
                self._done_callbacks = []
        super().add_done_callback(fn)

    def result(self, timeout: float | None = None) -> T:
        """The task's value; an interrupt while waiting cancels the task (see ``interrupt``)."""
        __tracebackhide__ = True
        try:
            self._wait(timeout)
            if self._state == FINISHED and self._exception is None:
                return self._result  # type: ignore[return-value]  # as Future.result's
            return super().result(0)  # done, or a TimeoutError
        except KeyboardInterrupt as caught:
            raise interrupted(self, caught) from None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The task's error or ``None``; an interrupt while waiting cancels the task."""
        __tracebackhide__ = True
        try:
            self._wait(timeout)
            return super().exception(0)
        except KeyboardInterrupt as caught:
            raise interrupted(self, caught) from None

    def _wait(self, timeout: float | None) -> None:
        """Until the future is done, at most ``timeout`` seconds. The worker that runs the
        task may let this thread read the answer itself (one thread woken instead of two)."""
        if self._state in _DONE:
            return
        task = self._task
        runner = task.worker if task is not None else None
        if runner is not None and task is not None and task.affinity is None:
            # Not for a kept worker's call (%%remote): an interrupt while the answer is
            # handled here breaks the worker, and its namespace with it.
            if timeout is None:
                runner.read_answer(task, None)
            else:
                start = time.monotonic()
                runner.read_answer(task, timeout)
                timeout = max(0.0, timeout - (time.monotonic() - start))
            if self._state in _DONE:  # this thread read and settled it: nothing to wait for
                return
        with _CONDITION:
            if self._state in _DONE:
                return
            wake = _Wake()
            self._waiters.append(wake)
        try:
            wake.lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0))
        finally:
            with _CONDITION:
                self._waiters.remove(wake)

    def __await__(self) -> Generator[Any, None, T]:
        # Cancelling the awaiting asyncio task (ipykernel turns an interrupt during a
        # top-level await into that; so does asyncio.run on Ctrl-C) cancels this future
        # through wrap_future's chaining, and with it the task and its worker.
        return asyncio.wrap_future(self).__await__()

    # -- called by the pool and by the worker's reader thread ---------------------------

    def mark_started(self, started: bool = True, probe: Callable[[], bool] | None = None) -> None:
        """Handed to a worker, or not. ``probe``: whether that worker has started it (the
        pool's tasks say it through ``Task.worker`` instead)."""
        self._started = started
        self._probe = probe

    def set_cancel_hook(self, hook: Callable[[RemoteFuture[Any]], None]) -> None:
        """Call ``hook`` when the future is cancelled (a pool's task: ``Task.pool``)."""
        self._cancel_hook = hook

    def add_finisher(self, finish: Callable[[], None]) -> None:
        """Run ``finish`` once the task has ended, before its outcome is visible (in the
        thread that settles it). Not run for a cancelled task. (The local executor's
        finisher is ``Task.finish``: no closure per call.)"""
        self._finishers = (*self._finishers, finish)

    def settle_result(self, value: Any) -> None:
        """``set_result``'s steps, inline (this is on every round trip), losing quietly to
        a ``cancel()`` that came first."""
        self._finish()
        with _CONDITION:
            if self._state in _DONE:  # cancelled meanwhile: the canceller won
                self._let_go()
                return
            self._result = value
            self._state = FINISHED
            for waiter in self._waiters:
                waiter.add_result(self)
        if self._done_callbacks is not _NO_CALLBACKS:
            self._invoke_callbacks()  # type: ignore[attr-defined]  # Future's
        self._let_go()

    def settle_exception(self, error: BaseException) -> None:
        self._finish()
        try:  # noqa: SIM105 - as settle_result
            self.set_exception(error)
        except InvalidStateError:
            pass
        self._let_go()

    def _let_go(self) -> None:
        task = self._task
        self._task = self._cancel_hook = self._probe = None  # they hold the task
        if task is not None:
            task.worker = None

    def _finish(self) -> None:
        task, finishers = self._task, self._finishers
        self._finishers = ()
        if self._state in (CANCELLED, CANCELLED_AND_NOTIFIED):
            return
        if task is not None and task.finish is not None:
            try:
                task.finish(task)
            except Exception:  # the task's outcome matters more than its files' report
                log.warning("after task %s", self.name, exc_info=True)
        for finish in finishers:
            try:
                finish()
            except Exception:
                log.warning("after task %s", self.name, exc_info=True)


class Task:
    """One call waiting for, or running in, a worker.

    Made by the local executor from a prepared ``Call`` (``Task.of``), or from a
    self-contained ``payload`` (``serialize.dump_call``: a Dask node's task, tests), which is
    unpacked into its ``call`` when first sent.
    """

    __slots__ = (
        "__weakref__",
        "_call",
        "_packed",
        "affinity",
        "deliveries",
        "files_out",
        "finish",
        "future",
        "here",
        "id",
        "output",
        "payload",
        "pool",
        "raw",
        "sources",
        "worker",
    )

    def __init__(
        self,
        payload: bytes,
        future: RemoteFuture[Any],
        output: OutputTarget,
        *,
        raw: bool = False,
        sources: dict[str, str] | None = None,
        affinity: str | None = None,
    ) -> None:
        self.payload = payload
        self.future = future
        self.output = output
        self.id = next(_task_ids)
        #: Code name -> filename of the submitted function (see ``tracebacks``).
        self.sources = sources if sources is not None else {}
        #: Settle the future with ``(kind, payload)`` as received, unpickled by whoever asked
        #: (a Dask node hands the bytes to the driver and never imports the task's packages).
        self.raw = raw
        #: Workers it was handed to. One that dies before starting it puts the task back in
        #: the queue (it never ran), at most ``MAX_DELIVERIES`` times in all.
        self.deliveries = 0
        #: Tasks with the same key run one after another in one worker kept for them (a
        #: ``%%remote`` namespace lives there); see ``Pool``.
        self.affinity = affinity
        self._call: Call | None = None
        self._packed: bytes | None = None
        #: The pool that took it (``Pool.submit``): cancelling the future takes it back.
        self.pool: Holder | None = None
        #: The worker it was handed to, while it holds it: whether it runs it yet.
        self.worker: Runner | None = None
        #: Run with the task once it ended, before its future settles (not if cancelled):
        #: the local executor lists its files and copies ``files_out`` back to ``here``.
        self.finish: Callable[[Task], None] | None = None
        self.files_out: Sequence[str] = ()
        self.here = ""
        future._task = self

    @classmethod
    def of(
        cls,
        call: Call,
        future: RemoteFuture[Any],
        output: OutputTarget,
        affinity: str | None = None,
    ) -> Task:
        """A task for a prepared call (``serialize.prepare_call``)."""
        task = cls(b"", future, output, sources=call.sources, affinity=affinity)
        call.task_id = task.id
        task._call, task._packed = call, task.payload
        if call.segment is not None:  # its shared memory goes back once nobody needs it
            future.add_done_callback(lambda _f: call.finish())
        return task

    @property
    def call(self) -> Call:
        """The call to send (unpacked from ``payload`` if it was given that way)."""
        if self._call is None or self._packed is not self.payload:
            self._call = unpack_call(self.payload)
            self._packed = self.payload
        return self._call

    @property
    def name(self) -> str:
        return self.output.name

    def __repr__(self) -> str:
        return f"<Task {self.id} {self.name}>"
