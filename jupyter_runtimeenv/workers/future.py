"""``RemoteFuture`` (what ``f.remote()`` returns) and ``Task`` (what a pool queues).

``RemoteFuture`` is a ``concurrent.futures.Future`` that can also be awaited. It stays in the
PENDING state while its task runs (``running()`` is answered from the pool's own flag), so
that the standard ``cancel()`` succeeds for a running task too; the pool's cancel hook then
kills the worker that runs it. Completion comes from a worker's reader thread via
``settle_result``/``settle_exception``, which lose quietly to a concurrent ``cancel()``.
A ``KeyboardInterrupt`` while ``result()`` waits cancels the task too (see ``interrupt``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Generator
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .interrupt import interrupted
from .output import OutputTarget

T = TypeVar("T")

_task_ids = itertools.count(1)
#: How often a task is handed to a worker that dies before reading it, before it fails.
MAX_DELIVERIES = 3


class RemoteFuture(Future[T]):
    """The result of one remote call: ``.result(timeout)``, ``await fut``, ``cancel()``."""

    def __init__(self, name: str = "task") -> None:
        super().__init__()
        self.name = name
        self._started = False
        self._cancel_hook: Callable[[RemoteFuture[Any]], None] | None = None

    def __repr__(self) -> str:
        state = "running" if self.running() else super().__repr__().split(" state=")[-1][:-1]
        return f"<RemoteFuture {self.name} {state}>"

    def running(self) -> bool:
        return self._started and not self.done()

    def cancel(self) -> bool:
        """Cancel the task; if it is running, its worker is killed (the pool replaces it)."""
        if not super().cancel():
            return False
        hook, self._cancel_hook = self._cancel_hook, None
        if hook is not None:
            hook(self)
        return True

    def result(self, timeout: float | None = None) -> T:
        """The task's value; an interrupt while waiting cancels the task (see ``interrupt``)."""
        __tracebackhide__ = True
        try:
            return super().result(timeout)
        except KeyboardInterrupt as caught:
            raise interrupted(self, caught) from None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The task's error or ``None``; an interrupt while waiting cancels the task."""
        __tracebackhide__ = True
        try:
            return super().exception(timeout)
        except KeyboardInterrupt as caught:
            raise interrupted(self, caught) from None

    def __await__(self) -> Generator[Any, None, T]:
        # Cancelling the awaiting asyncio task (ipykernel turns an interrupt during a
        # top-level await into that; so does asyncio.run on Ctrl-C) cancels this future
        # through wrap_future's chaining, and with it the task and its worker.
        return asyncio.wrap_future(self).__await__()

    # -- called by the pool and by the worker's reader thread ---------------------------

    def mark_started(self, started: bool = True) -> None:
        self._started = started

    def set_cancel_hook(self, hook: Callable[[RemoteFuture[Any]], None]) -> None:
        self._cancel_hook = hook

    def settle_result(self, value: Any) -> None:
        with contextlib.suppress(InvalidStateError):  # cancelled meanwhile: the canceller won
            self.set_result(value)
        self._cancel_hook = None  # it holds the task (and its payload): let them go

    def settle_exception(self, error: BaseException) -> None:
        with contextlib.suppress(InvalidStateError):
            self.set_exception(error)
        self._cancel_hook = None


@dataclass(eq=False)
class Task:
    """One call waiting for, or running in, a worker. ``payload`` is the pickled CALL."""

    payload: bytes
    future: RemoteFuture[Any]
    output: OutputTarget
    id: int = field(default_factory=lambda: next(_task_ids))
    #: Code name -> filename of the submitted function (see ``tracebacks``).
    sources: dict[str, str] = field(default_factory=dict)
    #: Settle the future with ``(kind, payload)`` as received, unpickled by whoever asked
    #: (a Dask node hands the bytes to the driver and never imports the task's packages).
    raw: bool = False
    #: Workers it was handed to. One that dies with the CALL unread puts the task back in
    #: the queue (it never ran), at most ``MAX_DELIVERIES`` times in all.
    deliveries: int = 0

    @property
    def name(self) -> str:
        return self.output.name
