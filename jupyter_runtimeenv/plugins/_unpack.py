"""Safe unzipping for ``working_dir`` and ``py_modules`` archives.

Who calls it: those plugins' ``create``, through ``build.to_thread`` (it blocks).

A zip comes from a user or a web server: its member names are refused when absolute, when
they have ``..`` components or a drive, and symlink members are refused when their target
leaves the extraction root (zip-slip). Files are never written through a symlink.
"""

from __future__ import annotations

import os
import shutil
import stat
import zipfile
from pathlib import Path, PurePosixPath

from ..errors import BuildError

__all__ = ["flatten_single_dir", "safe_unzip"]


def safe_unzip(archive: str | Path, dest: Path) -> int:
    """Extract ``archive`` into ``dest`` (which exists); returns the bytes written.

    ``BuildError`` naming the member for anything that would land outside ``dest``.
    """
    root = os.path.realpath(dest)
    written = 0
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as exc:
        raise BuildError(f"{archive} is not a readable zip file: {exc}") from exc
    with zf:
        for info in zf.infolist():
            rel = _member_path(info.filename)
            if rel is None:
                continue
            out = os.path.join(root, *rel.parts)
            _check_inside(root, os.path.dirname(out), info.filename)
            mode = (info.external_attr >> 16) & 0xFFFF
            if info.is_dir():
                os.makedirs(out, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(out), exist_ok=True)
            if stat.S_ISLNK(mode):
                target = zf.read(info).decode("utf-8", "surrogateescape")
                resolved = os.path.normpath(os.path.join(os.path.dirname(out), target))
                if os.path.isabs(target) or not _inside(root, resolved):
                    raise BuildError(
                        f"refusing to unpack {info.filename!r}: it is a symlink to {target!r},"
                        " outside the archive's root"
                    )
                os.symlink(target, out)
                continue
            if os.path.lexists(out):
                if os.path.islink(out):
                    raise BuildError(f"refusing to unpack {info.filename!r} through a symlink")
                os.unlink(out)
            with zf.open(info) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            written += info.file_size
            if mode & 0o111:
                os.chmod(out, 0o755)
    return written


def _member_path(name: str) -> PurePosixPath | None:
    """The member's relative path, ``None`` for the root itself; refuses escapes."""
    normalized = name.replace("\\", "/")
    path = PurePosixPath(normalized)
    if normalized.startswith("/") or (len(normalized) > 1 and normalized[1] == ":"):
        raise BuildError(f"refusing to unpack {name!r}: absolute paths are not allowed in a zip")
    if ".." in path.parts:
        raise BuildError(f"refusing to unpack {name!r}: '..' is not allowed in a zip member")
    parts = [p for p in path.parts if p not in ("", ".")]
    return PurePosixPath(*parts) if parts else None


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _check_inside(root: str, directory: str, name: str) -> None:
    # realpath of the parent: a symlink member unpacked earlier must not redirect later ones.
    if not _inside(root, os.path.realpath(directory)):
        raise BuildError(f"refusing to unpack {name!r}: it would be written outside the root")


def flatten_single_dir(dest: Path) -> None:
    """If ``dest`` holds exactly one directory and nothing else, move its content up.

    Zips made with ``zip -r dir.zip dir`` hold one top directory; Ray uses its content as
    the working directory, and so do we.
    """
    children = list(dest.iterdir())
    if len(children) != 1 or not children[0].is_dir() or children[0].is_symlink():
        return
    only = children[0]
    # Renamed first so that a member named like the directory itself cannot collide.
    holder = dest / f".flatten-{os.getpid()}"
    os.rename(only, holder)
    for child in holder.iterdir():
        os.rename(child, dest / child.name)
    holder.rmdir()
