"""Files a task writes in its working directory: which, and copies of them next to the notebook.

Who calls it: the executors (``LocalExecutor`` in this process, the Dask node agent on its
node) after each task of an env that has a ``working_dir``, before the task's future is
settled. Blocking (a few ``stat`` calls; copies when asked).

A task's working directory is its env's own copy of the ``working_dir`` (see
``workers/_cow.py``): what it writes there stays there, which surprises whoever wrote
``df.to_csv("results.csv")`` in a cell moved to a worker. So after each task the files
created or changed there since the previous look are listed (one line in the task's output),
and those matching ``files_out`` patterns (gitignore-style, ``*.csv``, ``out/``) are copied
back beside the notebook (the submitting process's working directory), by content.

``TreeChanges`` knows what changed from inotify events on the tree's directories (a task that
writes nothing costs one non-blocking read), else from a walk: names it had not seen are
created; files no longer shared with the content store (a write makes a private copy) whose
ctime moved since the last look are changed.
"""

from __future__ import annotations

import os
import stat
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..context import EnvContext
from ..plugins import _blobs, _watch
from ..plugins._hashing import DEFAULT_EXCLUDES, blob_name, store_file
from ..plugins._sources import TREES_VAR
from ..plugins._store import blob_dir, blob_path
from ..spec.patterns import PatternList

_IN_ISDIR = 0x40000000
_DIR_ADDED = 0x100 | 0x80  # IN_CREATE | IN_MOVED_TO
#: Directories never reported or descended into (Python's own, checkpoints, VCS).
_SKIP_DIRS = frozenset(d.rstrip("/") for d in DEFAULT_EXCLUDES)
#: How many names the one-line report shows before "and N more".
SHOWN = 8

__all__ = [
    "SHOWN",
    "FilesWritten",
    "TreeChanges",
    "arm",
    "changes_in",
    "copy_back",
    "place",
    "store_selected",
    "take",
]


@dataclass(frozen=True)
class FilesWritten:
    """What one task left in its working directory (paths relative to it)."""

    directory: str
    created: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    #: The files copied back, and where to; why they could not be.
    copied: tuple[str, ...] = ()
    destination: str = ""
    error: str = ""

    def __bool__(self) -> bool:
        return bool(self.created or self.changed)

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "created": list(self.created),
            "changed": list(self.changed),
            "deleted": list(self.deleted),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FilesWritten:
        def names(key: str) -> tuple[str, ...]:
            return tuple(str(n) for n in data.get(key, ()))

        return cls(
            str(data.get("directory", "")), names("created"), names("changed"), names("deleted")
        )

    @property
    def written(self) -> tuple[str, ...]:
        return tuple(sorted({*self.created, *self.changed}))

    def line(self) -> str:
        """One line for the task's output: what it wrote, what came back, how to get the rest."""
        written = self.written
        shown = ", ".join(written[:SHOWN]) + (
            f" and {len(written) - SHOWN} more" if len(written) > SHOWN else ""
        )
        if self.error:
            return f"wrote {shown} in its working dir; could not copy them back: {self.error}"
        if self.copied:
            rest = len(written) - len(self.copied)
            tail = f"; {rest} more stayed there" if rest > 0 else ""
            where = self.destination or "."
            return f"wrote {shown} in its working dir; copied {len(self.copied)} to {where}{tail}"
        return (
            f"wrote {shown} in its env's copy of the working dir, not beside the notebook"
            " (files_out=[patterns] or %%remote --files-out PATTERN copies them back)"
        )


