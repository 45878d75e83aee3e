"""The stat cache: what a file's content hashed to, keyed by its stat, as git's index does.

Who calls it: ``_hashing`` (every file a tree walk finds) and the Dask node, which records
the trees it lays out from blobs it has verified. Thread-safe; nothing here reads a file.

The key is (device, inode, size, mtime_ns, ctime_ns). Nothing a process can do to a file
keeps all five: a write moves mtime and ctime, ``utime`` (restoring an mtime) moves ctime,
a replace by rename gives another inode. Like git's "racy" check, a file changed less than
``RACY_NS`` before it was read is not recorded: a second write within the same timestamp
tick could otherwise keep the key and change the content.
"""

from __future__ import annotations

import os
import threading

#: Files whose ctime is this close to the moment they were read are not remembered.
RACY_NS = 1_000_000_000
_MAX = 500_000

Key = tuple[int, int, int, int, int]

__all__ = ["RACY_NS", "Key", "forget", "key_of", "known", "lookup", "record"]

_entries: dict[str, tuple[Key, str]] = {}
_lock = threading.Lock()


def key_of(st: os.stat_result) -> Key:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def lookup(path: str, st: os.stat_result) -> str | None:
    """The sha256 recorded for ``path`` if its stat is still ``st``'s, else None."""
    hit = _entries.get(path)  # a dict read is atomic under the GIL
    if hit is not None and hit[0] == key_of(st):
        return hit[1]
    return None


def known(path: str, key: Key) -> bool:
    """Whether a sha256 is recorded for ``path`` with the stat key ``key`` (``key_of``)."""
    hit = _entries.get(path)
    return hit is not None and hit[0] == key


def record(path: str, st: os.stat_result, sha256: str, read_at_ns: int) -> None:
    """Remember that ``path`` with stat ``st`` holds ``sha256``; ``read_at_ns`` is when the
    read began (``time.time_ns()``). Racy files are left out (see the module docstring)."""
    if st.st_ctime_ns >= read_at_ns - RACY_NS:
        return
    with _lock:
        if len(_entries) >= _MAX:
            _entries.clear()
        _entries[path] = (key_of(st), sha256)


def forget() -> None:
    """Drop everything (a new kernel's state; benchmarks' "first" runs)."""
    with _lock:
        _entries.clear()
