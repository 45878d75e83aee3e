"""The cache's per-resource locks between processes: ``flock`` on ``locks/<key>.lock``.

Who calls it: ``Cache.lock_for`` (``cache_resources.py``) makes one per use; the agent's
``Resources`` (``resources.py``) takes it to create or evict a resource, from whichever pool
thread, and gives it back from another; the Dask node's store (``dask/node_store.py``) too.
The same ``flock`` as ``filelock``'s ``FileLock`` (which this package used before, and which
another process of an older version may still use on the same file), in ~60 lines: ``import
filelock`` was ~28 ms of every agent's start on this VM (a CLI build, a kernel's embedded
agent), for four calls.

The lock file stays in place (waiters must lock the same inode), owner-only like the rest
of the cache, opened without following a link.
"""

from __future__ import annotations

import fcntl
import math
import os
import threading
import time

from ..errors import RuntimeEnvError

#: Seconds between two tries of a lock another process holds.
_POLL = 0.05


class LockTimeout(RuntimeEnvError):
    """Another process held the lock for the whole time asked."""


class FileLock:
    """An exclusive lock on ``path`` between processes, re-entrant within this object
    (each ``acquire`` needs its ``release``), not tied to a thread."""

    def __init__(self, path: str) -> None:
        self.lock_file = path
        self._fd: int | None = None
        self._count = 0
        self._guard = threading.Lock()

    @property
    def is_locked(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float) -> None:
        """Take the lock, waiting at most ``timeout`` seconds (0: one try); ``LockTimeout``
        if another process still holds it then."""
        with self._guard:
            if self._fd is not None:
                self._count += 1
                return
        deadline = time.monotonic() + timeout
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise LockTimeout(f"{self.lock_file} is held by another process") from None
                    time.sleep(min(_POLL, left))
        except BaseException:
            os.close(fd)
            raise
        with self._guard:
            self._fd, self._count = fd, 1

    def __enter__(self) -> FileLock:
        """Wait for the lock however long it takes (the Dask node's store, in a thread)."""
        self.acquire(timeout=math.inf)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __del__(self) -> None:  # a lock nobody can release any more is given back
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def release(self) -> None:
        """Give one ``acquire`` back; the last one unlocks. Nothing held: nothing to do."""
        with self._guard:
            if self._fd is None:
                return
            self._count -= 1
            if self._count:
                return
            fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
