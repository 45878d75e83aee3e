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
import logging
from collections.abc import Callable, Generator
from concurrent.futures import Future, InvalidStateError
from typing import Any, TypeVar

from .interrupt import interrupted
from .output import OutputTarget
from .serialize import Call, unpack_call

T = TypeVar("T")

log = logging.getLogger(__name__)
_task_ids = itertools.count(1)
#: How often a task is handed to a worker that dies before reading it, before it fails.
MAX_DELIVERIES = 3


class RemoteFuture(Future[T]):
    """The result of one remote call: ``.result(timeout)``, ``await fut``, ``cancel()``."""

    def __init__(self, name: str = "task") -> None:
        super().__init__()
        self.name = name
        self._started = False
        self._probe: Callable[[], bool] | None = None
        self._cancel_hook: Callable[[RemoteFuture[Any]], None] | None = None
        self._finishers: list[Callable[[], None]] = []
        #: The files the task wrote in its working directory, and those copied back
        #: (``workers.files.FilesWritten``), once it ended; None where there is no tree.
        self.files: Any = None

    def __repr__(self) -> str:
        state = "running" if self.running() else super().__repr__().split(" state=")[-1][:-1]
        return f"<RemoteFuture {self.name} {state}>"

    def running(self) -> bool:
        """Whether its worker has started it (a call waiting in a worker's pipeline has
        not: the worker's status word tells)."""
        if not self._started or self.done():
            return False
        probe = self._probe
        return probe is None or probe()

    def cancel(self) -> bool:
        """Cancel the task; if it is running, its worker is killed (the pool replaces it)."""
        if not super().cancel():
            return False
        hook, self._cancel_hook = self._cancel_hook, None
        if hook is not None:
            hook(self)
        self._probe = None  # it holds the worker: a cancelled future kept by the user must not
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

    def mark_started(self, started: bool = True, probe: Callable[[], bool] | None = None) -> None:
        """Handed to a worker (``probe``: whether that worker has started it), or not."""
        self._started = started
        self._probe = probe

    def set_cancel_hook(self, hook: Callable[[RemoteFuture[Any]], None]) -> None:
        self._cancel_hook = hook

    def add_finisher(self, finish: Callable[[], None]) -> None:
        """Run ``finish`` once the task has ended, before its outcome is visible (in the
        thread that settles it): the executor lists and copies back the files it wrote, so
        they are there when ``result()`` returns. Not run for a cancelled task."""
        self._finishers.append(finish)

    def settle_result(self, value: Any) -> None:
        self._finish()
        with contextlib.suppress(InvalidStateError):  # cancelled meanwhile: the canceller won
            self.set_result(value)
        self._cancel_hook = self._probe = None  # they hold the task: let it go

    def settle_exception(self, error: BaseException) -> None:
        self._finish()
        with contextlib.suppress(InvalidStateError):
            self.set_exception(error)
        self._cancel_hook = self._probe = None

    def _finish(self) -> None:
        finishers, self._finishers = self._finishers, []
        if self.cancelled():
            return
        for finish in finishers:
            try:
                finish()
            except Exception:  # the task's outcome matters more than its files' report
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
        "future",
        "id",
        "output",
        "payload",
        "raw",
        "sources",
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
