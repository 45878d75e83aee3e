"""``RemoteFuture`` (what ``f.remote()`` returns) and ``Task`` (what a pool queues).

``RemoteFuture`` is a ``concurrent.futures.Future`` that can also be awaited. It stays in the
PENDING state while its task runs (``running()`` is answered from the pool's own flag), so
that the standard ``cancel()`` succeeds for a running task too; the pool's cancel hook then
kills the worker that runs it. Completion comes from a worker's reader thread via
``settle_result``/``settle_exception``, which lose quietly to a concurrent ``cancel()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Generator
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .output import OutputTarget

T = TypeVar("T")

_task_ids = itertools.count(1)


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

    def __await__(self) -> Generator[Any, None, T]:
        return asyncio.wrap_future(self).__await__()

    # -- called by the pool and by the worker's reader thread ---------------------------

    def mark_started(self) -> None:
        self._started = True

    def set_cancel_hook(self, hook: Callable[[RemoteFuture[Any]], None]) -> None:
        self._cancel_hook = hook

    def settle_result(self, value: Any) -> None:
        with contextlib.suppress(InvalidStateError):  # cancelled meanwhile: the canceller won
            self.set_result(value)

    def settle_exception(self, error: BaseException) -> None:
        with contextlib.suppress(InvalidStateError):
            self.set_exception(error)


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

    @property
    def name(self) -> str:
        return self.output.name
