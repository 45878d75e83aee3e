"""The per-file content store behind ``working_dir`` and ``py_modules``.

Who calls it: those plugins' ``create``, through ``build.to_thread`` (it blocks), and the
Dask manifest. An agent ``attach``-es its store when it starts, so that a spec parsed in the
same process stores what it hashes from the same read (``_hashing``): the build then only
links. A tree read whole there is written as the env's own files instead and stored after
the env is ready (``_layout``); ``materialize`` and ``ensure_stored`` settle that first.

Each file's content is stored once, as a blob (``_blobs``) under
``<cache_root>/shared/blobs`` named by its sha256 and mode; a tree is materialised by
hardlinking its blobs into the build's target (copying where the file system refuses
links). An unchanged file costs a link, never a copy, and a one-byte change in a tree of a
thousand files stores one file. Before a blob is linked into a new tree it is checked: a
blob touched through a link since it was stored is hashed again, and leaves the store if
its content changed (``_blobs.verify``), so one environment's edit never reaches the next.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ..errors import BuildError
from . import _blobs, _hashhelp, _layout, _statcache
from ._blobs import BLOB_MTIME_NS
from ._hashing import WHOLE_MAX, FileEntry, Tree

__all__ = [
    "BLOB_MTIME_NS",
    "attach",
    "blob_dir",
    "blob_path",
    "by_dir",
    "default_store",
    "detach_hooks",
    "ensure_stored",
    "materialize",
    "open_dir",
    "place",
    "prepare",
]


def blob_dir(cache_root: Path) -> Path:
    return cache_root / "shared" / "blobs"


def blob_path(cache_root: Path, name: str) -> Path:
    """Where the store keeps the blob ``name`` (a sha256, with ``-x`` if executable)."""
    return blob_dir(cache_root) / name[:2] / name


def prepare(cache_root: Path) -> None:
    """Make the store's 256 shard directories once, with the cache (the agent's start, in a
    thread): a first tree stored into a new cache would otherwise make them one by one,
    ~20 ms on an idle disk and 0.6 s on a busy one for the 1,000 files of W5."""
    blobs = blob_dir(cache_root)
    if (blobs / "ff").is_dir():
        return
    for i in range(256):
        (blobs / f"{i:02x}").mkdir(parents=True, exist_ok=True)


_attached: list[str] = []
#: Called with a store's blob directory when its agent detaches it (``_spares.drop``
#: registers itself: it builds on this module).
detach_hooks: list[Callable[[str], None]] = []
_attached_lock = threading.Lock()


def attach(cache_root: Path) -> Callable[[], None]:
    """Make ``cache_root``'s store the one specs parsed in this process store into; returns
    the function that undoes it, which also runs ``detach_hooks`` (``_spares`` removes its
    spare trees of that store: it blocks, call it in a thread). Called by the agent on
    start (the undo on stop). Meanwhile the hash helper a large new tree started is kept
    for the next one (``_hashhelp.keep``)."""
    store = str(blob_dir(cache_root))
    with _attached_lock:
        _attached.append(store)
    release_helper = _hashhelp.keep()

    def detach() -> None:
        with _attached_lock:
            if store in _attached:
                _attached.remove(store)
        release_helper()
        for hook in list(detach_hooks):
            hook(store)

    return detach


def default_store() -> str | None:
    """The blob directory of the agent started last in this process, if one runs."""
    with _attached_lock:
        return _attached[-1] if _attached else None


def ensure_stored(entries: Iterable[FileEntry], cache_root: Path) -> int:
    """Store each entry's content that the store lacks; returns bytes newly stored.

    Who calls it: the Dask manifest, so a tree's content outlives its source directory.
    """
    store = str(blob_dir(cache_root))
    _layout.settle(store)  # trees written at parse and not stored yet go in first
    stored = 0
    for entry in entries:
        if not _blobs.verify(store, entry.blob_name, entry.sha256, entry.size, entry.mode):
            _store(entry, store)
            stored += entry.size
    return stored


def materialize(tree: Tree, cache_root: Path, target: Path) -> int:
    """Lay ``tree`` out below ``target`` from the blob store; returns bytes newly stored.

    Raises ``BuildError`` if a source file no longer has the content it was hashed with
    (it changed after the spec was parsed: parse again).
    """
    store = str(blob_dir(cache_root))
    _layout.settle(store)  # trees written at parse and not stored yet go in first
    stored = 0
    # Every call goes through descriptors of the store and of the target's directories,
    # with names relative to them: a thousand links and stats each resolving two deep
    # paths spent a third of their time walking them again.
    os.makedirs(target, exist_ok=True)
    os.makedirs(store, exist_ok=True)
    with open_dir(store) as store_fd, open_dir(str(target)) as root_fd:
        for rel_dir in tree.dirs:  # parents first, each once
            os.mkdir(rel_dir, dir_fd=root_fd)
        for rel_dir, entries in by_dir(tree.entries).items():
            with open_dir(rel_dir, root_fd) as dir_fd:
                for entry in entries:
                    stored += place(entry, store, store_fd, dir_fd, target)
    return stored


def by_dir(entries: Iterable[FileEntry]) -> dict[str, list[FileEntry]]:
    """``entries`` grouped by the directory (relative) that holds them."""
    grouped: dict[str, list[FileEntry]] = {}
    for entry in entries:  # ``rel`` is "/"-separated and normalised (see ``Tree.dirs``)
        grouped.setdefault(entry.rel.rpartition("/")[0], []).append(entry)
    return grouped


@contextlib.contextmanager
def open_dir(path: str, at: int | None = None) -> Iterator[int]:
    """A descriptor of the directory ``path`` (relative to ``at``); ``at`` itself for ""."""
    if at is not None and not path:
        yield at
        return
    fd = os.open(path, _DIR_FLAGS, dir_fd=at)
    try:
        yield fd
    finally:
        os.close(fd)


def place(entry: FileEntry, store: str, store_fd: int, dir_fd: int, target: Path) -> int:
    """Link ``entry``'s blob as its name in the directory ``dir_fd`` (of the tree laid out
    at ``target``), storing its content first if the store lacks it or holds it touched;
    returns the bytes newly stored."""
    name = entry.blob_name
    blob = _blobs.relative(name)
    stored = 0
    try:
        ok = _blobs.valid(os.lstat(blob, dir_fd=store_fd), entry.size, entry.mode)
    except FileNotFoundError:
        ok = False
    if not ok and not _blobs.verify(store, name, entry.sha256, entry.size, entry.mode):
        _store(entry, store)
        stored = entry.size
    base = os.path.basename(entry.rel)
    try:
        os.link(blob, base, src_dir_fd=store_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
        # Another file system, or too many links: a copy.
        shutil.copy2(_blobs.path_in(store, name), target / entry.rel)
    return stored


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NO_LINK = (errno.EXDEV, errno.EMLINK, errno.EPERM, errno.ENOTSUP)


def _store(entry: FileEntry, store: str) -> None:
    """Store ``entry``'s content from its source, which must still hold it."""
    try:
        st = os.stat(entry.source)
    except OSError as exc:
        raise _changed(entry) from exc
    name = entry.blob_name
    # The stat cache vouches for the source: the kernel copies it, nothing is read here.
    if _statcache.lookup(entry.source, st) == entry.sha256 and _blobs.copy_in(
        store, name, entry.source, st, entry.mode
    ):
        return
    if st.st_size <= WHOLE_MAX:
        with open(entry.source, "rb") as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise _changed(entry)
        _blobs.write_blob(store, name, data, len(data), entry.mode)
        return
    digest = hashlib.sha256()
    sink = _blobs.BlobSink(store, entry.mode)
    try:
        with open(entry.source, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
                sink.write(chunk)
        if digest.hexdigest() != entry.sha256:
            raise _changed(entry)
        sink.commit(name)
    finally:
        sink.abort()


def _changed(entry: FileEntry) -> BuildError:
    return BuildError(f"{entry.source} changed after the spec was parsed; parse the spec again")
