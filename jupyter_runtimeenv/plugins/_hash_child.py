"""The hash helper's program: reads, hashes and writes files of a new tree's lay-out on a
core of its own (``_hashhelp``). Standard library only; run as ``python -I -S <this file>``.

Who runs it: ``_hashhelp.Helper`` (posix_spawn, its stdin and stdout are pipes to the
caller), or a child forked from a warm zygote template of the same interpreter, which loads
this file by path and calls ``main`` (``workers/_zygote.py``, ``_forks``). A job comes in
frames (length-prefixed ``marshal``), each a lay-out directory, the blob stamp, files to do
in that order, each (index, source, relative path, device, inode, size, mode), and whether
more frames of the job follow (the caller's walk sends the files it finds as it goes). A
file is *claimed* by creating it in the lay-out (``O_EXCL``): the caller claims the same
files from the other end of the list, so each file is done by exactly one of them, and the
first claim that finds the file there ends the job (they met: the frames still to come are
read and left). A claimed file is read once (non-blocking, checked on the descriptor to be
the regular file of that device, inode and size, read for exactly its size), hashed,
written, given its mode and the stamp; its (index, sha256, inode, ctime_ns) is in the job's
answer, sent after its last frame. Anything else (a file that changed, a read or write
error) removes the claimed file and leaves it out of the answer: the caller reads it itself,
and meets the error there. The program ends at the end of its input (the caller gone) or
after ``IDLE_S`` without a job (an argument ``0``: never, a helper its caller keeps ready
and ends itself, ``_hashhelp.keep``). It imports only the modules it uses (its start, ~15
ms, is on the path of a tree that finds no helper ready).

A job of one frame beginning with ``LINK`` is a spare tree to lay out (``link_tree``, for
``_spares``: a thousand ``link`` calls on this core, not in a thread of the caller's, where
each call gave the GIL back and waited for it again); its answer is None or the error.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import select
import stat
import struct
import sys

#: Seconds without a job after which the helper ends (the next job starts another).
IDLE_S = 20.0
#: The frames' length prefix, both ways (``_hashhelp`` reads and writes the same).
HEAD = struct.Struct("!I")
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
#: The first item of a link job's frame (a hash job's is its lay-out's absolute path).
LINK = "link"

File = tuple[int, str, str, int, int, int, int]
Done = tuple[int, str, int, int]


def read_exactly(fd: int, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def read_frame(fd: int) -> bytes | None:
    """The body of the next frame (a ``HEAD`` length, then that many bytes) read from ``fd``;
    None at the end of its input."""
    head = read_exactly(fd, HEAD.size)
    return read_exactly(fd, HEAD.unpack(head)[0]) if head is not None else None


def _copy(src: str, dev: int, ino: int, size: int, out: int) -> str | None:
    """sha256 of ``src`` written to ``out``; None if it is not that regular file whole."""
    fd = os.open(src, _READ)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino, st.st_size) != (dev, ino, size):
            return None
        data = os.read(fd, size + 1)
    finally:
        os.close(fd)
    if len(data) != size:
        return None
    sha = hashlib.sha256(data).hexdigest()
    view = memoryview(data)
    while view:
        view = view[os.write(out, view) :]
    return sha


def run(root: str, stamp: int, files: list[File], umask: int) -> list[Done]:
    """Do ``files`` in order until one is claimed already; what was done."""
    done: list[Done] = []
    _run(root, stamp, files, umask, done)
    return done


def _run(root: str, stamp: int, files: list[File], umask: int, done: list[Done]) -> bool:
    """``run``, adding to ``done``; whether it went through ``files`` without meeting a
    claimed one (the job's next frame is then done too)."""
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        for index, src, rel, dev, ino, size, mode in files:
            try:
                out = os.open(rel, _CREATE, mode, dir_fd=root_fd)
            except OSError:
                return False  # the caller came this far (or the lay-out takes no more)
            try:
                sha = _copy(src, dev, ino, size, out)
                if sha is not None:
                    if mode & umask:
                        os.fchmod(out, mode)
                    os.utime(out, ns=(stamp, stamp))
                    st = os.fstat(out)
            except Exception:
                sha = None
            finally:
                os.close(out)
            if sha is None:
                try:  # noqa: SIM105 (contextlib's imports were a fifth of this start)
                    os.unlink(rel, dir_fd=root_fd)
                except OSError:
                    pass
                continue
            done.append((index, sha, st.st_ino, st.st_ctime_ns))
    finally:
        os.close(root_fd)
    return True


def link_tree(store: str, path: str, dirs: list[str], links: list[tuple[str, str]]) -> str | None:
    """Make the directory ``path`` (its parent exists), its ``dirs`` (parents first) and
    each (blob, relative path) of ``links`` as a link to that blob of the blob directory
    ``store``: a spare tree. None, or the error that stopped it (the caller removes what
    was made)."""
    try:
        os.mkdir(path)
        store_fd = os.open(store, _DIR)
        try:
            root_fd = os.open(path, _DIR)
            try:
                for rel_dir in dirs:
                    os.mkdir(rel_dir, dir_fd=root_fd)
                link = os.link
                for blob, rel in links:
                    link(blob, rel, src_dir_fd=store_fd, dst_dir_fd=root_fd)
            finally:
                os.close(root_fd)
        finally:
            os.close(store_fd)
    except OSError as exc:
        return str(exc)
    return None


def main(idle_s: float | None = None) -> None:
    """The helper's life on its stdin and stdout: jobs until the end of its input, or
    ``idle_s`` (else its argument, else ``IDLE_S``; ``0``: never) without one. Called as
    the program, or in a child a warm template forked (``workers/_zygote.py``)."""
    # Only its pipes: no descriptor its spawner let be inherited keeps anything open.
    os.closerange(3, max(os.sysconf("SC_OPEN_MAX"), 3))
    umask = os.umask(0o077)
    os.umask(umask)
    if idle_s is None:
        idle_s = float(sys.argv[1]) if len(sys.argv) > 1 else IDLE_S
    while True:
        ready, _, _ = select.select([0], [], [], idle_s if idle_s > 0 else None)
        if not ready:
            return
        done: list[Done] = []
        reply: list[Done] | str | None = done
        going = more = True
        while more:  # the frames of one job
            body = read_frame(0)
            if body is None:
                return
            frame = marshal.loads(body)
            if frame[0] == LINK:  # a job of one frame
                reply = link_tree(*frame[1:])
                break
            root, stamp, files, more = frame
            going = going and _run(root, stamp, files, umask, done)
        answer = marshal.dumps(reply)
        view = memoryview(HEAD.pack(len(answer)) + answer)
        try:
            while view:
                view = view[os.write(1, view) :]
        except OSError:
            return  # the caller is gone


if __name__ == "__main__":
    main()