class TreeChanges:
    """The files of one tree that changed between two ``take()`` calls."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self._lock = threading.Lock()
        # Events arrive from whichever thread reads the process's inotify queue.
        self._events_lock = threading.Lock()
        self._names: set[str] = set()
        self._touched: set[str] = set()
        self._new_dirs: set[str] = set()
        self._gone_dirs: set[str] = set()
        self._last_ns = time.time_ns()
        self._watch = _watch.watch(self.root, self._event)
        self._names = set(self._scan("", arm=self._watch is not None))
        #: Without events: each file's (inode, size, mtime, ctime, shared) at the last look.
        self._stats = self._stat_all(self._names) if self._watch is None else {}

    def take(self) -> FilesWritten:
        """What changed since the last call (or since this object was made)."""
        with self._lock:
            if self._watch is not None:
                self._watch.poll()
            if self._watch is not None and self._watch.usable:
                written = self._from_events()
                self._last_ns = time.time_ns()
                return written
            return self._from_walk()

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()

    # -- events -------------------------------------------------------------------------

    def _event(self, directory: str, name: str, mask: int) -> None:
        if name in _SKIP_DIRS or ".jre-cow-" in name or not name:
            return
        rel = os.path.relpath(os.path.join(directory, name), self.root)
        with self._events_lock:
            if mask & _IN_ISDIR:
                (self._new_dirs if mask & _DIR_ADDED else self._gone_dirs).add(rel)
            else:
                self._touched.add(rel)

    def _from_events(self) -> FilesWritten:
        with self._events_lock:
            touched, self._touched = self._touched, set()
            gone, self._gone_dirs = self._gone_dirs, set()
            new, self._new_dirs = self._new_dirs, set()
        for rel in gone:
            touched.update(n for n in self._names if n.startswith(rel + "/"))
        for rel in new:
            touched.update(self._scan(rel, arm=True))
        created, changed, deleted = [], [], []
        for rel in touched:
            now = _is_file(os.path.join(self.root, rel))
            before = rel in self._names
            if now and not before:
                created.append(rel)
                self._names.add(rel)
            elif now:
                changed.append(rel)
            elif before:
                deleted.append(rel)
                self._names.discard(rel)
        return FilesWritten(
            self.root, tuple(sorted(created)), tuple(sorted(changed)), tuple(sorted(deleted))
        )

    # -- walks --------------------------------------------------------------------------

    def _scan(self, rel_dir: str, *, arm: bool) -> list[str]:
        """The files below ``rel_dir``; with ``arm``, each directory is watched before it is
        listed (a file written after the listing is an event)."""
        found: list[str] = []
        stack = [rel_dir]
        while stack:
            current = stack.pop()
            path = os.path.join(self.root, current) if current else self.root
            if arm and self._watch is not None and not self._watch.add(path):
                arm = False  # no watch left: the walk takes over (``usable`` is False)
            try:
                entries = list(os.scandir(path))
            except OSError:
                continue
            for entry in entries:
                rel = f"{current}/{entry.name}" if current else entry.name
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in _SKIP_DIRS:
                        stack.append(rel)
                elif ".jre-cow-" not in entry.name and entry.is_file(follow_symlinks=False):
                    found.append(rel)
        return found

    def _stat_all(self, rels: Iterable[str]) -> dict[str, tuple[int, int, int, int, bool]]:
        out = {}
        for rel in rels:
            try:
                st = os.lstat(os.path.join(self.root, rel))
            except OSError:
                continue
            out[rel] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_nlink > 1)
        return out

    def _from_walk(self) -> FilesWritten:
        now = self._stat_all(self._scan("", arm=False))
        if self._watch is not None and not self._stats:
            return self._after_overflow(now)
        created = sorted(set(now) - set(self._stats))
        changed = []
        for rel in sorted(set(now) & set(self._stats)):
            ino, size, mtime, ctime, shared = self._stats[rel]
            new = now[rel]
            # A file shared with the store gets a new ctime whenever another tree links the
            # same blob: only an unshared file's ctime tells a write (or a chmod).
            if (ino, size, mtime) != new[:3] or (not shared and not new[4] and ctime != new[3]):
                changed.append(rel)
        deleted = sorted(set(self._stats) - set(now))
        self._stats, self._names = now, set(now)
        return FilesWritten(self.root, tuple(created), tuple(changed), tuple(deleted))

    def _after_overflow(self, now: dict[str, tuple[int, int, int, int, bool]]) -> FilesWritten:
        """The kernel dropped events (a task wrote thousands of files): what is known from
        names and times: new names are created; a file no longer shared with the store whose
        ctime is after the last look was written (a coarse clock: a tick of margin)."""
        since = self._last_ns - 20_000_000
        created = sorted(set(now) - self._names)
        changed = sorted(
            rel
            for rel, (_i, _s, _m, ctime, shared) in now.items()
            if rel in self._names and not shared and ctime >= since
        )
        deleted = sorted(self._names - set(now))
        self._stats, self._names = now, set(now)
        return FilesWritten(self.root, tuple(created), tuple(changed), tuple(deleted))


def _is_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


_trees: dict[str, TreeChanges] = {}
_trees_lock = threading.Lock()


def changes_in(root: str) -> TreeChanges:
    """The process's ``TreeChanges`` of the tree at ``root`` (made, and its state taken, at
    the first call: call it before the env's first task)."""
    root = os.path.abspath(root)
    with _trees_lock:
        found = _trees.get(root)
        if found is None:
            found = _trees[root] = TreeChanges(root)
            while len(_trees) > 256:  # envs come and go in a long session
                _trees.pop(next(iter(_trees))).close()
        return found


