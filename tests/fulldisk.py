"""A directory the cache cannot write to, made for real: a full file system if possible.

As root where ``mount -t tmpfs`` works (the test containers), ``full_disk`` mounts a tiny
tmpfs and fills it until the kernel answers ENOSPC: a real full disk. Elsewhere it falls
back to a read-only directory (mode 0500, which only binds non-root users): a real
unwritable cache, the same class of failure. ``kind`` says which one a test got.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

__all__ = ["filling_disk", "full_disk"]


def _can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


def _fill(mount: Path) -> None:
    block = b"\0" * 4096
    with open(mount / "filler", "wb", buffering=0) as f:
        while True:
            try:
                f.write(block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return


@contextlib.contextmanager
def full_disk(
    where: Path, prepare: Callable[[Path], None] | None = None, size: str = "2m"
) -> Iterator[tuple[Path, str]]:
    """(a directory on a full or unwritable file system, "tmpfs" or "read-only").

    ``prepare(path)`` runs while there is still room (e.g. to create a cache first).
    """
    mount = where / "disk"
    mount.mkdir()
    mounted = False
    if _can_mount():
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mount)],
            capture_output=True,
            text=True,
        )
        mounted = result.returncode == 0
    if not mounted and os.geteuid() == 0:
        # Root writes through any mode: without a mount there is no unwritable directory.
        pytest.skip("running as root where tmpfs cannot be mounted: no way to fill a disk")
    try:
        if prepare is not None:
            prepare(mount)
        if mounted:
            _fill(mount)
            yield mount, "tmpfs"
        else:
            for dirpath, dirs, _files in os.walk(mount):
                for name in dirs:
                    os.chmod(os.path.join(dirpath, name), 0o500)
            os.chmod(mount, 0o500)
            yield mount, "read-only"
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mount)], check=False)
        else:
            for dirpath, dirs, _files in os.walk(mount):
                for name in dirs:
                    os.chmod(os.path.join(dirpath, name), 0o755)
            os.chmod(mount, 0o755)


@contextlib.contextmanager
def filling_disk(where: Path, size: str = "8m") -> Iterator[tuple[Path, Callable[[], None]]]:
    """(a tmpfs with room, ``fill()`` that fills it until ENOSPC): a disk that becomes full
    while something runs on it. Skips where no tmpfs can be mounted (not root, no mount)."""
    mount = where / "disk"
    mount.mkdir()
    if not _can_mount():
        pytest.skip("needs root and mount(8): a disk that fills while the server runs")
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount, lambda: _fill(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
