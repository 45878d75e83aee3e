"""Content hashing of local files and trees: one pass, and no pass when nothing changed.

Who calls it: ``working_dir`` and ``py_modules`` — from ``identity`` and ``uris`` (parse and
the agent, in threads) and from ``create`` (through ``build.to_thread``) — and the Dask
manifest. Everything here blocks; nothing here may run on an event loop.

A tree's digest covers each kept file's relative path, mode class and content, after the
default excludes, the spec's ``excludes`` and every ``.gitignore`` in the tree. The walk
only stats (and counts bytes against the caller's limit, stopping there); then the files
the stat cache (``_statcache``) does not know are read once each — hashed, and with a
``store``, written into the content store from the same bytes — large files in chunks, many
files on threads. An unchanged tree costs one ``stat`` per file and no read.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecError
from ..spec.files import BadFile, exact_chunks, kind_of_mode, open_regular
from ..spec.patterns import PatternError, PatternList, check_list
from . import _blobs, _statcache, _watch

#: Never part of a working_dir or py_module, whatever the spec says.
DEFAULT_EXCLUDES = (".git/", "__pycache__/", ".venv/", ".ipynb_checkpoints/")
#: A ``.gitignore`` larger than this, or with more patterns, is refused (``PatternError``).
MAX_GITIGNORE_BYTES = 1 << 20
MAX_GITIGNORE_PATTERNS = 10_000
#: Files up to this size are read whole; larger ones are hashed (and stored) in chunks.
WHOLE_MAX = 8 << 20
_CHUNK = 1 << 20
#: Below this many files to read, threads cost more than they give.
_THREADS_FROM = 32

__all__ = [
    "DEFAULT_EXCLUDES",
    "FileEntry",
    "Tree",
    "blob_mode",
    "forget_stat_cache",
    "hash_file",
    "hash_tree",
    "store_file",
]


def blob_mode(st_mode: int) -> int:
    """The read-only mode a file is stored with: the owner reads; group and other read only
    if they could read the source (a 0600 file stays owner-only: 0400); whoever reads may
    execute if the source was executable. The common cases are 0444 and 0555."""
    read = 0o400 | (st_mode & 0o044)
    return read | (read >> 2) if st_mode & 0o111 else read


@dataclass(frozen=True)
class FileEntry:
    """One file of a tree: where it is relative to the tree, its source, the mode it is
    stored with (``blob_mode``) and its content."""

    rel: str
    source: str
    mode: int
    size: int
    sha256: str

    @property
    def executable(self) -> bool:
        return bool(self.mode & 0o100)

    @property
    def blob_name(self) -> str:
        # The mode is part of the blob: hardlinks share their inode's mode, so a 0600 file
        # and a 0644 file of the same content are two blobs (0400 and 0444).
        return blob_name(self.sha256, self.mode)


def blob_name(sha256: str, mode: int) -> str:
    if mode == 0o444:
        return sha256
    if mode == 0o555:
        return sha256 + "-x"
    return f"{sha256}-m{mode:03o}"


@dataclass(frozen=True)
class Tree:
    """A hashed tree: its digest, its files in path order and their total size."""

    digest: str
    entries: tuple[FileEntry, ...]

    @functools.cached_property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    @functools.cached_property
    def dirs(self) -> tuple[str, ...]:
        """Every directory below the root that holds a file, parents before children."""
        found: set[str] = set()
        for entry in self.entries:
            parent = os.path.dirname(entry.rel)
            while parent and parent not in found:
                found.add(parent)
                parent = os.path.dirname(parent)
        return tuple(sorted(found))  # a prefix sorts before its extensions

    def largest(self, n: int = 5) -> list[FileEntry]:
        return sorted(self.entries, key=lambda e: e.size, reverse=True)[:n]


def forget_stat_cache() -> None:
    """Forget every file's remembered hash: the next hash reads everything (a new kernel)."""
    _statcache.forget()
    with _trees_lock:
        memos = list(_trees.values())
        _trees.clear()
    for memo in memos:
        _drop(memo)


