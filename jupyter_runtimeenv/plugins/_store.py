"""The per-file content store behind ``working_dir`` and ``py_modules``.

Who calls it: those plugins' ``create``, through ``build.to_thread`` (it blocks).

Each file's content is stored once, as a blob under ``<cache_root>/shared/blobs`` named by
its sha256 and mode (``_hashing.blob_mode``: a 0600 source is stored 0400, never shared with
a 0444 blob of the same content); a tree is materialised by hardlinking its blobs into the
build's target (copying where the file system refuses links). An unchanged file therefore
costs a link, never a copy, and a one-byte change in a tree of a thousand files copies one
file. Blobs are made read-only and stamped with a fixed mtime: a blob whose mtime moved was
written through one of its links (e.g. a worker editing a file in its cwd) and is replaced
before it is linked again, so one environment's edit never leaks into the next.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

from ..errors import BuildError
from ._hashing import FileEntry, Tree

#: The mtime every blob carries; any other mtime means it was modified after storing.
BLOB_MTIME_NS = 1_000_000_000 * 10**9

__all__ = ["BLOB_MTIME_NS", "blob_dir", "blob_path", "ensure_stored", "materialize"]


def blob_dir(cache_root: Path) -> Path:
    return cache_root / "shared" / "blobs"


def blob_path(cache_root: Path, name: str) -> Path:
    """Where the store keeps the blob ``name`` (a sha256, with ``-x`` if executable)."""
    return blob_dir(cache_root) / name[:2] / name


def ensure_stored(entries: Iterable[FileEntry], cache_root: Path) -> int:
    """Store each entry's content that the store lacks; returns bytes newly stored.

    Who calls it: the Dask executor, so a tree's content outlives its source directory.
    """
    stored = 0
    for entry in entries:
        blob = blob_path(cache_root, entry.blob_name)
        if not _valid(str(blob), entry):
            _store(entry, blob)
            stored += entry.size
    return stored


def materialize(tree: Tree, cache_root: Path, target: Path) -> int:
    """Lay ``tree`` out below ``target`` from the blob store; returns bytes newly stored.

    Raises ``BuildError`` if a source file no longer has the content it was hashed with
    (it changed after the spec was parsed: parse again).
    """
    blobs = str(blob_dir(cache_root)) + os.sep
    root = str(target) + os.sep
    stored = 0
    # Directories first, each once (a mkdir costs ~0.6 ms on some file systems), then
    # plain string paths: for a thousand files, os.path's and pathlib's overhead is the cost.
    os.makedirs(root, exist_ok=True)
    for rel_dir in tree.dirs:
        os.mkdir(root + rel_dir)
    for entry in tree.entries:
        name = entry.blob_name
        blob = blobs + name[:2] + os.sep + name
        if not _valid(blob, entry):
            _store(entry, Path(blob))
            stored += entry.size
        dest = root + entry.rel
        try:
            os.link(blob, dest)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EMLINK, errno.EPERM, errno.ENOTSUP):
                raise
            shutil.copy2(blob, dest)  # another file system, or too many links
    return stored


def _valid(blob: str, entry: FileEntry) -> bool:
    try:
        st = os.stat(blob)
    except FileNotFoundError:
        return False
    return st.st_size == entry.size and st.st_mtime_ns == BLOB_MTIME_NS


def _store(entry: FileEntry, blob: Path) -> None:
    """Copy the source into the store, checking it still has the hashed content."""
    blob.parent.mkdir(parents=True, exist_ok=True)
    tmp = blob.with_name(f".{blob.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    digest = hashlib.sha256()
    try:
        with open(entry.source, "rb") as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
        if digest.hexdigest() != entry.sha256:
            raise BuildError(
                f"{entry.source} changed after the spec was parsed; parse the spec again"
            )
        os.chmod(tmp, entry.mode)  # read-only; owner-only when the source was
        os.utime(tmp, ns=(BLOB_MTIME_NS, BLOB_MTIME_NS))
        # Atomic: a concurrent build linking this blob sees the old or the new file, whole.
        os.replace(tmp, blob)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
