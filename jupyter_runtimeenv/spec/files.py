"""Bounded reads of the files a spec names: requirements and environment files, spec files,
archives, and every file of a ``working_dir``/``py_modules`` tree while it is hashed.

Who calls it: ``spec.parse`` (spec files), ``plugins._requirements`` and ``plugins.conda``
(text files read at parse time), ``plugins._hashing`` (content hashes), ``spec.policy`` (an
interpreter's first bytes). Everything here blocks; parse runs in a thread.

A spec may name any path, and some paths never answer: ``open`` of a FIFO waits for a writer,
``/dev/zero`` never ends, ``/proc/kmsg`` blocks, and ``/proc``/``/sys`` files say they are
regular files of size 0 (or 4096) whatever they hold. So every read here:

- opens with ``O_NONBLOCK`` (a FIFO's open returns at once) and ``O_CLOEXEC``;
- checks the *descriptor* (``fstat``, not the path: nothing can be swapped in between) and
  refuses anything but a regular file, naming what it is;
- reads at most the size the descriptor reports, capped, and refuses a file whose content
  turns out longer or shorter than that (a pseudo-file, or a file being written).

Refusals are ``BadFile`` (a ``ValueError``) with one line naming the path and why; callers
turn it into a ``SpecError`` naming their field.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator

__all__ = [
    "MAX_TEXT_BYTES",
    "BadFile",
    "exact_chunks",
    "hash_regular",
    "kind_of_mode",
    "open_regular",
    "read_head",
    "read_text",
]

#: Requirements files, environment files and spec files are read whole, up to this size.
MAX_TEXT_BYTES = 4 * 2**20
_CHUNK = 1 << 20
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class BadFile(ValueError):
    """A file that is not read: not a regular file, too large, or changing while read."""


def kind_of_mode(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words (``a FIFO (named pipe)``)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def _open(path: str) -> tuple[int, os.stat_result]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise BadFile(f"{path}: cannot read it: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadFile(f"{path} is {kind_of_mode(st.st_mode)}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def open_regular(path: str, expected: os.stat_result) -> int:
    """A descriptor of the regular file ``path`` (opened non-blocking), which must be the
    file ``expected`` describes (same inode, device and size): ``BadFile`` otherwise.
    The caller closes it."""
    fd, st = _open(path)
    if (st.st_ino, st.st_dev, st.st_size) != (expected.st_ino, expected.st_dev, expected.st_size):
        os.close(fd)
        raise BadFile(f"{path} changed while it was read (a file being written?)")
    return fd


def exact_chunks(fd: int, path: str, size: int, chunk: int = _CHUNK) -> Iterator[bytes]:
    """Exactly ``size`` bytes of ``fd``, in chunks of at most ``chunk``; ``BadFile`` if the
    file holds more or fewer (a pseudo-file, a file being written)."""
    return _chunks(fd, path, size, chunk)


def _chunks(fd: int, path: str, size: int, chunk_size: int = _CHUNK) -> Iterator[bytes]:
    """Exactly ``size`` bytes of ``fd``, in chunks; ``BadFile`` if there are more or fewer."""
    left = size
    while left > 0:
        chunk = os.read(fd, min(chunk_size, left))
        if not chunk:
            raise BadFile(
                f"{path} is shorter than its size ({size} bytes) says: a pseudo-file"
                " (/proc, /sys) or a file being written"
            )
        left -= len(chunk)
        yield chunk
    if os.read(fd, 1):
        raise BadFile(
            f"{path} is longer than its size ({size} bytes) says: a pseudo-file (/proc,"
            " /sys) or a file being written"
        )


def read_text(path: str, *, limit: int = MAX_TEXT_BYTES, what: str = "file") -> str:
    """The UTF-8 text of the regular file ``path``, at most ``limit`` bytes."""
    fd, st = _open(path)
    try:
        if st.st_size > limit:
            raise BadFile(f"{path}: the {what} is {st.st_size} bytes; at most {limit} are read")
        data = b"".join(_chunks(fd, path, st.st_size))
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadFile(f"{path}: the {what} is not UTF-8 text") from None


def read_head(path: str, n: int) -> bytes:
    """The first ``n`` bytes (or fewer) of the regular file ``path``."""
    fd, _ = _open(path)
    try:
        return os.read(fd, n)
    finally:
        os.close(fd)


def hash_regular(path: str, expected: os.stat_result | None = None) -> tuple[str, int]:
    """(sha256, size) of the regular file ``path``; with ``expected`` (a ``stat`` of the same
    path), ``BadFile`` if what was opened is another file than the one stat'ed."""
    fd, st = _open(path)
    try:
        if expected is not None and (st.st_ino, st.st_dev, st.st_size) != (
            expected.st_ino,
            expected.st_dev,
            expected.st_size,
        ):
            raise BadFile(f"{path} changed while it was read (a file being written?)")
        digest = hashlib.sha256()
        for chunk in _chunks(fd, path, st.st_size):
            digest.update(chunk)
        return digest.hexdigest(), st.st_size
    finally:
        os.close(fd)
