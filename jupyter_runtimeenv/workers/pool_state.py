"""A pool's states, and who is told when a pool changes (the kernel's reporter).

Below ``pool``, ``dispatch`` and ``affinity``, which all change a pool and say so
(``notify``); ``pool`` re-exports ``PoolState`` and ``observe``, where their users import
them from.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum


class PoolState(Enum):
    ACQUIRING = "acquiring"  # waiting for the environment
    READY = "ready"
    DRAINING = "draining"  # no new tasks; closes when the queued and running ones are done
    CLOSED = "closed"


_observers: list[Callable[[], None]] = []


def observe(callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` whenever a pool's workers or tasks change. It runs on the pools'
    threads, sometimes under a pool's lock: it must only set a flag. Used by the reporter."""
    if callback not in _observers:
        _observers.append(callback)
    return lambda: _observers.remove(callback) if callback in _observers else None


def notify() -> None:
    """A pool's workers or tasks changed: tell every observer (see ``observe``)."""
    for callback in list(_observers):
        callback()
