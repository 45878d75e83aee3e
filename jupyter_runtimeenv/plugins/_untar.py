"""Safe unpacking of ``.tar.gz``/``.tgz``/``.tar`` archives: a tar reader feeding ``_unpack``'s
``SafeTree``, which owns every rule (member names, writes checked against the real file
system, symlinks resolved again in the finished tree, hardlinks only to files inside).

Who calls it: ``_sources`` (for ``working_dir`` and ``py_modules``), through
``build.to_thread`` (it blocks). What a tar can hold beyond a zip: hard links (``SafeTree``
takes them to regular files unpacked earlier), and devices, fifos and other special members,
which are refused here.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

from ..errors import BuildError
from ._unpack import ArchiveLimits, SafeTree

__all__ = ["TAR_SUFFIXES", "is_tar", "safe_untar"]

TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar")


def is_tar(name: str) -> bool:
    return name.endswith(TAR_SUFFIXES)


def safe_untar(archive: str | Path, dest: Path, limits: ArchiveLimits | None = None) -> int:
    """Extract the tar ``archive`` into ``dest`` (which exists); returns the bytes written.

    ``BuildError`` naming the member for anything that would land or point outside ``dest``,
    or naming the limit (``ArchiveLimits``) the archive passes: members are counted and bytes
    measured as the (compressed) stream is read, so a bomb stops at the limit.
    """
    tree = SafeTree(
        dest,
        limits=limits,
        name=os.path.basename(str(archive)),
        archive_size=os.path.getsize(archive),
    )
    try:
        with tarfile.open(archive, "r:*") as tf:
            for member in tf:
                _unpack_member(tf, member, tree)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BuildError(f"{archive} is not a readable tar archive: {exc}") from exc
    return tree.finish()


def _unpack_member(tf: tarfile.TarFile, member: tarfile.TarInfo, tree: SafeTree) -> None:
    if member.isdir():
        tree.directory(member.name)
    elif member.issym():
        tree.symlink(member.name, member.linkname)
    elif member.islnk():
        tree.hardlink(member.name, member.linkname)
    elif member.isfile():
        data = tf.extractfile(member)
        if data is None:  # pragma: no cover - a regular member always has data
            raise BuildError(f"cannot read {member.name!r} from the archive")
        with data:
            tree.file(member.name, data, member.mode)
    else:
        raise BuildError(
            f"refusing to unpack {member.name!r}: devices, fifos and other special files"
            " are not allowed in an archive"
        )
