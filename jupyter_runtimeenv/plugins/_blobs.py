"""Blobs: the files of the content store, one per (content, read-only mode).

Who calls it: ``_hashing`` (storing content while it hashes it, one read per file),
``_store`` (laying trees out, verifying blobs before they are linked again) and the Dask
manifest (blobs received from the driver). Everything here blocks.

A blob lives at ``<store>/<sha[:2]>/<name>`` (``FileEntry.blob_name``), read-only, with the
mtime ``BLOB_MTIME_NS``. Trees link their files to blobs, so anything that writes through a
link (a task that makes its copy writable and rewrites it in place) changes the blob: a blob
whose size, mode or mtime is not what it was stored with is *touched*, and is hashed again
before any new tree links it (``verify``); if its content changed it leaves the store. The
worker side of the same guard is ``workers/_cow.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import threading
import uuid
from collections.abc import Callable

from .._umask import read_umask

#: The mtime every blob carries; any other mtime means it was modified after storing.
BLOB_MTIME_NS = 1_000_000_000 * 10**9
_STAMP = (BLOB_MTIME_NS, BLOB_MTIME_NS)
_CHUNK = 1 << 20
#: Fills a new file through its descriptor.
_Fill = Callable[[int], None]
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)

__all__ = [
    "BLOB_MTIME_NS",
    "BlobSink",
    "copy_in",
    "create_at",
    "path_in",
    "relative",
    "seal",
    "valid",
    "verify",
    "write_all",
    "write_blob",
]


def relative(name: str) -> str:
    """The path of blob ``name`` relative to the store directory (for ``dir_fd`` calls)."""
    return f"{name[:2]}{os.sep}{name}"


def path_in(store: str, name: str) -> str:
    """The path of blob ``name`` in the store directory ``store``."""
    return f"{store}{os.sep}{relative(name)}"


def valid(st: os.stat_result, size: int, mode: int) -> bool:
    """Whether a blob with this stat is as it was stored (not touched)."""
    return (
        st.st_size == size
        and st.st_mtime_ns == BLOB_MTIME_NS
        and stat.S_IMODE(st.st_mode) == mode
        and stat.S_ISREG(st.st_mode)
    )


# Read once, without setting it (``_umask``). Unknown: assume every bit may be masked (a
# mask of 0 is a mask: no ``or``).
_READ_UMASK = read_umask()
_UMASK = 0o777 if _READ_UMASK is None else _READ_UMASK
_shards: set[str] = set()
_shards_lock = threading.Lock()


def _open_new(path: str, mode: int) -> int:
    """Create ``path`` (O_EXCL), making its shard directory the first time."""
    try:
        return os.open(path, _CREATE, mode)
    except FileNotFoundError:
        shard = os.path.dirname(path)
        os.makedirs(shard, exist_ok=True)
        with _shards_lock:
            _shards.add(shard)
        return os.open(path, _CREATE, mode)


def _finish(fd: int, mode: int) -> None:
    if mode & _UMASK:
        os.fchmod(fd, mode)
    os.utime(fd, ns=_STAMP)


def create_at(dir_fd: int, rel: str, mode: int) -> int:
    """A new file ``rel`` (relative to the directory ``dir_fd``) to be written as a blob is:
    ``seal`` it when it is whole. ``FileExistsError`` if ``rel`` is there."""
    return os.open(rel, _CREATE, mode, dir_fd=dir_fd)


def seal(fd: int, mode: int) -> None:
    """Give the whole file ``fd`` a blob's mode and stamp: from then on ``valid`` says it
    holds what was written, until something writes to it (which moves its mtime)."""
    _finish(fd, mode)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of ``data`` to ``fd``."""
    _write_all(fd, data)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_blob(store: str, name: str, data: bytes | memoryview, size: int, mode: int) -> bool:
    """Store ``data`` (whose sha256 ``name`` starts with) unless a valid blob is there;
    returns whether it wrote. The bytes were hashed in memory, so the blob is written in
    place (no temporary name): it becomes valid only when its mtime is stamped, last."""
    path = path_in(store, name)
    try:
        fd = _open_new(path, mode)
    except FileExistsError:
        return _replace_if_touched(path, size, mode, lambda fd: _write_all(fd, data))
    try:
        _write_all(fd, data)
        _finish(fd, mode)
    except BaseException:
        _unlink_own(path, fd)
        raise
    finally:
        os.close(fd)
    return True


