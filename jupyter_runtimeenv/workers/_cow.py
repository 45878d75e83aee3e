"""Copy-on-write in a worker for the files its env's trees share with the content store.

Loaded by the worker bootstrap (``_entry.py``) by file path when ``TREES_VAR`` names the
env's trees (``working_dir``, ``py_modules``); standard library only.

An env's tree is made of hard links to read-only blobs (``plugins/_blobs.py``): cheap to
build, but a write through a link would reach every env sharing the blob, and the store.
Read-only bits stop a plain ``open(..., "w")`` for most users, not a task running as root
or one that ``chmod``-s first. So before any Python-level write to a file under a tree that
still shares its inode (``st_nlink > 1``) — ``open`` for writing (``io.open``, ``os.open``,
``pandas``' writers: all go through it), ``os.chmod``/``chown``/``truncate``/``utime``, the
extended attributes, ``sqlite3.connect`` — the file is replaced by a private copy (copied by
the kernel, renamed over it), and the write goes to the copy; a copy made for writing is
left owner-writable, as the user's own file was. What this cannot see (a subprocess, or C
code opening files itself, e.g. HDF5) is caught later: a touched blob is hashed again before
another tree links it (``_blobs.verify``).
"""

from __future__ import annotations

import _thread
import os
import stat
import sys

TREES_VAR = "JUPYTER_RUNTIMEENV_TREES"
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC
#: Audit events that change a file or its metadata; each has the path first.
_EVENTS = frozenset(
    (
        "open",
        "os.chmod",
        "os.chown",
        "os.truncate",
        "os.utime",
        "os.setxattr",
        "os.removexattr",
        "sqlite3.connect",
    )
)
_installed: list[tuple[str, ...]] = []


def install_from_env(environ: dict[str, str] | None = None) -> bool:
    """Install the guard for the trees ``TREES_VAR`` names, if any; whether it did."""
    raw = (os.environ if environ is None else environ).get(TREES_VAR, "")
    roots = [r for r in raw.split(os.pathsep) if r]
    if roots:
        install(roots)
    return bool(roots)


def install(roots: list[str]) -> None:
    """Guard the files below ``roots`` for the rest of this process (audit hooks cannot be
    removed; a second call adds roots to the first's)."""
    prefixes = tuple(os.path.realpath(r).rstrip(os.sep) + os.sep for r in roots)
    if _installed:
        _installed[0] = _installed[0] + prefixes
        return
    _installed.append(prefixes)
    busy: set[int] = set()
    get_ident = _thread.get_ident

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event not in _EVENTS:
            return
        if event == "open":
            flags = args[2]
            if not isinstance(flags, int) or not flags & _WRITES:
                return
        ident = get_ident()
        if ident in busy:
            return  # our own copy's open and rename
        path = args[0]
        if isinstance(path, int) or path is None:
            return  # a descriptor: its open was guarded
        busy.add(ident)
        try:
            _unshare(path, _installed[0], writable=event in ("open", "sqlite3.connect"))
        finally:
            busy.discard(ident)

    sys.addaudithook(hook)


def _unshare(path: object, prefixes: tuple[str, ...], *, writable: bool) -> None:
    try:
        name = os.fsdecode(path)  # type: ignore[arg-type]
    except TypeError:
        return
    if name in ("", ":memory:") or name.startswith("file:"):
        return  # sqlite3's in-memory and URI forms
    full = os.path.realpath(name)
    if not full.startswith(prefixes):
        return
    try:
        st = os.lstat(full)
    except OSError:
        return  # a new file: nothing shared
    if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2:
        return
    mode = stat.S_IMODE(st.st_mode) | (0o200 if writable else 0)
    tmp = f"{full}.jre-cow-{os.getpid()}-{_thread.get_ident()}"
    src = os.open(full, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            _copy(src, dst, st.st_size)
            os.fchmod(dst, mode)
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(dst)
        os.replace(tmp, full)
    except BaseException:
        try:  # noqa: SIM105 - contextlib is not imported in a worker for this
            os.unlink(tmp)
        except OSError:
            pass
        raise
    finally:
        os.close(src)


def _copy(src: int, dst: int, size: int) -> None:
    copy_file_range = getattr(os, "copy_file_range", None)  # Linux only
    if copy_file_range is not None:
        left = size
        try:
            while left > 0:
                done = copy_file_range(src, dst, left)
                if done == 0:
                    break
                left -= done
            if left == 0:  # a 0 before the end (some file systems): copy the plain way
                return
        except OSError:
            pass
    os.lseek(src, 0, os.SEEK_SET)
    os.lseek(dst, 0, os.SEEK_SET)
    os.ftruncate(dst, 0)
    while chunk := os.read(src, 1 << 20):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view) :]
