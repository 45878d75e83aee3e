"""Downloaded archives, kept for the next env that names the same content.

Who calls it: ``_sources.create`` (in threads). Every env unpacks its own copy of an archive
``working_dir`` or ``py_modules`` (what its tasks write there must reach no other env), but
the download is done once: the archive is kept under ``<cache_root>/shared/downloads``, keyed
by its digest (an http(s) URL names its content; a remote URI's digest has its version), and
the least recently used are dropped past ``MAX_BYTES``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path

#: What the kept downloads may use together; the least recently used go first.
MAX_BYTES = 2 * 2**30

__all__ = ["MAX_BYTES", "cached", "keep"]


def _dir(cache_root: Path, digest: str) -> Path:
    return cache_root / "shared" / "downloads" / hashlib.sha256(digest.encode()).hexdigest()[:32]


def cached(cache_root: Path, digest: str, name: str) -> Path | None:
    """The kept archive of ``digest``, if there is one (marked as just used)."""
    path = _dir(cache_root, digest) / name
    try:
        os.utime(path)
    except FileNotFoundError:
        return None
    return path


def keep(cache_root: Path, digest: str, archive: Path) -> Path:
    """Move a finished download in; returns where it is kept. A twin kept meanwhile by
    another build wins (same content)."""
    home = _dir(cache_root, digest)
    home.parent.mkdir(parents=True, exist_ok=True)
    tmp = home.with_name(f".{home.name}.{os.getpid()}.tmp")
    tmp.mkdir()
    try:
        os.replace(archive, tmp / archive.name)
        try:
            os.rename(tmp, home)
        except OSError:
            if not (home / archive.name).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _prune(home.parent, keep=home)
    return home / archive.name


def _prune(root: Path, keep: Path, max_bytes: int = MAX_BYTES) -> None:
    kept: list[tuple[float, int, Path]] = []
    for entry in root.iterdir():
        if entry.name.startswith("."):
            continue
        with contextlib.suppress(OSError):
            files = [f for f in entry.iterdir() if f.is_file()]
            kept.append(
                (max(f.stat().st_mtime for f in files), sum(f.stat().st_size for f in files), entry)
                if files
                else (0.0, 0, entry)
            )
    total = sum(size for _, size, _ in kept)
    for _, size, entry in sorted(kept, key=lambda k: k[0]):
        if total <= max_bytes:
            break
        if entry != keep:
            shutil.rmtree(entry, ignore_errors=True)
            total -= size
