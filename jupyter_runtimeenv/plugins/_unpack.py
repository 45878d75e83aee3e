"""Safe unpacking of archives for ``working_dir`` and ``py_modules``.

Who calls it: those plugins' ``create``, through ``build.to_thread`` (it blocks). Any archive
reader (zip here; tar and wheel readers the same way) feeds its members to one
``SafeTree``, which owns every rule below, so the rules live in one place.

An archive comes from a user or a web server. The rule (zip-slip and symlink escapes):

- a member's name must be relative, without ``..`` and without a drive;
- nothing is written through a symlink that leads outside the root: before each write the
  parent directory is resolved against the real file system as it stands (``realpath``
  follows every link already extracted, chains included), and the member itself is never
  a symlink (files are opened ``O_NOFOLLOW | O_EXCL``);
- a symlink member is kept only if it stays inside the root after full resolution: its
  target must be relative, and resolving it on disk must land inside. Because a link
  extracted later can change how an earlier one resolves (``a -> x/y/../..`` is inside
  while ``x`` does not exist, and escapes once ``x -> .`` appears), every link is resolved
  again when the archive is complete (``SafeTree.finish``), when the file system no
  longer changes; one link outside fails the whole archive.

Why not refuse links outright: real projects ship them (``lib.so -> lib.so.1``, a shared
``data`` directory linked into two packages), and a link that resolves inside the
finished tree gives a worker nothing it could not read anyway. Why not only check the text
of the target: chains of links defeat it (that was the bug).

Hardlinks (tar) are accepted only to a regular file already extracted inside the root.
Modes: the executable bit and owner-only access are kept (a 0600 member stays 0600);
nothing is made wider than the archive says, and nothing group/other-writable.

An archive is also bounded (``ArchiveLimits``, from the environment, defaults below): the
bytes it unpacks to, its number of members, and the ratio of unpacked bytes to the
archive's own size once past ``RATIO_FLOOR`` (a 1 MB zip that unpacks to 1 GiB is a bomb,
not a project). Bytes are counted as they are written, so one huge member stops at the
limit; a zip's central directory (member count, declared sizes, which zipfile enforces) is
checked before anything is written, before ``zipfile`` even loads it.
"""

from __future__ import annotations

import os
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from ..errors import BuildError

__all__ = [
    "ArchiveLimits",
    "SafeTree",
    "check_links",
    "check_zip",
    "flatten_single_dir",
    "member_path",
    "safe_unzip",
]

MAX_UNPACKED_VAR = "JUPYTER_RUNTIMEENV_MAX_UNPACKED_BYTES"
MAX_MEMBERS_VAR = "JUPYTER_RUNTIMEENV_MAX_ARCHIVE_MEMBERS"
MAX_RATIO_VAR = "JUPYTER_RUNTIMEENV_MAX_ARCHIVE_RATIO"
#: Below this many unpacked bytes the ratio is not checked (small archives of zeros are fine).
RATIO_FLOOR = 64 * 2**20
_CHUNK = 1 << 20


def _mib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


@dataclass(frozen=True)
class ArchiveLimits:
    """What one archive (``working_dir``/``py_modules``) may unpack to."""

    #: Bytes written in all (default 2 GiB: four times the 500 MiB a local directory may hold).
    max_bytes: int = 2 * 2**30
    #: Members (files, directories, links).
    max_members: int = 100_000
    #: Unpacked bytes per byte of archive, once past ``RATIO_FLOOR``.
    max_ratio: float = 100.0

    @classmethod
    def from_env(cls) -> ArchiveLimits:
        """The defaults, each overridden by its variable (``$JUPYTER_RUNTIMEENV_MAX_*``)."""
        default = cls()
        return cls(
            max_bytes=int(os.environ.get(MAX_UNPACKED_VAR) or default.max_bytes),
            max_members=int(os.environ.get(MAX_MEMBERS_VAR) or default.max_members),
            max_ratio=float(os.environ.get(MAX_RATIO_VAR) or default.max_ratio),
        )

    def check_bytes(self, name: str, written: int, archive_size: int) -> None:
        if written > self.max_bytes:
            raise BuildError(
                f"{name} unpacks to more than {_mib(self.max_bytes)}, the limit"
                f" (${MAX_UNPACKED_VAR})"
            )
        if written > RATIO_FLOOR and written > self.max_ratio * max(archive_size, 1):
            raise BuildError(
                f"{name} unpacks to more than {self.max_ratio:g} times its own size"
                f" ({_mib(archive_size)} to over {_mib(written)}): an archive bomb? The limit"
                f" is ${MAX_RATIO_VAR}"
            )

    def check_members(self, name: str, count: int) -> None:
        if count > self.max_members:
            raise BuildError(
                f"{name} has more than {self.max_members} members, the limit (${MAX_MEMBERS_VAR})"
            )