def hash_file(path: str, st: os.stat_result | None = None) -> str:
    """The sha256 of a file's content, from the stat cache when its stat is unchanged."""
    st = st or os.stat(path)
    return _hash_one(path, st, None, blob_mode(st.st_mode))


def store_file(path: str, store: str | Path, rel: str) -> FileEntry:
    """Hash the file at ``path`` and store it in ``store`` from the same read; its entry
    as ``rel``. No tree memo or watch: a file read once (a task's output, on a Dask node)."""
    st = os.stat(path)
    mode = blob_mode(st.st_mode)
    sha = _hash_one(path, st, str(store), mode, cached=False)
    return FileEntry(rel, path, mode, st.st_size, sha)


def _hash_one(
    path: str, st: os.stat_result, store: str | None, mode: int, *, cached: bool = True
) -> str:
    """Read ``path`` once: hash it and, with a ``store``, store it from the same bytes."""
    known = _statcache.lookup(path, st) if cached else None
    if known is not None:
        return known
    started = time.time_ns()
    # Opened non-blocking and checked on the descriptor (the file stat'ed, regular), then
    # read for exactly its size: a FIFO swapped in, /proc or a file being written is a
    # BadFile, never a hang or an endless read.
    fd = open_regular(path, st)
    try:
        if st.st_size <= WHOLE_MAX:
            data = b"".join(exact_chunks(fd, path, st.st_size, st.st_size or 1))
            sha = hashlib.sha256(data).hexdigest()
            if store is not None:
                _blobs.write_blob(store, blob_name(sha, mode), data, len(data), mode)
        else:
            sha = _hash_chunks(fd, path, st.st_size, store, mode)
    finally:
        os.close(fd)
    _statcache.record(path, st, sha, started)
    return sha


def _hash_chunks(fd: int, path: str, size: int, store: str | None, mode: int) -> str:
    digest = hashlib.sha256()
    sink = _blobs.BlobSink(store, mode) if store is not None else None
    try:
        for chunk in exact_chunks(fd, path, size, _CHUNK):
            digest.update(chunk)
            if sink is not None:
                sink.write(chunk)
        sha = digest.hexdigest()
        if sink is not None:
            sink.commit(blob_name(sha, mode))
    finally:
        if sink is not None:
            sink.abort()
    return sha


# (base dir, patterns, whether any pattern can match a file): patterns ending in "/" match
# directories only, and excluded directories are pruned, so files skip those lists. The
# first matcher of a walk is the spec's (default excludes + ``excludes``); the others are
# ``.gitignore`` files, deeper last.
Matcher = tuple[str, PatternList, bool]


def _matcher(base: str, lines: Iterable[str]) -> Matcher:
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


#: A file the walk kept: its relative path (with the prefix), its path, its stat.
_Found = tuple[str, str, os.stat_result]