def matching(rels: Iterable[str], patterns: Sequence[str]) -> list[str]:
    """The paths of ``rels`` that gitignore-style ``patterns`` select (``*.csv``: at any
    depth; ``out/``: all below ``out``; ``/a.txt``: at the top only)."""
    selector = PatternList.from_lines(patterns)
    out = []
    for rel in rels:
        parts = rel.split("/")
        dirs = ["/".join(parts[:i]) for i in range(1, len(parts))]
        if selector.match(rel, False) or any(selector.match(d, True) for d in dirs):
            out.append(rel)
    return out


def copy_back(written: FilesWritten, patterns: Sequence[str], destination: str) -> FilesWritten:
    """Copy the written files that ``patterns`` select from the task's working directory to
    ``destination`` (same relative paths; each replaced whole, never half-written)."""
    chosen = matching(written.written, patterns)
    for rel in chosen:
        _copy_file(os.path.join(written.directory, rel), os.path.join(destination, rel))
    return FilesWritten(
        written.directory,
        written.created,
        written.changed,
        written.deleted,
        tuple(chosen),
        destination,
    )


def _copy_file(source: str, dest: str) -> None:
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    tmp = f"{dest}.{uuid.uuid4().hex[:8]}.part"
    src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(src)
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            while chunk := os.read(src, 1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(dst, view) :]
            os.fchmod(dst, stat.S_IMODE(st.st_mode) | 0o200)
        finally:
            os.close(dst)
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    finally:
        os.close(src)


def arm(ctx: EnvContext) -> None:
    """Take the state of ``ctx``'s working directory if it is an env's tree (when the env
    was acquired, before any of its tasks runs)."""
    if ctx.cwd and TREES_VAR in ctx.env_vars:
        changes_in(ctx.cwd)


def take(ctx: EnvContext | None) -> FilesWritten | None:
    """What changed in ``ctx``'s tree since the last look; None if it has none."""
    if ctx is None or not ctx.cwd or TREES_VAR not in ctx.env_vars:
        return None
    return changes_in(ctx.cwd).take()


def store_selected(
    written: FilesWritten, patterns: Sequence[str], cache_root: Path
) -> list[list[Any]]:
    """Store the written files ``patterns`` select in ``cache_root``'s blob store (one
    read each: hashed and stored); their listing ``[rel, mode, size, sha256]`` (a Dask node,
    for the driver to fetch them by content)."""
    store = blob_dir(cache_root)
    listing = []
    for rel in matching(written.written, patterns):
        path = os.path.join(written.directory, rel)
        try:
            entry = store_file(path, store, rel)
        except OSError:
            continue  # gone again meanwhile
        listing.append([entry.rel, entry.mode, entry.size, entry.sha256])
    return listing


def place(listing: Sequence[Sequence[Any]], cache_root: Path, destination: str) -> tuple[str, ...]:
    """Copy the listed files from ``cache_root``'s blob store to ``destination``."""
    placed = []
    for rel, mode, _size, sha in listing:
        rel = str(rel)
        if rel.startswith("/") or ".." in rel.split("/"):
            continue  # names come from a node: never outside the destination
        blob = blob_path(cache_root, blob_name(str(sha), int(mode)))
        _copy_file(str(blob), os.path.join(destination, rel))
        placed.append(rel)
    return tuple(placed)


def lacking(listing: Sequence[Sequence[Any]], cache_root: Path) -> list[str]:
    """The blob names of ``listing`` that ``cache_root``'s store does not hold intact."""
    store = str(blob_dir(cache_root))
    out = []
    for _rel, mode, size, sha in listing:
        name = blob_name(str(sha), int(mode))
        if not _blobs.verify(store, name, str(sha), int(size), int(mode)):
            out.append(name)
    return out


def with_copies(
    written: FilesWritten, copied: Sequence[str], destination: str, error: str = ""
) -> FilesWritten:
    return replace(written, copied=tuple(copied), destination=destination, error=error)