def member_path(name: str) -> PurePosixPath | None:
    """The member's relative path, ``None`` for the root itself; ``BuildError`` for names
    that are absolute, have a drive or ``..`` components, or hold a NUL."""
    normalized = name.replace("\\", "/")
    path = PurePosixPath(normalized)
    if "\0" in normalized:
        raise BuildError(f"refusing to unpack {name!r}: NUL in a member name")
    if normalized.startswith("/") or (len(normalized) > 1 and normalized[1] == ":"):
        raise BuildError(f"refusing to unpack {name!r}: absolute paths are not allowed")
    if ".." in path.parts:
        raise BuildError(f"refusing to unpack {name!r}: '..' is not allowed in an archive member")
    parts = [p for p in path.parts if p not in ("", ".")]
    return PurePosixPath(*parts) if parts else None


def file_mode(mode: int | None) -> int:
    """The mode a member's file gets: executable bit and owner-only access kept."""
    perm = (mode or 0) & 0o777
    executable = bool(perm & 0o111)
    if perm and not perm & 0o077:  # owner-only in the archive: owner-only on disk
        return 0o700 if executable else 0o600
    return 0o755 if executable else 0o644


class SafeTree:
    """Writes archive members below ``root`` (an existing directory), refusing anything
    that would be written or point outside it. Call ``finish()`` after the last member."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        limits: ArchiveLimits | None = None,
        name: str = "the archive",
        archive_size: int = 0,
    ) -> None:
        self.root = os.path.realpath(root)
        self.written = 0
        self.members = 0
        self.limits = limits or ArchiveLimits.from_env()
        self.name = name
        self.archive_size = archive_size
        self._links: list[tuple[str, str]] = []  # (path on disk, member name)

    def _count(self) -> None:
        self.members += 1
        self.limits.check_members(self.name, self.members)

    # -- members ----------------------------------------------------------------------------

    def directory(self, name: str) -> None:
        self._count()
        rel = member_path(name)
        if rel is None:
            return
        out = os.path.join(self.root, *rel.parts)
        self._check_parent(out, name)
        if os.path.lexists(out) and not os.path.isdir(out):
            raise BuildError(f"refusing to unpack {name!r}: a file of that name was unpacked")
        os.makedirs(out, exist_ok=True)
        self._check_resolves_inside(out, name, "it would be written outside the root")

    def file(self, name: str, data: IO[bytes], mode: int | None = None) -> int:
        """Write a regular file from ``data``; returns the bytes written (counted as they
        are written: a member past the limits stops there)."""
        self._count()
        out = self._out(name, "a file")
        self._check_parent(out, name, create=True)
        self._replace(out, name)
        fd = os.open(
            out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600
        )
        size = 0
        with os.fdopen(fd, "wb") as dst:
            while chunk := data.read(_CHUNK):
                size += len(chunk)
                self.written += len(chunk)
                self.limits.check_bytes(self.name, self.written, self.archive_size)
                dst.write(chunk)
        os.chmod(out, file_mode(mode))
        return size

    def symlink(self, name: str, target: str) -> None:
        self._count()
        out = self._out(name, "a symlink")
        if not target or "\0" in target:
            raise BuildError(f"refusing to unpack {name!r}: a symlink with an empty or bad target")
        if os.path.isabs(target) or target.replace("\\", "/").startswith("/"):
            raise BuildError(
                f"refusing to unpack {name!r}: it is a symlink to {target!r}, outside the"
                " archive's root (absolute links are not allowed)"
            )
        self._check_parent(out, name, create=True)
        self._replace(out, name)
        self._check_link_target(os.path.join(os.path.dirname(out), target), name, target)
        os.symlink(target, out)
        self._links.append((out, name))

    def hardlink(self, name: str, target_member: str) -> None:
        """A hardlink to an earlier member (tar): only to a regular file inside the root."""
        self._count()
        out = self._out(name, "a hardlink")
        source = self._out(target_member, "a hardlink target")
        real = os.path.realpath(source)
        if not _inside(self.root, real) or not os.path.isfile(real):
            raise BuildError(
                f"refusing to unpack {name!r}: a hardlink to {target_member!r}, which is not"
                " a file unpacked inside the archive's root"
            )
        self._check_parent(out, name, create=True)
        self._replace(out, name)
        os.link(real, out)

    def finish(self) -> int:
        """Resolve every symlink again in the complete tree; returns the bytes written."""
        for out, name in self._links:
            target = os.readlink(out)
            self._check_link_target(out, name, target)
        return self.written

    # -- checks -----------------------------------------------------------------------------

    def _out(self, name: str, what: str) -> str:
        rel = member_path(name)
        if rel is None:
            raise BuildError(f"refusing to unpack {name!r}: {what} cannot be the root itself")
        return os.path.join(self.root, *rel.parts)

    def _check_parent(self, out: str, name: str, *, create: bool = False) -> None:
        # realpath of the parent: a symlink unpacked earlier (or a chain of them) must not
        # redirect this member outside. Resolved on disk, as open() would.
        parent = os.path.dirname(out)
        self._check_resolves_inside(parent, name, "it would be written outside the root")
        if create:
            os.makedirs(parent, exist_ok=True)
            self._check_resolves_inside(parent, name, "it would be written outside the root")

    def _check_resolves_inside(self, path: str, name: str, why: str) -> None:
        if not _inside(self.root, os.path.realpath(path)):
            raise BuildError(f"refusing to unpack {name!r}: {why}")

    def _check_link_target(self, link_path: str, name: str, target: str) -> None:
        if not _inside(self.root, os.path.realpath(link_path)):
            raise BuildError(
                f"refusing to unpack {name!r}: it is a symlink to {target!r}, which resolves"
                " outside the archive's root"
            )

    def _replace(self, out: str, name: str) -> None:
        """A later member of the same name replaces a file, never a link or a directory."""
        if not os.path.lexists(out):
            return
        st = os.lstat(out)
        if stat.S_ISLNK(st.st_mode):
            raise BuildError(f"refusing to unpack {name!r} through a symlink")
        if stat.S_ISDIR(st.st_mode):
            raise BuildError(f"refusing to unpack {name!r}: a directory of that name exists")
        os.unlink(out)


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def check_zip(archive: str | Path, limits: ArchiveLimits | None = None) -> zipfile.ZipFile:
    """The open zip ``archive`` once its central directory is within ``limits``: its member
    count (read from the end record before ``zipfile`` loads every entry) and the sum of
    its members' declared sizes (which ``zipfile`` enforces while reading)."""
    limits = limits or ArchiveLimits.from_env()
    name = os.path.basename(str(archive))
    size = os.path.getsize(archive)
    try:
        with open(archive, "rb") as f:
            end = zipfile._EndRecData(f)  # type: ignore[attr-defined]
    except OSError as exc:
        raise BuildError(f"{name} is not a readable zip file: {exc}") from exc
    if end is not None:
        limits.check_members(name, int(end[zipfile._ECD_ENTRIES_TOTAL]))  # type: ignore[attr-defined]
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as exc:
        raise BuildError(f"{name} is not a readable zip file: {exc}") from exc
    try:
        infos = zf.infolist()
        limits.check_members(name, len(infos))
        limits.check_bytes(name, sum(i.file_size for i in infos), size)
    except BaseException:
        zf.close()
        raise
    return zf


