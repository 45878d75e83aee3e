"""Content hashing of local files and trees: one pass, and no pass when nothing changed.

Who calls it: ``working_dir`` and ``py_modules`` — from ``identity`` and ``uris`` (parse and
the agent, in threads) and from ``create`` (through ``build.to_thread``) — and the Dask
manifest. Everything here blocks; nothing here may run on an event loop.

A tree's digest covers each kept file's relative path, mode class and content, after the
default excludes, the spec's ``excludes`` and every ``.gitignore`` in the tree. The walk
only stats (and counts bytes against the caller's limit, stopping there); then the files
the stat cache (``_statcache``) does not know are read once each (``_readonce``) — hashed,
and with a ``store``, written into the content store from the same bytes — large files in
chunks, many files on threads (a new tree of many files read into its lay-out: on this thread
and a helper process, ``_hashhelp``, as threads of one process serialise on the GIL there),
the walk handing its files to the helper as it finds them (a stream). An unchanged
tree costs one ``stat`` per file and no read; with an inotify watch (``_watch``) it costs
nothing, and after events only the directories they name are listed again and only the
files they name are read again: one changed file in a tree of a thousand costs its
directory's listing and its own read.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..spec.files import BadFile, kind_of_mode
from ..spec.patterns import check_list
from . import _hashhelp, _statcache, _watch
from ._layout import Layer, LayOut
from ._readonce import WHOLE_MAX, blob_mode, blob_name
from ._readonce import hash_one as _hash_one
from ._tree import FileEntry, Tree, digest, new_entries
from ._walk import Dirty, Found, Kept, Listing, Walk, matcher

#: Never part of a working_dir or py_module, whatever the spec says.
DEFAULT_EXCLUDES = (".git/", "__pycache__/", ".venv/", ".ipynb_checkpoints/")
#: Below this many files to read, threads cost more than they give.
_THREADS_FROM = 32

__all__ = [
    "DEFAULT_EXCLUDES",
    "WHOLE_MAX",
    "FileEntry",
    "LayOut",
    "Tree",
    "blob_mode",
    "blob_name",
    "forget_stat_cache",
    "hash_file",
    "hash_tree",
    "store_file",
]


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


def hash_tree(
    root: str | Path,
    excludes: Sequence[str] = (),
    *,
    prefix: str = "",
    limit: int | None = None,
    field: str = "",
    hint: str = "",
    store: str | Path | None = None,
    lay_out: LayOut | None = None,
) -> Tree:
    """Hash the directory ``root`` (or a single file) after excludes and ``.gitignore``.

    ``prefix`` is put before every relative path (``py_modules`` keeps a package's own name
    so that the resource's root is what goes on ``sys.path``). Symlinks to files are
    followed (their content is what the worker will read); symlinks to directories are not
    (they could loop or leave the tree). Over ``limit`` bytes: ``SpecError`` naming
    ``field`` (``hint`` ends its advice), raised as soon as the walk has counted that much.
    With ``store`` (a blob directory), content read here is stored there from the same read;
    but a tree read whole with a ``lay_out`` (``LayOut``) is written there instead, file by
    file, and stored later (``_layout.defer_store``, after its env is ready).
    """
    root = os.path.abspath(root)
    memo_key = (root, tuple(excludes), prefix)
    while True:
        known = _trees.get(memo_key)
        if known is None:
            return _hash_tree(memo_key, None, limit, field, hint, store, lay_out)
        with known.lock:  # one hash of a tree at a time: the next one then reuses its work
            if known.superseded:
                continue  # replaced while this call waited: look again
            return _hash_tree(memo_key, known, limit, field, hint, store, lay_out)


def _hash_tree(
    memo_key: tuple[str, tuple[str, ...], str],
    known: _Memo | None,
    limit: int | None,
    field: str,
    hint: str,
    store: str | Path | None,
    lay_out: LayOut | None = None,
) -> Tree:
    root, excludes, prefix = memo_key
    before: _Memo | None = None
    changed: set[str] = set()
    named: set[str] = set()
    watch: _watch.Watch | None = None
    dirty = Dirty(root)
    if known is not None and known.watch is not None:
        taken = known.dirty.take(known.watch)
        if taken is not None and not taken[0]:
            return known.tree  # no event in any of its directories since it was walked
        if taken is not None:
            # Events in some directories: list those again, keep the others' listings.
            changed, named = taken
            watch, dirty, before = known.watch, known.dirty, known
    started = time.time_ns()
    if watch is None:
        watch = _watch.watch(root, dirty.event)
    add: Callable[[str], object] | None = watch.add if watch is not None else None
    stream = None
    checked = [0]  # how many of the walk's files the stream looked up in the stat cache
    if known is None and lay_out is not None and store is not None:
        # A new tree read whole into its lay-out: the helper hashes as the walk goes on.
        stream = _hashhelp.Stream(lay_out.path, blob_mode)
        add = _streaming(add, stream, lambda: walk.found, checked)
    last = (before.listings, before.kept) if before is not None else None
    walk = Walk(root, limit, field, hint, add, last, changed)
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
            walk.walk("", [matcher("", [*DEFAULT_EXCLUDES, *excludes])], prefix, True)
    except BaseException:
        if stream is not None:
            stream.abort()
        if watch is not None:
            watch.close()
        if known is not None:
            _forget(memo_key, known)  # its watch may be the one just closed
        raise
    if watch is not None and walk.linked:
        watch.close()
        watch = None
    found = walk.found
    kept = (walk.listings, walk.kept) if watch is not None else ({}, {})
    # The same files with the same stats as last time: the same tree, nothing to build.
    signature = walk.signature
    if known is not None and known.settled and known.signature == signature:
        _remember(memo_key, _Memo(signature, known.tree, watch, dirty, *kept, settled=True))
        return known.tree
    # A file no event named since it was read, with the stat it had then: the content it
    # had (even if written within the racy window, which keeps it out of the stat cache).
    prior: dict[str, tuple[_statcache.Key, FileEntry]] = {}
    if before is not None:
        for (_rel, key), entry in zip(before.signature, before.tree.entries, strict=True):
            if entry.source not in named:
                prior[entry.source] = (key, entry)
    entries: list[FileEntry | None] = []
    todo: list[Found] = []
    for item in found:
        hit = prior.get(item[1])
        if hit is not None and hit[0] == item[2]:
            entries.append(hit[1])
        else:
            entries.append(None)
            todo.append(item)
    blobs = None if store is None else str(store)
    whole = lay_out if len(todo) == len(found) else None  # every file is read here
    shas = None
    if stream is not None:
        try:
            # A file the stat cache knows (the tree with other excludes, a memo evicted):
            # not a new tree after all; the threads read only what it does not know.
            if whole is not None and blobs is not None and not _known(found, checked[0]):
                shas = _streamed(stream, found, walk.stats, blobs, whole)
        finally:
            stream.abort()  # (nothing once it finished)
    if shas is None:
        shas = _hash_all(todo, walk.stats, blobs, whole)
    new = new_entries(todo, shas)
    done = tuple(entry or next(new) for entry in entries)
    tree = Tree(digest(done), done)
    # Without a watch the next call compares stats, which a file changed within the racy
    # window could keep while changing again: such a tree is not "settled".
    settled = all(key[4] < started - _statcache.RACY_NS for _, _, key, _ in found)
    if (watch is not None and watch.usable) or settled:
        # A watch was armed before any directory was listed: a write after that is an event,
        # one before it was read here; the tree stands until an event, settled or not.
        _remember(memo_key, _Memo(signature, tree, watch, dirty, *kept, settled=settled))
    else:
        if watch is not None:
            watch.close()
        if known is not None:
            _forget(memo_key, known)
    return tree


@dataclass
class _Memo:
    """The last tree hashed at a root: the (path, stat key) of each of its files, and the
    watch on its directories (None: walk and compare the signature) with the directories it
    saw change and the listing of each directory."""

    signature: list[tuple[str, _statcache.Key]]
    tree: Tree
    watch: _watch.Watch | None
    dirty: Dirty
    listings: dict[str, Listing]
    kept: dict[str, Kept]
    #: No file changed within the racy window before it was read: the signature may stand
    #: for the content (without a watch, or after the watch failed).
    settled: bool = True
    lock: threading.Lock = dataclasses.field(
        default_factory=threading.Lock, repr=False, compare=False
    )
    #: Another memo took its place: whoever waited on ``lock`` looks again.
    superseded: bool = False


_TREES_MAX = 64
_trees: dict[tuple[str, tuple[str, ...], str], _Memo] = {}
_trees_lock = threading.Lock()


def _remember(key: tuple[str, tuple[str, ...], str], memo: _Memo) -> None:
    with _trees_lock:
        old = _trees.pop(key, None)
        if len(_trees) >= _TREES_MAX:
            _drop(_trees.pop(next(iter(_trees))))
        _trees[key] = memo
    if old is not None:
        old.superseded = True
        if old.watch is not memo.watch:
            _drop(old)


def _forget(key: tuple[str, tuple[str, ...], str], memo: _Memo) -> None:
    with _trees_lock:
        if _trees.get(key) is memo:
            del _trees[key]
    memo.superseded = True
    _drop(memo)


def _drop(memo: _Memo) -> None:
    if memo.watch is not None:
        memo.watch.close()


def _hash_all(
    found: list[Found],
    stats: dict[str, os.stat_result],
    store: str | None,
    lay_out: LayOut | None = None,
) -> list[str]:
    """The sha256 of each file of ``found`` (from the stat cache, else read) whose stat is
    in ``stats`` (the walk's): every file a walk did not stat again was known before. With
    ``lay_out`` and every file to be read, each is written there (``_layout.Layer``) from
    the bytes hashed, instead of into the store."""
    sts = [stats.get(path) or os.stat(path) for _, path, _, _ in found]
    shas: list[str | None] = [
        _statcache.lookup(path, st) for (_, path, _, _), st in zip(found, sts, strict=True)
    ]
    todo = [i for i, sha in enumerate(shas) if sha is None]
    layer = None
    if lay_out is not None and store is not None and len(todo) == len(found) >= _THREADS_FROM:
        layer = Layer.make(lay_out.path, [f[0] for f in found], _threads())

    def run(indices: Sequence[int]) -> None:
        ok = False
        try:
            for i in indices:
                path, st = found[i][1], sts[i]
                mode = blob_mode(st.st_mode)
                shas[i] = _hash_one(path, st, store, mode, layer=layer, rel=found[i][0])
            ok = True
        finally:
            if layer is not None:
                layer.release(ok)

    ok = False
    try:
        if len(todo) < _THREADS_FROM:
            run(todo)
        else:
            # sha256 and file I/O release the GIL: files are read, hashed and stored on
            # several cores at once. Interleaved slices keep large and small files mixed.
            n = _threads()
            futures = []
            try:
                for k in range(n):
                    futures.append(_pool().submit(run, todo[k::n]))
            finally:
                for _ in range(n - len(futures)):  # never submitted: never lets go itself
                    if layer is not None:
                        layer.release(False)
            for future in futures:
                future.result()
        done = [sha for sha in shas if sha is not None]
        if len(done) != len(found):  # a thread failed without raising: never a partial tree
            raise RuntimeError("hashing left files without a digest")
        ok = True
    finally:
        if layer is not None and lay_out is not None:
            # The last of this call and its threads to let go closes it (removing it unless
            # all went well): a slice still running after an interrupt links into it safely.
            lay_out.done = layer.release(ok)
            lay_out.made = layer.made
    return done


def _streaming(
    add: Callable[[str], object] | None,
    stream: _hashhelp.Stream,
    found: Callable[[], list[Found]],
    checked: list[int],
) -> Callable[[str], object]:
    """``add`` (called before each directory is listed) that first hands the files the walk
    found so far to the helper (``_hashhelp.Stream.feed``); ``checked[0]``: how many of them
    were looked up in the stat cache. The first file it knows ends the stream (``_known``)."""

    def before_scan(directory: str) -> object:
        if not stream.off:
            files = found()
            if _known(files, checked[0]):
                stream.abort()
                stream.off = True
            else:
                checked[0] = len(files)
                stream.feed(files)
        return add(directory) if add is not None else None

    return before_scan


def _known(found: list[Found], start: int) -> bool:
    """Whether the stat cache knows a file of ``found[start:]`` as it is now: the tree is
    not new to this process, and a stream would read again what it need not read."""
    return any(_statcache.known(path, key) for _rel, path, key, _mode in found[start:])


def _streamed(
    stream: _hashhelp.Stream,
    found: list[Found],
    stats: dict[str, os.stat_result],
    store: str,
    lay_out: LayOut,
) -> list[str] | None:
    """The sha256 of each file of the new tree ``found`` (each read, none from the stat
    cache), hashed and written into ``lay_out`` with the helper (``stream``); None if the
    stream did not begin (the caller hashes the files itself)."""
    files = [(rel, path, stats[path], blob_mode(st_mode)) for rel, path, _k, st_mode in found]

    def rest(i: int, layer: Layer) -> str:
        rel, path, st, mode = files[i]
        return _hash_one(path, st, store, mode, layer=layer, rel=rel)

    shas = stream.finish(found, files, rest)
    if shas is not None:
        lay_out.done, lay_out.made = stream.done, stream.made
    return shas


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
