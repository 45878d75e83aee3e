"""Spare trees: the next version of a code tree laid out as the difference from the last.

Who calls it: ``_sources.create`` (``working_dir``, ``py_modules``: ``lay_out``, in a build
thread), ``_sources.digest`` (``new_layout``/``adopt``: a new tree laid out while it was
hashed at parse, ``_layout``, becomes its source's spare) and the undo of ``_store.attach``
(``drop``, through ``_store.detach_hooks``, when the agent stops, in a thread).

Each env gets its own copy of its trees (what a task writes there reaches no other env:
``_sources.env_uri``), one hard link per file; on ext4 a link costs 20-30 us, so a tree of a
thousand files costs 25-35 ms to lay out even when one byte of it changed. So after each
lay-out of a source, a spare copy of that version is laid out by a background thread in the
cache's ``tmp`` directory, where no worker, env or other build ever sees it. The next build
of that source takes the spare, renames it into its target and changes only what differs:
files whose content or mode changed are linked anew, files and directories that went are
removed, new ones made. Every file it keeps is checked as a new link's blob is (its inode
is untouched: the blob's stamp, size and mode), and linked anew if not; so the tree is the
one ``_store.materialize`` would have made. A spare still being laid out when its next
build comes is waited for (what is left of it is less than laying the tree out whole); one
not started yet is dropped.

When is a spare laid out: ``AFTER_S`` after its build if a core was free while it ran
(``_free``: nothing waited for a CPU for more than a quarter of the build's own time, by
the kernel's pressure count), else ``DEFER_S`` after it. Under load, made at
once, its links competed with the new env's first task for the cores (W5 one byte in one
process, rep by rep, at load 9: the build 41 -> 25 ms, the rest of the first task 28 -> 44
ms); a tenth of a second later they do not (the whole first task 56 vs 107 ms without
spares). On a free core it is ready for an edit that follows its build within ~30 ms (a
notebook's next cell; ``benchmarks/run.py``'s W5 one byte builds again ~35 ms after the last
build); a build that finds it still being laid out waits for the rest.
The first lay-out of a source gets a spare too: the first edit is the one a user waits for
first, and a spare is links only (no data; ``MAX_SPARES`` per process). The thread stays for
``IDLE_S`` after its last job: a thread started for each build's spare cost that build ~1.3
ms on its path (``Thread.start`` waits for the new thread to run, on a busy GIL).

A source's first tree, read whole at parse, is written as its own files (``_layout``), not
links: its build takes it as any spare and then hands it to ``_layout.defer_store``; the
thread puts those files in the store (``_layout.settle``) before it lays the next spare out
from the store, and every build settles the store before it reads it.
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from .._cpuload import cpu_waits, cpus, runnable
from ._blobs import BLOB_MTIME_NS, relative
from ._hashhelp import give_back, take_idle
from ._hashing import Tree
from ._layout import LayOut, StoreFile, defer_store, settle
from ._store import blob_dir, by_dir, detach_hooks, materialize, open_dir, place

__all__ = ["DEFER_S", "MAX_SPARES", "adopt", "drop", "lay_out", "new_layout", "spares"]

#: Spares kept per process (each is a directory of links: inodes of the blobs, no data).
MAX_SPARES = 8
#: How long the spares' thread waits for a next job before it ends.
IDLE_S = 30.0
#: How long after a build its spare is laid out when no core is free: the new env's first
#: task goes first.
DEFER_S = 0.1
#: How long after a build its spare is laid out when a core is free: the new env's first
#: task (the agent's last steps, a forked worker's start and first call: ~8 ms after the
#: lay-out here) goes first, and the spare (~15 ms of links) is still ready for an edit
#: ~35 ms after the build (``run.py``'s W5 one byte).
AFTER_S = 0.01
#: A spare of this many files or more is laid out by an idle hash helper (``_link_spare``).
HELPER_FROM = 128
#: How long a build waits for the spare being laid out for it before laying out its own.
_WAIT_S = 60.0

_Key = tuple[str, str]  # (store, family)


@dataclass(eq=False)
class _Spare:
    key: _Key
    cache_root: Path
    path: Path
    tree: Tree
    #: When (time.monotonic) the thread may lay it out.
    due: float = 0.0
    ready: bool = False
    #: Taken away from the thread: it removes the spare instead of offering it.
    dropped: bool = False
    #: Its files are the tree as written while it was hashed (``_layout``), not in the
    #: store yet: the build that takes it stores them after the env is ready. ``made``:
    #: each one's (inode, ctime_ns) as written (``_layout.Layer.made``).
    unstored: bool = False
    made: dict[str, tuple[int, int]] | None = None


_lock = threading.Lock()
_changed = threading.Condition(_lock)
_spares: dict[_Key, _Spare] = {}  # oldest first
_jobs: list[_Spare] = []  # to lay out (not dropped) or to remove (dropped)
_busy: list[_Spare] = []  # the one the thread works on
_thread: list[threading.Thread] = []


def lay_out(tree: Tree, cache_root: Path, target: Path, family: str) -> int:
    """Lay ``tree`` out at ``target`` (an empty directory), from the spare of ``family``
    (its source) when there is one; returns bytes newly stored. Raises what
    ``_store.materialize`` raises. A spare of ``tree`` is then made in the background for
    the next version of ``family``."""
    key = (store, family) = (str(blob_dir(cache_root)), family)
    # A tree of an earlier build still being put in the store (``_layout``): stored first
    # (here, or waiting for the thread), so this build finds the store as the old path
    # (store while hashing, then link) left it.
    settle(store)
    mark = _clock()
    stored: int | None = None
    spare = _take(key)
    if spare is not None:
        stored = _apply(spare, tree, target)
        if stored is not None and spare.unstored:
            # The files written at parse are now the env's: into the store after the env
            # is ready (the spares' thread, before the next spare's links need them).
            made = spare.made or {}
            entries = tree.entries

            def files() -> list[StoreFile]:
                return [
                    (e.rel, e.blob_name, e.size, e.mode, made[e.rel])
                    for e in entries
                    if e.rel in made  # (a file it changed was linked from the store)
                ]

            defer_store(store, files, str(target))
    if stored is None:
        stored = materialize(tree, cache_root, target)
    _offer(key, tree, cache_root, mark)
    return stored


def new_layout(store: str) -> LayOut:
    """Where ``hash_tree`` may lay a tree of the blob directory ``store`` out while it
    hashes it (``_layout``): a new spare's name in its cache's ``tmp``."""
    cache_root = Path(store).parent.parent  # blob_dir(cache_root) is <root>/shared/blobs
    return LayOut(str(cache_root / "tmp" / _spare_name()))


def adopt(store: str, family: str, tree: Tree, layout: LayOut) -> None:
    """Make ``layout`` (done: ``tree`` laid out while it was hashed) the spare of
    ``family``: its next build takes it, as it takes any spare."""
    cache_root = Path(store).parent.parent
    key = (store, family)
    spare = _Spare(
        key, cache_root, Path(layout.path), tree, ready=True, unstored=True, made=layout.made
    )
    with _lock:
        old = _spares.pop(key, None)
        if old is not None:
            _discard(old)
        _spares[key] = spare
        while len(_spares) > MAX_SPARES:
            _discard(_spares.pop(next(iter(_spares))))
        if _jobs:
            _start()


def _spare_name() -> str:
    return f"{os.getpid()}-spare-{uuid.uuid4().hex[:12]}"  # swept with this pid


def spares() -> list[tuple[str, str, bool]]:
    """(store, family, ready) of each spare of this process (for tests and benchmarks)."""
    with _lock:
        return [(s.key[0], s.key[1], s.ready) for s in _spares.values()]


def drop(store: str) -> None:
    """Remove the spares of ``store`` (a blob directory), waiting for one being laid out;
    called when the agent using that cache stops (blocking: in a thread)."""
    with _lock:
        gone = [_spares.pop(k) for k in [k for k in _spares if k[0] == store]]
        gone += [s for s in _jobs if s.key[0] == store and s not in gone]
        _jobs[:] = [s for s in _jobs if s.key[0] != store]
        for spare in gone:
            spare.dropped = True
        _changed.wait_for(lambda: not any(s.key[0] == store for s in _busy), _WAIT_S)
    for spare in gone:
        shutil.rmtree(spare.path, ignore_errors=True)
    settle(store)  # the trees built and not stored yet: the store outlives this agent


detach_hooks.append(drop)


def _forget_in_child() -> None:
    """A forked child has no spares thread and owns none of its parent's spares (their
    directories are the parent's to remove): it starts with none, and fresh locks (one the
    thread held at the fork would stay held for good)."""
    global _lock, _changed
    _lock = threading.Lock()
    _changed = threading.Condition(_lock)
    _spares.clear()
    _jobs.clear()
    _busy.clear()
    _thread.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def _take(key: _Key) -> _Spare | None:
    with _lock:
        spare = _spares.pop(key, None)
        if spare is None:
            return None
        if spare in _busy:
            _changed.wait_for(lambda: spare not in _busy, _WAIT_S)
        if not spare.ready:
            spare.dropped = True  # not started yet (the thread removes it) or failed (removed)
            return None
        return spare


def _offer(key: _Key, tree: Tree, cache_root: Path, mark: _Mark | None = None) -> None:
    due = time.monotonic() + (AFTER_S if _free(mark) else DEFER_S)
    with _lock:
        spare = _Spare(key, cache_root, cache_root / "tmp" / _spare_name(), tree, due)
        old = _spares.pop(key, None)
        if old is not None:
            _discard(old)
        _spares[key] = spare
        _jobs.append(spare)
        while len(_spares) > MAX_SPARES:
            _discard(_spares.pop(next(iter(_spares))))
        _start()


#: (time.monotonic(), the kernel's count of CPU waits in microseconds or None).
_Mark = tuple[float, "int | None"]
#: A build that waited for a CPU more than this share of its own time found no core free.
_WAITED_MAX = 0.25


def _clock() -> _Mark:
    return time.monotonic(), cpu_waits()


def _free(mark: _Mark | None) -> bool:
    """Whether a core is free for a spare: while the build that just ended ran (since
    ``mark``), tasks waited for a CPU less than ``_WAITED_MAX`` of the time (the kernel's
    pressure count, whoever they were); where the kernel keeps none, ``_idle``.

    Not the instant count alone: it counts this process's own threads that happen to run
    (the loop, a worker's reader), and on two cores it said "busy" at most builds of a
    quiet machine (2 runnable: the caller and one more), deferring the spare past the next
    edit of ``run.py``'s W5 one byte."""
    if mark is not None and mark[1] is not None:
        waited = cpu_waits()
        elapsed_us = (time.monotonic() - mark[0]) * 1e6
        if waited is not None and elapsed_us >= 500:
            return waited - mark[1] < _WAITED_MAX * elapsed_us
    return _idle()


def _idle() -> bool:
    """Whether a core is free now (``_cpuload``'s count of this instant, uncached: asked once
    per build). Unknown: not free."""
    count = runnable()
    # The count includes this thread: a core is free when fewer run than there are cores.
    return count is not None and count < cpus()


def _discard(spare: _Spare) -> None:
    """(Under the lock.) Drop ``spare``: the thread removes what it made of it."""
    spare.dropped = True
    if spare not in _jobs and spare not in _busy:
        _jobs.append(spare)


def _start() -> None:
    """(Under the lock.) Start the thread if it is not running, else wake it: a job due
    sooner than the one it waits for (a spare laid out at once after a deferred one, a
    removal) must not wait for that one's time."""
    if _thread:
        _changed.notify_all()
        return
    thread = threading.Thread(target=_run, name="jre-tree-spares", daemon=True)
    _thread.append(thread)
    thread.start()


def _run() -> None:
    while True:
        with _lock:
            spare = _next()
            if spare is None:
                _thread.clear()
                return
            _busy.append(spare)
        ok = False
        # A spare is an optimisation: whatever fails here (a full disk in the store step, a
        # blob gone), there is none this time, and the thread goes on to its next job (it
        # ended here before, and no spare was laid out again in this process).
        try:
            store = str(blob_dir(spare.cache_root))
            settle(store)  # the trees its builds wrote and did not store: the spare links them
            if not spare.dropped:
                _link_spare(spare.tree, store, spare.path)
                ok = True
        except Exception:
            ok = False
        with _lock:
            _busy.remove(spare)
            if ok and not spare.dropped:
                spare.ready = True
            else:
                spare.dropped = True
            _changed.notify_all()
        if spare.dropped:
            shutil.rmtree(spare.path, ignore_errors=True)


def _link_spare(tree: Tree, store: str, path: Path) -> None:
    """Lay ``tree`` out at ``path`` as links to its blobs, unchecked: the build that takes
    the spare checks every file it keeps (``_update``), so a touched blob linked here is
    replaced then. A blob gone fails the spare (``OSError``). A tree of ``HELPER_FROM``
    files or more is laid out by the hash helper when one is idle (``_hashhelp``): on this
    thread each ``link`` gave the GIL back and waited for it again while the driver parsed
    the next edit and the agent built it (a 1,000-file spare took 25-43 ms in run.py's W5
    one byte, 10-23 ms alone, and held the next edit's build back), and the helper runs
    on the other core."""
    os.makedirs(path.parent, exist_ok=True)
    helper = take_idle() if len(tree.entries) >= HELPER_FROM else None
    if helper is not None:
        links = [(relative(entry.blob_name), entry.rel) for entry in tree.entries]
        try:
            error = helper.link(store, str(path), tree.dirs, links)
        except BaseException:
            helper.stop(kill=True)  # before the caller removes what it made
            raise
        give_back(helper)
        if error is not None:
            raise OSError(error)
        return
    os.mkdir(path)
    link = os.link
    with open_dir(store) as store_fd, open_dir(str(path)) as root_fd:
        for rel_dir in tree.dirs:  # parents first
            os.mkdir(rel_dir, dir_fd=root_fd)
        for entry in tree.entries:
            link(relative(entry.blob_name), entry.rel, src_dir_fd=store_fd, dst_dir_fd=root_fd)


def _next() -> _Spare | None:
    """(Under the lock.) The next job once it is due (a removal is due at once); None when
    none came for ``IDLE_S``."""
    idle_until = time.monotonic() + IDLE_S
    while True:
        now = time.monotonic()
        for spare in _jobs:
            if spare.dropped or spare.due <= now:
                _jobs.remove(spare)
                return spare
        if not _jobs and now >= idle_until:
            return None
        _changed.wait((min(s.due for s in _jobs) if _jobs else idle_until) - now)


def _apply(spare: _Spare, tree: Tree, target: Path) -> int | None:
    """Make ``spare`` the tree ``tree`` at ``target``; bytes newly stored, or None when the
    spare could not be used (``target`` is then empty again, the spare gone)."""
    try:
        os.rename(spare.path, target)  # over the build's empty target
    except OSError:
        shutil.rmtree(spare.path, ignore_errors=True)
        return None
    if spare.unstored and spare.tree is tree:
        # Written by this process's hash of this very tree into its own files (no other
        # tree links them) in the cache's tmp, where nothing else writes: nothing to check.
        # All of it is new content (stored after the env is ready).
        return tree.size
    try:
        return _update(spare.tree, tree, str(blob_dir(spare.cache_root)), target)
    except OSError:
        # Start again from an empty target: the caller lays the tree out whole.
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        return None
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def _update(old_tree: Tree, tree: Tree, store: str, target: Path) -> int:
    old = {e.rel: e for e in old_tree.entries}
    new = {e.rel: e for e in tree.entries}
    old_dirs, new_dirs = set(old_tree.dirs), set(tree.dirs)
    stored = 0
    lstat, unlink = os.lstat, os.unlink
    with open_dir(store) as store_fd, open_dir(str(target)) as root_fd:
        for rel, entry in old.items():
            now = new.get(rel)
            # ``is``: a file no event named since the last hash is the same entry object.
            if now is not entry and (now is None or now.blob_name != entry.blob_name):
                unlink(rel, dir_fd=root_fd)
        for rel_dir in reversed(old_tree.dirs):  # children first (a prefix sorts first)
            if rel_dir not in new_dirs:
                os.rmdir(rel_dir, dir_fd=root_fd)
        for rel_dir in tree.dirs:  # parents first
            if rel_dir not in old_dirs:
                os.mkdir(rel_dir, dir_fd=root_fd)
        # Each file kept is checked with one ``lstat`` by its path from the root: one call
        # per file, as through a descriptor of its directory, without grouping 1,000 files
        # by directory first (~1 ms of the ~5 a check of 1,000 took here).
        missing = []
        for entry in tree.entries:
            was = old.get(entry.rel)
            if was is entry or (was is not None and was.blob_name == entry.blob_name):
                # The inode this spare linked: another env's task may have written through
                # its own link to it since (then it is no blob any more).
                st = lstat(entry.rel, dir_fd=root_fd)
                if (
                    st.st_mtime_ns == BLOB_MTIME_NS
                    and st.st_size == entry.size
                    and st.st_mode == _REGULAR | entry.mode
                ):
                    continue
                unlink(entry.rel, dir_fd=root_fd)
            missing.append(entry)
        for rel_dir, entries in by_dir(missing).items():
            with open_dir(rel_dir, root_fd) as dir_fd:
                for entry in entries:
                    stored += place(entry, store, store_fd, dir_fd, target)
    return stored


#: A regular file's type bits: with a blob's mode, the whole st_mode of an untouched blob
#: (``_blobs.valid``, inlined: it runs once per kept file).
_REGULAR = stat.S_IFREG