def _unlink_own(path: str, fd: int) -> None:
    """Remove ``path`` if it is still the file open as ``fd`` (a failed write)."""
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            os.unlink(path)


def _replace_if_touched(path: str, size: int, mode: int, fill: _Fill) -> bool:
    try:
        st: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and valid(st, size, mode):
        return False
    _atomic(path, mode, fill)
    return True


def _atomic(path: str, mode: int, fill: _Fill) -> None:
    """Write a new file through ``fill`` and rename it over ``path``: a concurrent build
    linking ``path`` sees the old file or the new one, whole."""
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    fd = _open_new(tmp, mode)
    try:
        fill(fd)
        _finish(fd, mode)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    finally:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def copy_in(store: str, name: str, source: str, expected: os.stat_result, mode: int) -> bool:
    """Copy ``source`` into the store as blob ``name`` without reading it here (the kernel
    copies: ``copy_file_range``, a reflink where the file system has them), trusting the
    stat cache that ``source`` with the stat ``expected`` holds that content. Returns False,
    storing nothing, if ``source`` is not that file any more (the caller hashes it)."""
    path = path_in(store, name)
    try:
        if valid(os.lstat(path), expected.st_size, mode):
            return True
    except FileNotFoundError:
        pass
    src = os.open(source, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        if _key(os.fstat(src)) != _key(expected):
            return False
        changed = False

        def fill(fd: int) -> None:
            nonlocal changed
            _copy_fd(src, fd, expected.st_size)
            changed = _key(os.fstat(src)) != _key(expected)
            if changed:
                raise _Changed

        try:
            _atomic(path, mode, fill)
        except (_Changed, OSError):
            return False  # the caller reads and hashes it (and meets any real I/O error)
        return True
    finally:
        os.close(src)


class _Changed(Exception):
    """The source changed while it was copied (internal to ``copy_in``)."""


def _key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _copy_fd(src: int, dst: int, size: int) -> None:
    copy_file_range = getattr(os, "copy_file_range", None)  # Linux only
    if copy_file_range is not None:
        left = size
        try:
            while left > 0:
                done = copy_file_range(src, dst, left)
                if done == 0:
                    break
                left -= done
            if left == 0:
                return
        except OSError:  # EXDEV on old kernels, ENOSYS, EINVAL on some file systems
            pass
    os.lseek(src, 0, os.SEEK_SET)
    os.lseek(dst, 0, os.SEEK_SET)
    os.ftruncate(dst, 0)
    copied = 0
    while chunk := os.read(src, _CHUNK):
        _write_all(dst, chunk)
        copied += len(chunk)
    if copied != size:
        raise OSError(f"short copy ({copied} of {size} bytes)")


class BlobSink:
    """A large file stored while it is hashed in chunks: its name is known only at the end."""

    def __init__(self, store: str, mode: int) -> None:
        self.store = store
        self.mode = mode
        self.size = 0
        self._tmp = f"{store}{os.sep}.in-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        try:
            self._fd = os.open(self._tmp, _CREATE, mode)
        except FileNotFoundError:
            os.makedirs(store, exist_ok=True)
            self._fd = os.open(self._tmp, _CREATE, mode)

    def write(self, chunk: bytes) -> None:
        _write_all(self._fd, chunk)
        self.size += len(chunk)

    def commit(self, name: str) -> None:
        """Move the data in as blob ``name``, unless a valid blob is there already."""
        try:
            path = path_in(self.store, name)
            try:
                if valid(os.lstat(path), self.size, self.mode):
                    return
            except FileNotFoundError:
                os.makedirs(os.path.dirname(path), exist_ok=True)
            _finish(self._fd, self.mode)
            os.replace(self._tmp, path)
        finally:
            self.abort()

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._tmp)


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest()


def verify(store: str, name: str, sha256: str, size: int, mode: int) -> bool:
    """Whether blob ``name`` may be linked into a new tree.

    An untouched blob may. A touched one is hashed again: the same content gets its mode and
    mtime back; other content (written through a link) leaves the store: the trees that
    share it keep their inode, new trees get the content stored anew.
    """
    path = path_in(store, name)
    try:
        st = os.lstat(path)  # a blob replaced by a symlink is not followed
    except FileNotFoundError:
        return False
    if valid(st, size, mode):
        return True
    try:
        same = stat.S_ISREG(st.st_mode) and st.st_size == size and sha256_of(path) == sha256
    except OSError:
        same = False
    if same:
        os.chmod(path, mode)
        os.utime(path, ns=_STAMP)
        return True
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return False
