"""What an interrupt does to remote work: cancel what was waited on, and kill its workers.

``get``, ``wait``, ``RemoteFuture.result`` (and ``%%remote`` in ``ipython/``) wait in the
driver's main thread, where SIGINT (the notebook's interrupt button) raises
``KeyboardInterrupt``. Returning the kernel is not enough: the tasks would run on for as
long as they like. So each of them catches the interrupt and raises instead the one that
``interrupted(futures, caught)`` returns, after it has cancelled every future it was
waiting on that is not done (a running task's worker is SIGKILLed, see
``RemoteFuture.cancel``). That ``RemoteInterrupt`` (a ``KeyboardInterrupt``) carries a
one-line message, e.g. ``cancelled 3 remote tasks of crunch``, which IPython shows alone
(``_render_traceback_``) instead of a page of ``concurrent.futures`` frames; it is raised
``from None`` and the waiting frames set ``__tracebackhide__`` (pytest, plain tracebacks).

``cancel(futures)`` is the public form of "cancel these and kill their workers" (like
``ray.cancel(ref, force=True)``).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable
from typing import Any

from ..errors import RemoteInterrupt

Futures = concurrent.futures.Future[Any] | Iterable[concurrent.futures.Future[Any]]


def cancel(futures: Futures) -> list[concurrent.futures.Future[Any]]:
    """Cancel each future that is not done yet; returns the ones that this call cancelled.

    A queued task never runs; a running task's worker is killed at once (SIGKILL) and the
    pool starts a fresh worker for the tasks that follow. Futures already done are left
    alone, so calling this on a mix of finished and pending futures is safe.
    """
    if isinstance(futures, concurrent.futures.Future):
        futures = [futures]
    cancelled = []
    for future in futures:
        if not isinstance(future, concurrent.futures.Future):
            raise TypeError(f"cancel() expects futures, got {type(future).__name__}")
        if not future.done() and future.cancel():
            cancelled.append(future)
    return cancelled


def interrupted(futures: Futures, caught: BaseException | None = None) -> RemoteInterrupt:
    """Cancel ``futures`` (see ``cancel``) and return the interrupt to raise ``from None``.

    ``caught`` is the interrupt being handled: if an inner wait already turned it into a
    ``RemoteInterrupt`` (``get`` around ``RemoteFuture.result``), what that one cancelled
    is counted too.
    """
    earlier = list(caught.cancelled) if isinstance(caught, RemoteInterrupt) else []
    cancelled = earlier + [f for f in cancel(futures) if not any(f is e for e in earlier)]
    return RemoteInterrupt(describe(cancelled) if cancelled else "", cancelled)


def describe(cancelled: list[concurrent.futures.Future[Any]]) -> str:
    """``cancelled 3 remote tasks of crunch`` (names in order of first appearance)."""
    names = list(dict.fromkeys(str(getattr(f, "name", "task")) for f in cancelled))
    count = len(cancelled)
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"cancelled {count} remote task{'s' if count != 1 else ''} of {shown}"
