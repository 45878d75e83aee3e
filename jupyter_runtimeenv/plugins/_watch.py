"""Which trees changed since they were last walked, from inotify, without a walk.

Who calls it: ``_hashing.hash_tree`` (is a remembered tree still as it was?) and
``_changes`` (which files of an env's tree did a task write?). Thread-safe; blocking calls
are non-blocking reads of one descriptor.

One inotify instance per process (``max_user_instances`` is small), one watch per directory
of a watched tree, added *before* the directory is listed, so that a change after the listing
is always an event. The kernel queues an event before the writing call returns, so a change
made before a call starts is seen by that call. Where inotify cannot be trusted the caller
walks, as it would without it: not Linux, a file system that is not local (a network or FUSE
mount changes behind the kernel's back), a tree holding symlinked or hard-linked files (a write
through a path outside the tree is an event there), no watch left (``max_user_watches``),
or a queue overflow. Writes through ``mmap`` make no event; they are not what editors do.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import struct
import sys
import threading
from collections.abc import Callable, Iterable

_IN_MODIFY = 0x2
_IN_ATTRIB = 0x4
_IN_CLOSE_WRITE = 0x8
_IN_MOVED_FROM = 0x40
_IN_MOVED_TO = 0x80
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_IN_ONLYDIR = 0x1000000
_IN_DONT_FOLLOW = 0x2000000
_IN_ISDIR = 0x40000000
_MASK = (
    _IN_MODIFY
    | _IN_ATTRIB
    | _IN_CLOSE_WRITE
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
    | _IN_ONLYDIR
    | _IN_DONT_FOLLOW
)
_EVENT = struct.Struct("iIII")
#: A watched directory moved or was deleted (its events stop or name its old path).
IN_MOVE_SELF, IN_DELETE_SELF = _IN_MOVE_SELF, _IN_DELETE_SELF
#: File systems whose changes all go through this kernel (inotify sees every one).
LOCAL_FS = frozenset(
    [
        "ext2",
        "ext3",
        "ext4",
        "xfs",
        "btrfs",
        "tmpfs",
        "ramfs",
        "overlay",
        "zfs",
        "f2fs",
        "bcachefs",
        "jfs",
        "reiserfs",
        "nilfs2",
    ]
)

__all__ = ["IN_DELETE_SELF", "IN_MOVE_SELF", "LOCAL_FS", "Watch", "watch"]

#: Called with (directory, name, mask) for each event of a watch.
Listener = Callable[[str, str, int], None]


class Watch:
    """The directories of one tree. ``changed`` turns True at the first event in any of them
    (or when the kernel drops events); ``listener`` sees every event."""

    def __init__(self, watcher: _Watcher, listener: Listener | None) -> None:
        self._watcher = watcher
        self.listener = listener
        self.changed = False
        self.usable = True
        self.wds: dict[int, str] = {}

    def add(self, directory: str) -> bool:
        """Watch ``directory`` (call before listing it); False if it cannot be watched (the
        watch is then not usable: walk)."""
        if self.usable and not self._watcher.add(self, directory):
            self.usable = False
        return self.usable

    def unchanged(self) -> bool:
        """No event since the watch was armed (reads what the kernel queued so far)."""
        self._watcher.poll()
        return self.usable and not self.changed

    def poll(self) -> None:
        self._watcher.poll()

    @property
    def lock(self) -> threading.RLock:
        """Held while events are dispatched to listeners (re-entrant: ``poll`` may run
        under it)."""
        return self._watcher.lock

    def close(self) -> None:
        self._watcher.remove(self)
        self.usable = False


class _Watcher:
    def __init__(self, fd: int, libc: ctypes.CDLL) -> None:
        self.fd = fd
        self._libc = libc
        self.lock = threading.RLock()
        self._by_wd: dict[int, set[Watch]] = {}

    def add(self, owner: Watch, directory: str) -> bool:
        with self.lock:
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(directory), _MASK)
            if wd < 0:
                return False  # ENOSPC (no watch left), EACCES, ENOENT (gone meanwhile)
            self._by_wd.setdefault(wd, set()).add(owner)
            owner.wds[wd] = directory
            return True

    def remove(self, owner: Watch) -> None:
        with self.lock:
            for wd in owner.wds:
                owners = self._by_wd.get(wd)
                if owners is None:
                    continue
                owners.discard(owner)
                if not owners:
                    del self._by_wd[wd]
                    self._libc.inotify_rm_watch(self.fd, wd)
            owner.wds.clear()

    def poll(self) -> None:
        with self.lock:
            while True:
                try:
                    data = os.read(self.fd, 65536)
                except BlockingIOError:
                    return
                except OSError as exc:
                    if exc.errno == errno.EINTR:
                        continue
                    raise
                self._dispatch(data)

    def _dispatch(self, data: bytes) -> None:
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, size = _EVENT.unpack_from(data, offset)
            raw = data[offset + _EVENT.size : offset + _EVENT.size + size]
            offset += _EVENT.size + size
            name = os.fsdecode(raw.split(b"\0", 1)[0])
            if mask & _IN_Q_OVERFLOW:
                for owners in self._by_wd.values():
                    for owner in owners:
                        owner.usable = False
                continue
            for owner in list(self._by_wd.get(wd, ())):
                owner.changed = True
                if mask & _IN_IGNORED:  # the directory is gone: events from it stop
                    owner.usable = False
                    continue
                if owner.listener is not None:
                    owner.listener(owner.wds.get(wd, ""), name, mask)
            if mask & _IN_IGNORED:
                self._by_wd.pop(wd, None)


_instance: _Watcher | None = None
_failed = False
_lock = threading.Lock()


def watch(root: str, listener: Listener | None = None) -> Watch | None:
    """A new, empty watch for the tree at ``root``; None where inotify cannot be trusted
    (see the module docstring) or is not available."""
    if not local_fs(root):
        return None
    watcher = _watcher()
    return None if watcher is None else Watch(watcher, listener)


def _watcher() -> _Watcher | None:
    global _instance, _failed
    with _lock:
        if _instance is not None or _failed:
            return _instance
        _failed = True
        if not sys.platform.startswith("linux"):
            return None
        try:
            libc = _libc()
            libc.inotify_init1.argtypes = [ctypes.c_int]
            libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            return None  # EMFILE: no inotify instance left for this user
        _instance, _failed = _Watcher(fd, libc), False
        return _instance


def _libc() -> ctypes.CDLL:
    # The process's own symbols first: find_library runs ldconfig or a compiler (~20 ms).
    for name in (None, "libc.so.6"):
        try:
            libc = ctypes.CDLL(name, use_errno=True)
            libc.inotify_init1  # noqa: B018 - raises AttributeError if not there
            return libc
        except (OSError, AttributeError):
            continue
    # Imported here: ctypes.util imports subprocess, tempfile and shutil (~3-5 ms of every
    # cached CLI build of a tree spec), and the two names above find libc on Linux.
    from ctypes.util import find_library

    return ctypes.CDLL(find_library("c"), use_errno=True)


_fs_types: dict[str, str] = {}


def local_fs(path: str) -> bool:
    """Whether ``path`` is on a file system this kernel sees every change of."""
    return _fs_type(os.path.realpath(path)) in LOCAL_FS


def _fs_type(path: str) -> str:
    mounts = _mounts()
    best, kind = "", ""
    for point, fs in mounts.items():
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
            best, kind = point, fs
    return kind


def _mounts() -> dict[str, str]:
    if not _fs_types:
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
                _fs_types.update(parse_mountinfo(f))
        except OSError:
            pass
    return _fs_types


def parse_mountinfo(lines: Iterable[str]) -> dict[str, str]:
    """Mount point -> file system type, from the lines of ``/proc/self/mountinfo``."""
    out = {}
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) > 4 and rest:
            out[re.sub(r"\\([0-7]{3})", _octal, fields[4])] = rest[0]
    return out


def _octal(match: re.Match[str]) -> str:
    return chr(int(match.group(1), 8))  # mountinfo writes " " as "\\040"
