"""Keeping the cache private: an owner-only root, index and logs.

Who calls it: ``Cache`` when it opens a root, ``EnvLog`` when it writes a log. Blocking.

The index holds specs with their ``env_vars`` values, logs hold installer output, and
``working_dir`` trees may hold owner-only files: nobody but the owner may read the cache.

- A missing root is created 0700 (its missing parents get the usual mode).
- An existing root with group/other access is made 0700 with a logged warning when it is
  ours: owned by this user and either empty or already a cache (it holds ``index.sqlite``).
  Anything else is refused with ``CacheUnavailable``: a root owned by someone else, or a
  directory with other content (``--cache-dir ~`` must not chmod the home directory).
- The index, its ``-wal``/``-shm`` files (SQLite gives them the database's mode) and every
  log are created 0600.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

from ..errors import CacheUnavailable

log = logging.getLogger("jupyter_runtimeenv")

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
INDEX_NAME = "index.sqlite"

__all__ = [
    "PRIVATE_DIR",
    "PRIVATE_FILE",
    "describe",
    "prepare_root",
    "private_file",
    "tighten_index",
]


def describe(exc: BaseException, root: Path | None = None) -> str:
    """An OS or SQLite error in words: ``No space left on device [ENOSPC]``.

    SQLite often says only ``disk I/O error``: with ``root``, the file system is asked
    whether it is full or read-only, and the answer is added.
    """
    if isinstance(exc, OSError) and exc.strerror:
        code = errno.errorcode.get(exc.errno or 0, "")
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{f' [{code}]' if code else ''}{where}"
    text = str(exc) or type(exc).__name__
    if root is not None:
        try:
            fs = os.statvfs(root)
        except OSError:
            return text
        if fs.f_flag & os.ST_RDONLY:
            text += " (the file system is read-only)"
        elif fs.f_bavail == 0:
            text += " (no space left on the device)"
        elif not os.access(root, os.W_OK):
            text += " (the directory is not writable)"
    return text


def prepare_root(root: Path) -> None:
    """Make ``root`` an owner-only directory, or raise ``CacheUnavailable`` saying why."""
    where = str(root)
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            root.mkdir(mode=PRIVATE_DIR)
            os.chmod(root, PRIVATE_DIR)  # whatever the umask
            return
        except FileExistsError:
            pass
        st = os.stat(root)
    except OSError as exc:
        raise CacheUnavailable(where, describe(exc)) from exc
    if not stat.S_ISDIR(st.st_mode):
        raise CacheUnavailable(where, "it is not a directory")
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise CacheUnavailable(
            where, f"it is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
        )
    mode = stat.S_IMODE(st.st_mode)
    if not mode & 0o077:
        return
    try:
        entries = os.listdir(root)
    except OSError as exc:
        raise CacheUnavailable(where, describe(exc)) from exc
    if entries and INDEX_NAME not in entries:
        raise CacheUnavailable(
            where,
            f"it is accessible to others (mode {mode:04o}) and holds files that are not a"
            " cache; give an empty or new directory, or make it owner-only (chmod 700)",
        )
    try:
        os.chmod(root, PRIVATE_DIR)
    except OSError as exc:
        raise CacheUnavailable(where, describe(exc)) from exc
    log.warning(
        "jupyter_runtimeenv: the cache at %s was accessible to others (mode %04o);"
        " made it owner-only (0700)",
        where,
        mode,
    )


def private_file(path: Path) -> None:
    """Create ``path`` 0600 if it is missing; make it 0600 if it exists (older caches)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), PRIVATE_FILE)
    try:
        os.fchmod(fd, PRIVATE_FILE)
    finally:
        os.close(fd)


def tighten_index(root: Path) -> None:
    """The index and its SQLite companions 0600 (created so, or tightened if older)."""
    private_file(root / INDEX_NAME)
    for suffix in ("-wal", "-shm", "-journal"):
        companion = root / (INDEX_NAME + suffix)
        if companion.exists():
            os.chmod(companion, PRIVATE_FILE)
