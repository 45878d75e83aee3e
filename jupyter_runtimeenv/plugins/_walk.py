"""The walk behind ``_hashing.hash_tree``: which files of a tree count, and what changed.

Who calls it: ``_hashing`` only. Everything here blocks (it lists and stats).

A walk applies the spec's patterns and every ``.gitignore`` (linear-time matchers from
``spec.patterns``), keeps each directory's listing and what it kept of it, and counts bytes
against the caller's limit. The next walk of the same tree is told which directories the
tree's inotify watch saw events in (``Dirty``): it lists only those again, and keeps what
it kept of any other directory whose ``.gitignore`` files above are unchanged.
"""

from __future__ import annotations

import heapq
import os
import stat
from collections.abc import Callable, Iterable

from ..errors import SpecError
from ..spec.patterns import PatternError, PatternList
from . import _statcache, _watch

#: A ``.gitignore`` larger than this, or with more patterns, is refused (``PatternError``).
MAX_GITIGNORE_BYTES = 1 << 20
MAX_GITIGNORE_PATTERNS = 10_000

__all__ = [
    "MAX_GITIGNORE_BYTES",
    "MAX_GITIGNORE_PATTERNS",
    "Child",
    "Dirty",
    "Found",
    "Kept",
    "Listing",
    "Matcher",
    "Walk",
    "ignored",
    "matcher",
]


# (base dir, patterns, whether any pattern can match a file): patterns ending in "/" match
# directories only, and excluded directories are pruned, so files skip those lists. The
# first matcher of a walk is the spec's (default excludes + ``excludes``); the others are
# ``.gitignore`` files, deeper last.
Matcher = tuple[str, PatternList, bool]


def matcher(base: str, lines: Iterable[str]) -> Matcher:
    # Linear-time matching, no regular expression (``spec.patterns``): a pattern can never
    # make a walk backtrack for minutes while holding the GIL.
    patterns = PatternList.from_lines(lines)
    return (base, patterns, patterns.files_too)


