"""Measuring what builds added to the cache, and the cap, off the builds' path.

Who calls it: the agent after a build that committed resources (``building.py``), and at its
stop (``core.py``). A resource is committed without its size (``cache_resources.UNMEASURED``):
walking a pip env of pandas and scikit-learn (~6,000 files) took ~40 ms of every such build's
way to READY, and more with the env's size. Here one thread measures them, one build after
another (each half a second after its build), then asks whether the cache is over the
agent's cap; the agent's GC runs on its loop.
Every listing of the cache measures what is still unmeasured itself (``measure_pending``), so
a process that stops first (the CLI, right after its build) leaves nothing wrong, only work
for the next reader. The thread stops within one directory of a walk when the agent stops.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..errors import RuntimeEnvError
from .cache import Cache

#: Seconds between a build's end and its measuring: the new env's first worker starts in
#: them, and the walk (in this process: the kernel's, with an embedded agent) takes the GIL
#: in turns with what starts it.
AFTER = 0.5


class Sizes:
    """The agent's measuring thread (started with the first build that needs it)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._pool: ThreadPoolExecutor | None = None

    def after_build(self, cache: Cache, cap: int, over_cap: Callable[[], None]) -> None:
        """Measure what is unmeasured in ``cache``, then call ``over_cap()`` (from the
        measuring thread) if the cache holds more than ``cap`` bytes. Returns at once."""
        if self._stop.is_set():
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="jre-sizes")
        self._pool.submit(self._measure, cache, cap, over_cap)

    def _measure(self, cache: Cache, cap: int, over_cap: Callable[[], None]) -> None:
        if self._stop.wait(AFTER):
            return
        try:
            if cache.measure_pending(self._stop) and cache.total_bytes() > cap:
                over_cap()
        except (OSError, sqlite3.Error, RuntimeEnvError):
            pass  # a full disk, the index closed: the next listing measures, the next build asks

    def stop(self) -> None:
        """Stop measuring (a walk ends within a directory) and wait for the thread. Blocking."""
        self._stop.set()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._stop, self._pool = threading.Event(), None  # an agent started again measures