class _Walk:
    """The files of a tree after excludes, with their stats; counts bytes as it goes and
    stops at ``limit`` (``SpecError`` naming ``field`` and the largest files seen)."""

    def __init__(
        self,
        root: str,
        limit: int | None,
        field: str,
        hint: str,
        before_scan: Callable[[str], object] | None = None,
    ) -> None:
        self.root = root
        #: Called with each directory before it is read (a watch is added there first).
        self.before_scan = before_scan
        #: Whether a file was reached through a symlink or has other hard links: a change
        #: to it can come through a path outside the tree (no event in the tree).
        self.linked = False
        self.limit = limit
        self.field = field
        self.hint = hint
        self.found: list[_Found] = []
        #: (relative path, stat key) of each file: what identifies an unchanged tree.
        self.signature: list[tuple[str, _statcache.Key]] = []
        self.total = 0
        self._largest: list[tuple[int, str]] = []  # a min-heap of the 5 largest

    def file(self, rel: str, path: str, st: os.stat_result) -> None:
        self.found.append((rel, path, st))
        self.signature.append(
            (rel, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        )
        self.total += st.st_size
        if len(self._largest) < 5:
            heapq.heappush(self._largest, (st.st_size, rel))
        elif st.st_size > self._largest[0][0]:
            heapq.heapreplace(self._largest, (st.st_size, rel))
        if self.limit is not None and self.total > self.limit:
            largest = ", ".join(
                f"{rel} ({_mb(size)})" for size, rel in sorted(self._largest, reverse=True)
            )
            raise SpecError(
                self.field,
                f"{self.root} holds more than {_mb(self.limit)} after excludes, over the"
                f" limit (counting stopped there); largest files seen: {largest}. Add"
                f" patterns to 'excludes' or a .gitignore{self.hint}",
            )

    def walk(self, rel_dir: str, matchers: list[Matcher], prefix: str) -> None:
        dirpath = os.path.join(self.root, rel_dir) if rel_dir else self.root
        if self.before_scan is not None:
            self.before_scan(dirpath)
        gitignore = _read_gitignore(os.path.join(dirpath, ".gitignore"))
        if gitignore is not None:
            matchers = [*matchers, _matcher(rel_dir, gitignore)]
        with os.scandir(dirpath) as it:
            children = sorted(it, key=lambda e: e.name)
        for child in children:
            rel = f"{rel_dir}/{child.name}" if rel_dir else child.name
            is_dir = child.is_dir(follow_symlinks=False)
            if _ignored(rel, is_dir, matchers):
                continue
            if is_dir:
                self.walk(rel, matchers, prefix)
                continue
            try:
                st = child.stat(follow_symlinks=True)
            except OSError:
                continue  # a dangling symlink: nothing a worker could read
            if not stat.S_ISREG(st.st_mode):
                continue  # sockets, fifos, symlinks to directories
            if st.st_nlink > 1 or child.is_symlink():
                self.linked = True
            self.file(f"{prefix}/{rel}" if prefix else rel, child.path, st)


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def hash_tree(
    root: str | Path,
    excludes: Sequence[str] = (),
    *,
    prefix: str = "",
    limit: int | None = None,
    field: str = "",
    hint: str = "",
    store: str | Path | None = None,
) -> Tree:
    """Hash the directory ``root`` (or a single file) after excludes and ``.gitignore``.

    ``prefix`` is put before every relative path (``py_modules`` keeps a package's own name
    so that the resource's root is what goes on ``sys.path``). Symlinks to files are
    followed (their content is what the worker will read); symlinks to directories are not
    (they could loop or leave the tree). Over ``limit`` bytes: ``SpecError`` naming
    ``field`` (``hint`` ends its advice), raised as soon as the walk has counted that much.
    With ``store`` (a blob directory), content read here is stored there from the same read.
    """
    root = os.path.abspath(root)
    memo_key = (root, tuple(excludes), prefix)
    known = _trees.get(memo_key)
    if known is not None and known.watch is not None and known.watch.unchanged():
        return known.tree  # no event in any of its directories since it was walked
    started = time.time_ns()
    watch = _watch.watch(root)
    walk = _Walk(root, limit, field, hint, watch.add if watch is not None else None)
    try:
        st = os.stat(root)
        if not stat.S_ISDIR(st.st_mode) and not stat.S_ISREG(st.st_mode):
            raise BadFile(f"{root} is {kind_of_mode(st.st_mode)}, not a file or a directory")
        if stat.S_ISREG(st.st_mode):
            if watch is not None:
                watch.add(os.path.dirname(root))
            walk.linked = st.st_nlink > 1 or os.path.islink(root)
            walk.file(prefix or os.path.basename(root), root, st)
        else:
            check_list(excludes, "excludes")
            walk.walk("", [_matcher("", [*DEFAULT_EXCLUDES, *excludes])], prefix)
    except BaseException:
        if watch is not None:
            watch.close()
        raise
    if watch is not None and walk.linked:
        watch.close()
        watch = None
    found = walk.found
    # The same files with the same stats as last time: the same tree, nothing to build.
    signature = walk.signature
    if known is not None and known.settled and known.signature == signature:
        _remember(memo_key, _Memo(signature, known.tree, watch, settled=True))
        return known.tree
    blobs = None if store is None else str(store)
    shas = _hash_all(found, blobs)
    entries = tuple(
        FileEntry(rel, path, blob_mode(st.st_mode), st.st_size, sha)
        for (rel, path, st), sha in zip(found, shas, strict=True)
    )
    tree = Tree(_digest(entries), entries)
    # Without a watch the next call compares stats, which a file changed within the racy
    # window could keep while changing again: such a tree is not "settled".
    settled = all(st.st_ctime_ns < started - _statcache.RACY_NS for _, _, st in found)
    if (watch is not None and watch.usable) or settled:
        # A watch was armed before any directory was listed: a write after that is an event,
        # one before it was read here; the tree stands until an event, settled or not.
        _remember(memo_key, _Memo(signature, tree, watch, settled=settled))
    elif watch is not None:
        watch.close()
    return tree


@dataclass
class _Memo:
    """The last tree hashed at a root: the (path, stat key) of each of its files, and the
    watch on its directories (None: walk and compare the signature)."""

    signature: list[tuple[str, _statcache.Key]]
    tree: Tree
    watch: _watch.Watch | None
    #: No file changed within the racy window before it was read: the signature may stand
    #: for the content (without a watch, or after the watch failed).
    settled: bool = True


_TREES_MAX = 64
_trees: dict[tuple[str, tuple[str, ...], str], _Memo] = {}
_trees_lock = threading.Lock()


def _remember(key: tuple[str, tuple[str, ...], str], memo: _Memo) -> None:
    with _trees_lock:
        old = _trees.pop(key, None)
        if len(_trees) >= _TREES_MAX:
            _drop(_trees.pop(next(iter(_trees))))
        _trees[key] = memo
    if old is not None and old.watch is not memo.watch:
        _drop(old)


def _drop(memo: _Memo) -> None:
    if memo.watch is not None:
        memo.watch.close()


def _hash_all(found: list[_Found], store: str | None) -> list[str]:
    shas: list[str | None] = [_statcache.lookup(path, st) for _, path, st in found]
    todo = [i for i, sha in enumerate(shas) if sha is None]

    def run(indices: Sequence[int]) -> None:
        for i in indices:
            _, path, st = found[i]
            shas[i] = _hash_one(path, st, store, blob_mode(st.st_mode))

    if len(todo) < _THREADS_FROM:
        run(todo)
    else:
        # sha256 and file I/O release the GIL: files are read, hashed and stored on
        # several cores at once. Interleaved slices keep large and small files mixed.
        n = _threads()
        list(_pool().map(run, [todo[k::n] for k in range(n)]))
    done = [sha for sha in shas if sha is not None]
    if len(done) != len(found):  # a thread failed without raising: never a partial tree
        raise RuntimeError("hashing left files without a digest")
    return done


def _threads() -> int:
    # One per core (at least two: one reads while the other writes). More than the cores
    # only adds contention on the file system's journal (measured with 1, 2 and 4 threads on
    # 2 cores: 1.05x, 0.76x and 1.22x a cp -r of the same tree).
    return max(2, min(8, os.cpu_count() or 1))


_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(_threads(), thread_name_prefix="jre-hash")
        return _executor


def _ignored(rel: str, is_dir: bool, matchers: list[Matcher]) -> bool:
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


def _digest(entries: Iterable[FileEntry]) -> str:
    h = hashlib.sha256()
    for e in entries:
        h.update(e.rel.encode("utf-8", "surrogateescape"))
        # 0444/0555 hash as before modes were kept; any other mode enters the digest, so
        # making a file owner-only makes a new tree.
        if e.mode in (0o444, 0o555):
            h.update(b"\0755\0" if e.executable else b"\0644\0")
        else:
            h.update(f"\0m{e.mode:03o}\0".encode())
        h.update(e.sha256.encode())
        h.update(b"\n")
    return h.hexdigest()
