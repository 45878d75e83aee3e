"""A new tree written while it is hashed, and put in the content store after its env is ready.

Who calls it: ``_hashing._hash_all`` (``Layer``, from its threads) for a caller that passes
``hash_tree`` a ``LayOut``: ``_sources`` at parse time, in the process of an agent, whose
``_spares.adopt`` then makes the lay-out the source's spare, which its build takes (renamed
into the env's target). That build then ``defer_store``-s the tree: the spares' thread links
its files into the store in the background (``settle``); ``_store.materialize``,
``_store.ensure_stored``, every build's ``_spares.lay_out`` and ``_spares.drop`` settle the
store first, so anything that reads the store sees it as if the files had been stored on
the path.

Why: the first tree of a source was written into the store (1,000 new blobs in 256 shard
directories) and then linked into the env's tree (1,000 more directory entries), on the path
to the env's first task, where ``cp -r`` makes one file per file. Now the hashing threads
write each file once, in the env's own directories, from the bytes they just hashed (one
read, sha256 in C on that buffer, one write: what ``cp -r`` does, plus the hash the env's
id needs), each file with a blob's read-only mode and stamp; linking those files into the
store (what lets later envs share them) comes after the env is ready.

What the background step trusts: a file of the env's tree is linked into the store as blob
``name`` only while it is as it was written: the inode and ctime it had then (any write,
chmod or utime moves the ctime; a rename over it, the inode) and a valid blob's stat
(``_blobs.valid``: regular, its size, mode and stamp), checked again on the blob after the
link (same inode, still valid; else the blob is removed). A SIGKILL at any point leaves blobs
that each hold their name's content, or no blob: nothing half-written (the files were whole
and stamped before the env was ready); only the rare replacement of a touched blob links a
temporary name first (``<blob>.<pid>.<hex>.tmp``, no blob's name: no build links it). The
stat cache (``_statcache``) is about the source files, in memory: nothing here touches it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from . import _blobs
from ._blobs import relative

__all__ = ["LayOut", "Layer", "defer_store", "pending", "settle"]

log = logging.getLogger("jupyter_runtimeenv")


@dataclass
class LayOut:
    """A directory (not there yet) where ``hash_tree`` writes the tree while it hashes it.
    ``done``: it did (every file of the tree was read by that call, and written there, each
    its own inode, not in the store yet); otherwise nothing is left at ``path``."""

    path: str
    done: bool = False
    #: (inode, ctime_ns) of each file as written (``Layer.made``), when ``done``.
    made: dict[str, tuple[int, int]] = field(default_factory=dict)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class Layer:
    """A ``LayOut`` being made: its directories first, then each file written by the hashing
    thread that read it (relative to a descriptor of the root). Each user (every hashing
    slice and the caller) lets go once with ``release``; the last one closes the descriptor,
    so none is closed under a file still being written. A failed write (a full disk) fails
    the lay-out, not the hash: the hash goes on and the build lays the tree out from the
    store, which then says what is wrong."""

    def __init__(self, path: str, root_fd: int, users: int) -> None:
        self.path = path
        self.root_fd = root_fd
        self.failed = False
        #: (inode, ctime_ns) of each file written whole, by relative path: the store step
        #: links a file only while it is still that (any write, chmod or utime since moves
        #: its ctime; a rename over it, its inode).
        self.made: dict[str, tuple[int, int]] = {}
        #: The directories made below the root (``add_dirs``).
        self.dirs: set[str] = set()
        self._users = users
        self._lock = threading.Lock()

    @classmethod
    def make(cls, path: str, rels: list[str], threads: int) -> Layer | None:
        """The lay-out's root and the directories of the files ``rels`` for ``threads``
        slices and the caller, or None (nothing left) if they cannot be made: it is an
        optimisation. (More files' directories: ``add_dirs``.)"""
        fd = -1
        try:
            os.mkdir(path)
            fd = os.open(path, _DIR_FLAGS)
            layer = cls(path, fd, threads + 1)
            layer.add_dirs(rels)
        except OSError:
            if fd >= 0:
                os.close(fd)
            shutil.rmtree(path, ignore_errors=True)
            return None
        return layer

    def add_dirs(self, rels: Iterable[str]) -> None:
        """Make the directories the files ``rels`` go in that are not made yet, parents
        first. ``OSError`` if one cannot be made (the caller fails the lay-out)."""
        for rel in rels:
            parent = rel.rpartition("/")[0]
            if not parent or parent in self.dirs:
                continue
            missing = []
            while parent and parent not in self.dirs:
                missing.append(parent)
                parent = parent.rpartition("/")[0]
            for rel_dir in reversed(missing):  # parents first
                os.mkdir(rel_dir, dir_fd=self.root_fd)
                self.dirs.add(rel_dir)

    def write(self, rel: str, data: bytes, mode: int) -> bool:
        """Write ``data`` (just hashed) as the file ``rel`` with the blob mode ``mode``;
        whether it did (False once the lay-out failed)."""
        fd = self.open(rel, mode)
        if fd is None:
            return False
        try:
            _blobs.write_all(fd, data)
        except OSError:
            self.close(fd, mode, ok=False, rel=rel)
            return False
        return self.close(fd, mode, ok=True, rel=rel)

    def open(self, rel: str, mode: int) -> int | None:
        """A new file ``rel`` to write in chunks (``close`` it), or None if the lay-out
        failed."""
        if self.failed:
            return None
        try:
            return _blobs.create_at(self.root_fd, rel, mode)
        except OSError:  # a full disk, too many files: no lay-out
            self.failed = True
            return None

    def close(self, fd: int, mode: int, *, ok: bool, rel: str, keep_going: bool = False) -> bool:
        """Close ``fd`` (the file ``rel`` of ``open``) stamped as a blob if ``ok``; whether
        it is whole. Not ok: the lay-out failed (it is removed when the last user lets go),
        unless ``keep_going`` (the caller removes that file and writes it again)."""
        try:
            if ok:
                _blobs.seal(fd, mode)
                st = os.fstat(fd)
                self.made[rel] = (st.st_ino, st.st_ctime_ns)
        except OSError:
            ok = False
        finally:
            os.close(fd)
        if not ok and not keep_going:
            self.failed = True
        return ok

    def release(self, ok: bool) -> bool:
        """Let go (``ok``: this user's part went well); returns whether the lay-out is whole
        so far. The last user closes it, and removes it unless it is whole."""
        with self._lock:
            if not ok:
                self.failed = True
            self._users -= 1
            last = self._users == 0
            whole = not self.failed
        if last:
            os.close(self.root_fd)
            if not whole:
                shutil.rmtree(self.path, ignore_errors=True)
        return whole


#: (relative path, blob name, size, blob mode, (inode, ctime_ns) as written) of each file of
#: a tree to store.
StoreFile = tuple[str, str, int, int, tuple[int, int]]


@dataclass(eq=False)
class _Step:
    """A tree whose files are to be linked into the store ``store``: the directory is held
    by a descriptor, so the agent's rename of the build's target into place does not lose
    it, and its removal makes the step find nothing (and store nothing)."""

    store: str
    #: The files, made when the step runs (``defer_store``).
    files: Callable[[], list[StoreFile]]
    dir_fd: int
    root: str
    busy: bool = False


_lock = threading.Lock()
_changed = threading.Condition(_lock)
_steps: list[_Step] = []


def defer_store(store: str, files: Callable[[], list[StoreFile]], root: str) -> None:
    """Link the files of the tree at ``root`` (written by a ``Layer``, renamed into an
    env's target) into the blob directory ``store`` later: on the spares' thread after the
    env is ready, or in the first ``settle`` of that store. Nothing if ``root`` is gone.
    ``files`` makes their list then (a build's lay-out is on its env's path; the list of
    1,000 files with their blob names was ~0.5 of its ~1.2 ms)."""
    try:
        dir_fd = os.open(root, _DIR_FLAGS)
    except OSError:
        return
    with _lock:
        _steps.append(_Step(store, files, dir_fd, root))


def pending(store: str | None = None) -> int:
    """How many trees wait to be stored (into ``store``, or any): for tests."""
    with _lock:
        return sum(1 for s in _steps if store is None or s.store == store)


def settle(store: str) -> None:
    """Store every tree waiting for the blob directory ``store``, here or by waiting for the
    thread doing it: afterwards the store holds what the old path (store, then link) would
    have stored. Blocking; never raises for the store's sake (a full disk is logged: the
    trees built later copy what the store lacks, and meet the disk there)."""
    with _lock:
        mine = [s for s in _steps if s.store == store and not s.busy]
        for step in mine:
            step.busy = True
    for step in mine:
        _run(step)
    with _lock:
        _changed.wait_for(lambda: not any(s.store == store and s.busy for s in _steps), 60.0)


def _run(step: _Step) -> None:
    try:
        _store_tree(step)
    except OSError as exc:  # the store itself cannot be opened or made
        log.warning("the files of %s were not put in the content store: %s", step.root, exc)
    finally:
        os.close(step.dir_fd)
        with _lock:
            step.busy = False
            with contextlib.suppress(ValueError):
                _steps.remove(step)
            _changed.notify_all()


_FULL = (errno.ENOSPC, errno.EDQUOT)


def _store_tree(step: _Step) -> None:
    try:
        store_fd = os.open(step.store, _DIR_FLAGS)
    except FileNotFoundError:
        os.makedirs(step.store, exist_ok=True)
        store_fd = os.open(step.store, _DIR_FLAGS)
    files = step.files()
    try:
        for i, (rel, name, size, mode, made) in enumerate(files):
            try:
                _link_in(step.dir_fd, rel, store_fd, name, size, mode, made)
            except OSError as exc:
                if exc.errno in _FULL:
                    log.warning(
                        "the content store %s is full (%s): %d of the %d files of %s were"
                        " not put in it; the env is whole, and trees built later store"
                        " what it lacks then",
                        step.store,
                        errno.errorcode.get(exc.errno or 0, exc.errno),
                        len(files) - i,
                        len(files),
                        step.root,
                    )
                    return
                if exc.errno in (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EMLINK):
                    return  # no links there: the store gets copies when a build needs them
                # Anything else (the env removed meanwhile, a file gone): that file only.
    finally:
        os.close(store_fd)


def _link_in(
    dir_fd: int, rel: str, store_fd: int, name: str, size: int, mode: int, made: tuple[int, int]
) -> None:
    """Link the env's file ``rel`` into the store as blob ``name``, if it is as written
    (``made``: its inode and ctime then) and the store lacks a valid blob of that name."""
    try:
        st = os.lstat(rel, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if (st.st_ino, st.st_ctime_ns) != made or not _blobs.valid(st, size, mode):
        # Written, chmod-ed or stamped since (a task's copy2 over it keeps size, mode and
        # mtime, not ctime), or another file: not the content it was hashed with.
        return
    blob = relative(name)
    try:
        try:
            os.link(rel, blob, src_dir_fd=dir_fd, dst_dir_fd=store_fd, follow_symlinks=False)
        except FileNotFoundError:
            # Its shard directory not made yet (a store the agent did not ``prepare``), or
            # the file gone (then the second link fails as the first: that file only).
            with contextlib.suppress(FileExistsError):
                os.mkdir(name[:2], dir_fd=store_fd)
            os.link(rel, blob, src_dir_fd=dir_fd, dst_dir_fd=store_fd, follow_symlinks=False)
    except FileExistsError:
        try:
            there = os.lstat(blob, dir_fd=store_fd)
        except FileNotFoundError:
            there = None
        if there is not None and _blobs.valid(there, size, mode):
            return  # stored before (another tree, an equal file of this one)
        # A touched blob: replaced whole by this file (a concurrent link sees one or the
        # other, each with that content).
        tmp = f"{blob}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        os.link(rel, tmp, src_dir_fd=dir_fd, dst_dir_fd=store_fd, follow_symlinks=False)
        try:
            _check(tmp, store_fd, st, size, mode)
            os.rename(tmp, blob, src_dir_fd=store_fd, dst_dir_fd=store_fd)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=store_fd)
        return
    _check(blob, store_fd, st, size, mode)


class _Moved(OSError):
    """The file changed between its check and its link (internal)."""


def _check(blob: str, store_fd: int, st: os.stat_result, size: int, mode: int) -> None:
    """The link just made is the inode checked and still valid; if that inode was written
    between the check and the link (its mtime moved), it leaves the store. (Another inode
    there is another storer's, stored whole under its name: left alone.) A write in those
    microseconds that also restores the stamp is not seen here: the trust the store gives
    any blob (``_blobs.valid``) and that ``workers/_cow.py`` guards once the file is shared."""
    now = os.lstat(blob, dir_fd=store_fd)
    ours = now.st_ino == st.st_ino and now.st_dev == st.st_dev
    if ours and not _blobs.valid(now, size, mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(blob, dir_fd=store_fd)
        raise _Moved(errno.ESTALE, f"{blob} changed while it was stored")


def _forget_in_child() -> None:
    """A forked child (a worker) stores nothing of its parent's: it closes the parent's
    descriptors and starts with fresh locks."""
    global _lock, _changed
    for step in _steps:
        with contextlib.suppress(OSError):
            os.close(step.dir_fd)
    _steps.clear()
    _lock = threading.Lock()
    _changed = threading.Condition(_lock)


os.register_at_fork(after_in_child=_forget_in_child)
