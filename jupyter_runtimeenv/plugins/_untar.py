"""Safe unpacking of ``.tar.gz``/``.tgz``/``.tar`` archives, the sibling of ``_unpack``'s zip.

Who calls it: ``_sources`` (for ``working_dir`` and ``py_modules``), through
``build.to_thread`` (it blocks).

Member names go through the same checks as a zip's (``_unpack``): absolute names, drives and
``..`` are refused, and nothing is written where the real parent directory lies outside the
root. Beyond what a zip can hold, a tar can hold hard links, devices and fifos:

- devices, fifos and other special members are refused;
- a hard link must name a regular file unpacked earlier in the same archive; its content is
  copied (a link to a file outside the root is impossible by construction);
- symlinks are created last, after every file and directory, so nothing is ever written
  through one; then each link is resolved against the real file system as it finally is
  (chains included) and the archive is refused if any points outside the root.
"""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path

from ..errors import BuildError
from ._unpack import _check_inside, _inside, _member_path

__all__ = ["TAR_SUFFIXES", "is_tar", "safe_untar"]

TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar")


def is_tar(name: str) -> bool:
    return name.endswith(TAR_SUFFIXES)


def safe_untar(archive: str | Path, dest: Path) -> int:
    """Extract the tar ``archive`` into ``dest`` (which exists); returns the bytes written.

    ``BuildError`` naming the member for anything that would land or point outside ``dest``.
    """
    root = os.path.realpath(dest)
    links: list[tuple[str, str, str]] = []  # (path, target, member name), made last
    try:
        with tarfile.open(archive, "r:*") as tf:
            written = _extract(tf, root, links)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BuildError(f"{archive} is not a readable tar archive: {exc}") from exc
    _make_links(root, links)
    return written


def _extract(tf: tarfile.TarFile, root: str, links: list[tuple[str, str, str]]) -> int:
    """Unpack every member but symlinks (collected in ``links``); returns bytes written."""
    written = 0
    files: dict[str, str] = {}  # member path -> where its regular file was written
    for member in tf:
        rel = _member_path(member.name)
        if rel is None:
            continue
        out = os.path.join(root, *rel.parts)
        _check_inside(root, os.path.dirname(out), member.name)
        if member.isdir():
            os.makedirs(out, exist_ok=True)
            continue
        if member.issym():
            os.makedirs(os.path.dirname(out), exist_ok=True)  # no links exist yet
            if os.path.isabs(member.linkname):
                raise BuildError(
                    f"refusing to unpack {member.name!r}: it is a symlink to the"
                    f" absolute path {member.linkname!r}"
                )
            links.append((out, member.linkname, member.name))
            continue
        os.makedirs(os.path.dirname(out), exist_ok=True)
        if member.islnk():
            source = _hardlink_source(member, files)
            _replace_file(out, member.name)
            shutil.copyfile(source, out)
            shutil.copymode(source, out)
            written += os.path.getsize(out)
            files[rel.as_posix()] = out
            continue
        if not member.isfile():
            raise BuildError(
                f"refusing to unpack {member.name!r}: devices, fifos and other"
                " special files are not allowed in an archive"
            )
        _replace_file(out, member.name)
        src = tf.extractfile(member)
        if src is None:  # pragma: no cover - a regular member always has data
            raise BuildError(f"cannot read {member.name!r} from the archive")
        with src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        written += member.size
        os.chmod(out, 0o755 if member.mode & 0o111 else 0o644)
        files[rel.as_posix()] = out
    return written


def _hardlink_source(member: tarfile.TarInfo, files: dict[str, str]) -> str:
    target = _member_path(member.linkname)
    source = files.get(target.as_posix()) if target is not None else None
    if source is None:
        raise BuildError(
            f"refusing to unpack {member.name!r}: it is a hard link to {member.linkname!r},"
            " which is not a file unpacked earlier from the archive"
        )
    return source


def _replace_file(out: str, name: str) -> None:
    if os.path.lexists(out):
        if os.path.islink(out) or os.path.isdir(out):
            raise BuildError(f"refusing to unpack {name!r} over a link or a directory")
        os.unlink(out)


def _make_links(root: str, links: list[tuple[str, str, str]]) -> None:
    for out, target, name in links:
        _check_inside(root, os.path.dirname(out), name)
        try:
            os.symlink(target, out)
        except OSError as exc:
            raise BuildError(f"refusing to unpack {name!r}: {exc.strerror or exc}") from exc
    # Each link resolved on the final tree: a chain through links made later counts too.
    for out, target, name in links:
        if not _inside(root, os.path.realpath(out)):
            raise BuildError(
                f"refusing to unpack {name!r}: it is a symlink to {target!r}, which leads"
                " outside the archive's root"
            )
