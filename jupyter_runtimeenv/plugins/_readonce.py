"""One file read once: hashed, and written from the same bytes into a tree's lay-out
(``_layout``) or the content store (``_blobs``); large files in chunks.

Who calls it: ``_hashing`` (each file of a tree the stat cache does not know, and single
files). Everything here blocks. What a file is stored as (``blob_mode``, ``blob_name``) is
decided here too, as the store and the lay-out name their files by it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time

from ..errors import CacheUnavailable
from ..spec.files import exact_chunks, open_regular
from . import _blobs, _statcache
from ._layout import Layer

#: Files up to this size are read whole; larger ones are hashed (and stored) in chunks.
WHOLE_MAX = 8 << 20
_CHUNK = 1 << 20

__all__ = ["WHOLE_MAX", "blob_mode", "blob_name", "disk_error", "hash_one"]


def blob_mode(st_mode: int) -> int:
    """The read-only mode a file is stored with: the owner reads; group and other read only
    if they could read the source (a 0600 file stays owner-only: 0400); whoever reads may
    execute if the source was executable. The common cases are 0444 and 0555."""
    read = 0o400 | (st_mode & 0o044)
    return read | (read >> 2) if st_mode & 0o111 else read


def blob_name(sha256: str, mode: int) -> str:
    if mode == 0o444:
        return sha256
    if mode == 0o555:
        return sha256 + "-x"
    return f"{sha256}-m{mode:03o}"


def hash_one(
    path: str,
    st: os.stat_result,
    store: str | None,
    mode: int,
    *,
    cached: bool = True,
    layer: Layer | None = None,
    rel: str = "",
) -> str:
    """Read ``path`` once: hash it and write it from the same bytes, as ``rel`` of the
    ``layer`` being laid out (not stored yet: ``_layout``) or else, with a ``store``, into
    the store."""
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
            data = read_whole(fd, path, st.st_size)
            sha = hashlib.sha256(data).hexdigest()
            if layer is not None and layer.write(rel, data, mode):
                pass  # linked into the store after the env is ready (``_layout``)
            elif store is not None:
                _blobs.write_blob(store, blob_name(sha, mode), data, len(data), mode)
        else:
            sha = hash_chunks(fd, path, st.st_size, store, mode, layer, rel)
    except OSError as exc:
        full = disk_error(exc, store, path) if store is not None else None
        if full is None:
            raise
        raise full from exc
    finally:
        os.close(fd)
    _statcache.record(path, st, sha, started)
    return sha


#: Errors of the disk under the store, not of the file read: the cache is unusable.
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


def disk_error(exc: OSError, store: str, path: str) -> CacheUnavailable | None:
    """``exc`` as the cache's disk error (a full or read-only disk, naming the store and
    the file being stored), or None if it is not one. A tree's parse stored what it hashed:
    a full disk there is the cache's state, not a bad spec (it said "invalid spec")."""
    if exc.errno not in _DISK_ERRNOS:
        return None
    code = errno.errorcode.get(exc.errno or 0, "")
    head, blobs = os.path.split(store.rstrip(os.sep))
    # A cache's store is <root>/shared/blobs (``_store.blob_dir``): the error names the root.
    root = (
        os.path.dirname(head) if (os.path.basename(head), blobs) == ("shared", "blobs") else store
    )
    return CacheUnavailable(root, f"{exc.strerror} [{code}] while storing {path}")


def read_whole(fd: int, path: str, size: int) -> bytes:
    """Exactly ``size`` bytes of the regular file ``fd``: one read of one byte more, which a
    regular file answers with its ``size`` bytes and the end; anything else (a pseudo-file,
    a file being written, a file system that reads short) is read again from the start,
    chunk by chunk, which says why it is a ``BadFile`` or reads it whole."""
    data = os.read(fd, size + 1)
    if len(data) == size:
        return data
    os.lseek(fd, 0, os.SEEK_SET)
    return b"".join(exact_chunks(fd, path, size, size or 1))


def hash_chunks(
    fd: int,
    path: str,
    size: int,
    store: str | None,
    mode: int,
    layer: Layer | None = None,
    rel: str = "",
) -> str:
    digest = hashlib.sha256()
    out = layer.open(rel, mode) if layer is not None else None
    sink = _blobs.BlobSink(store, mode) if store is not None and out is None else None
    whole = False
    try:
        for chunk in exact_chunks(fd, path, size, _CHUNK):
            digest.update(chunk)
            if out is not None and layer is not None:
                try:
                    _blobs.write_all(out, chunk)
                except OSError:  # a full disk: no lay-out (its build stores the file)
                    layer.close(out, mode, ok=False, rel=rel)
                    out = None
            elif sink is not None:
                sink.write(chunk)
        sha = digest.hexdigest()
        if sink is not None:
            sink.commit(blob_name(sha, mode))
        whole = True
    finally:
        if sink is not None:
            sink.abort()
        if out is not None and layer is not None:
            layer.close(out, mode, ok=whole, rel=rel)
    return sha