def safe_unzip(archive: str | Path, dest: Path, limits: ArchiveLimits | None = None) -> int:
    """Extract ``archive`` into ``dest`` (which exists); returns the bytes written.

    ``BuildError`` naming the member for anything that would land or point outside ``dest``,
    or naming the limit an archive passes.
    """
    limits = limits or ArchiveLimits.from_env()
    zf = check_zip(archive, limits)
    tree = SafeTree(
        dest,
        limits=limits,
        name=os.path.basename(str(archive)),
        archive_size=os.path.getsize(archive),
    )
    with zf:
        for info in zf.infolist():
            mode = (info.external_attr >> 16) & 0xFFFF
            if info.is_dir():
                tree.directory(info.filename)
            elif stat.S_ISLNK(mode):
                target = zf.read(info).decode("utf-8", "surrogateescape")
                tree.symlink(info.filename, target)
            else:
                with zf.open(info) as src:
                    tree.file(info.filename, src, mode if info.create_system == 3 else None)
    return tree.finish()


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
    # One level up, a link that climbed out of the top directory (``top/l -> ../x``, inside
    # when unpacked) now climbs out of ``dest``: every link is resolved again.
    check_links(dest)


def check_links(root: str | os.PathLike[str]) -> None:
    """``BuildError`` if any symlink below ``root`` resolves outside it (links are not
    followed while walking)."""
    real_root = os.path.realpath(root)
    for dirpath, dirs, files in os.walk(real_root):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) and not _inside(real_root, os.path.realpath(path)):
                rel = os.path.relpath(path, real_root)
                raise BuildError(
                    f"refusing to unpack {rel!r}: it is a symlink to {os.readlink(path)!r},"
                    " which resolves outside the archive's root"
                )