def _read_gitignore(path: str) -> list[str] | None:
    """The lines of the ``.gitignore`` at ``path``; None if there is none, or if it is not a
    regular file: like git (2.32+), a symlinked ``.gitignore`` is not followed, and a FIFO or
    device is never opened for a blocking read. ``PatternError`` past the bounds."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        return None  # absent, a symlink (ELOOP), unreadable
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = f.read(MAX_GITIGNORE_BYTES + 1)
    if len(data) > MAX_GITIGNORE_BYTES:
        raise PatternError(f"{path} is larger than {MAX_GITIGNORE_BYTES} bytes")
    lines = [line for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    if len(lines) > MAX_GITIGNORE_PATTERNS:
        raise PatternError(f"{path}: {len(lines)} patterns, more than {MAX_GITIGNORE_PATTERNS}")
    return lines


#: A file the walk kept: its relative path (with the prefix), its path, its stat's key
#: (``_statcache.key_of``: size and ctime are in it) and its ``st_mode``. Kept for the next
#: walk, so no ``os.stat_result`` (~0.6 KB each): ``Walk.stats`` has this walk's.
Found = tuple[str, str, _statcache.Key, int]
#: A directory entry as listed: its name, whether it is a directory, whether a symlink.
Child = tuple[str, bool, bool]
#: A directory's ``.gitignore`` lines (None: none) and its entries in name order.
Listing = tuple["list[str] | None", "list[Child]"]
#: What a walk kept of one directory, in name order: a file as its ``Found``, a
#: subdirectory as its path relative to the root.
Kept = list["Found | str"]


class Walk:
    """The files of a tree after excludes, with their stats; counts bytes as it goes and
    stops at ``limit`` (``SpecError`` naming ``field`` and the largest files seen).

    ``before`` is the last walk of the same tree (its ``listings`` and what it ``kept`` of
    each directory) and ``changed`` the directories its watch has seen an event in since
    (``Dirty``): the others are not listed or stat'ed again, and one whose ``.gitignore``
    files are the same as then keeps what it kept, so one changed file costs the listing of
    its own directory, not the tree's."""

    def __init__(
        self,
        root: str,
        limit: int | None,
        field: str,
        hint: str,
        before_scan: Callable[[str], object] | None = None,
        before: tuple[dict[str, Listing], dict[str, Kept]] | None = None,
        changed: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        self.root = root
        self.previous, self.kept_before = before if before is not None else ({}, {})
        self.changed = changed
        #: Every directory's listing as this walk saw it (for the next walk to reuse).
        self.listings: dict[str, Listing] = {}
        self.kept: dict[str, Kept] = {}
        #: How many directories this walk listed (the others came from ``before``).
        self.scanned = 0
        #: Called with each directory before it is read (a watch is added there first).
        self.before_scan = before_scan
        #: Whether a file was reached through a symlink or has other hard links: a change
        #: to it can come through a path outside the tree (no event in the tree).
        self.linked = False
        self.limit = limit
        self.field = field
        self.hint = hint
        self.found: list[Found] = []
        #: The stat of each file this walk stat'ed (those of directories it listed again).
        self.stats: dict[str, os.stat_result] = {}
        self.total = 0

    @property
    def signature(self) -> list[tuple[str, _statcache.Key]]:
        """(relative path, stat key) of each file: what identifies an unchanged tree."""
        return [(rel, key) for rel, _, key, _ in self.found]

    def file(self, rel: str, path: str, st: os.stat_result) -> Found:
        found = (rel, path, _statcache.key_of(st), st.st_mode)
        self.stats[path] = st
        self.add(found)
        return found

    def add(self, found: Found) -> None:
        self.found.append(found)
        self.total += found[2][2]
        if self.limit is not None and self.total > self.limit:
            largest = ", ".join(
                f"{rel} ({_mb(key[2])})"
                for rel, _, key, _ in heapq.nlargest(5, self.found, key=lambda f: f[2][2])
            )
            raise SpecError(
                self.field,
                f"{self.root} holds more than {_mb(self.limit)} after excludes, over the"
                f" limit (counting stopped there); largest files seen: {largest}. Add"
                f" patterns to 'excludes' or a .gitignore{self.hint}",
            )

    def walk(self, rel_dir: str, matchers: list[Matcher], prefix: str, same: bool) -> None:
        """Walk ``rel_dir``; ``same``: the ``.gitignore`` files above it are those of the
        last walk (so what it kept of an unchanged directory still stands)."""
        dirpath = os.path.join(self.root, rel_dir) if rel_dir else self.root
        listing = None if dirpath in self.changed else self.previous.get(dirpath)
        kept = self.kept_before.get(dirpath) if same and listing is not None else None
        if listing is None:
            listing = self._list(dirpath)
            old = self.previous.get(dirpath)
            same = same and old is not None and old[0] == listing[0]
        self.listings[dirpath] = listing
        gitignore, children = listing
        if gitignore is not None:
            matchers = [*matchers, matcher(rel_dir, gitignore)]
        if kept is not None:
            self.kept[dirpath] = kept
            for item in kept:
                if isinstance(item, str):
                    self.walk(item, matchers, prefix, same)
                else:
                    self.add(item)
            return
        kept = self.kept[dirpath] = []
        # Per file: no pattern that can match a file (the default excludes are directories
        # only) means no ``ignored`` call; the path is joined here (~2 of the walk's ~7 us a
        # file went to these two, 1,000 files on tmpfs).
        files_too = any(m[2] for m in matchers)
        head = dirpath if dirpath.endswith(os.sep) else dirpath + os.sep
        for name, is_dir, is_link in children:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if (is_dir or files_too) and ignored(rel, is_dir, matchers):
                continue
            if is_dir:
                kept.append(rel)
                self.walk(rel, matchers, prefix, same)
                continue
            path = head + name
            try:
                st = os.stat(path)
            except OSError:
                # A dangling symlink: nothing a worker could read, until its target
                # appears, maybe outside the tree (no event here): walk every time.
                self.linked = self.linked or is_link
                continue
            if not stat.S_ISREG(st.st_mode):
                continue  # sockets, fifos, symlinks to directories
            if st.st_nlink > 1 or is_link:
                self.linked = True
            kept.append(self.file(f"{prefix}/{rel}" if prefix else rel, path, st))

    def _list(self, dirpath: str) -> Listing:
        self.scanned += 1
        if self.before_scan is not None:
            self.before_scan(dirpath)  # before the listing: a change after it is an event
        gitignore = _read_gitignore(os.path.join(dirpath, ".gitignore"))
        with os.scandir(dirpath) as it:
            children = [(e.name, e.is_dir(follow_symlinks=False), e.is_symlink()) for e in it]
        children.sort()
        return gitignore, children


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


class Dirty:
    """The directories of a watched tree with an event since they were last listed.

    The watch's listener (``event``) runs under the watcher's lock, and ``take`` reads the
    queued events and empties the set under the same lock, so no event falls between."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.dirs: set[str] = set()
        #: The paths events named (a file written, created, removed, renamed, chmod-ed).
        self.paths: set[str] = set()
        #: An event that a listing of its directory cannot account for: walk it all.
        self.whole = False

    def event(self, directory: str, name: str, mask: int) -> None:
        if mask & (_watch.IN_MOVE_SELF | _watch.IN_DELETE_SELF) or not directory:
            # A directory moved keeps its watch under its old name (events from it would
            # name the wrong directory); one deleted stops reporting.
            self.whole = True
        self.dirs.add(directory)
        if name:
            self.paths.add(os.path.join(directory, name))

    def take(self, watch: _watch.Watch) -> tuple[set[str], set[str]] | None:
        """The directories with events since the last ``take`` (empty: none) and the paths
        the events named; None if the watch can no longer be trusted (overflow, a directory
        gone or moved)."""
        with watch.lock:
            watch.poll()
            usable = watch.usable and not self.whole
            dirs, self.dirs = self.dirs, set()
            paths, self.paths = self.paths, set()
            watch.changed = False
            self.whole = False
        return (dirs, paths) if usable else None


def ignored(rel: str, is_dir: bool, matchers: list[Matcher]) -> bool:
    # The spec's patterns exclude whatever a .gitignore says (as in Ray); among .gitignore
    # files the deepest one with a matching pattern decides, so "!keep" in a subdirectory
    # re-includes what a parent's .gitignore excluded (as in git).
    base, patterns, files_too = matchers[0]
    if (is_dir or files_too) and patterns.match(rel, is_dir):
        return True
    for base, patterns, files_too in reversed(matchers[1:]):
        if not is_dir and not files_too:
            continue
        decision = patterns.decide(rel[len(base) + 1 :] if base else rel, is_dir)
        if decision is not None:
            return decision
    return False
