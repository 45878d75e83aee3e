"""A new tree's lay-out hashed on two cores: a helper process from the front, as the walk
finds the files, and this thread from the back once the walk is done.

Who calls it: ``_hashing._hash_tree`` (``Stream``), for a new tree read whole into a
``Layer`` (a source's first tree at parse, ``_layout``). Blocking.

Why a process: reading, hashing and writing a file is ~9 system calls, each releasing and
taking the GIL again, plus ~15 us of Python. Two threads of one process then hand the GIL
back and forth at every call, and on two cores a 1,000-file tree took as long on two threads
as on one (tmpfs, 2026-12-04: 77-96 vs 76-84 ms), while two processes did the bare loop in
half the time (28-40 vs 53-69 ms). So the helper (``_hash_child``, stdlib only, started once
per process: forked from a warm zygote template of this interpreter where one is up,
``_forks``, ~4 ms to its first answer, else a new interpreter, ``posix_spawn``, 15-30 ms;
ended after ``_hash_child.IDLE_S`` idle or at the end of its input) takes the files from the
front, sent to it directory by directory while the walk goes on, and this thread takes them
from the back after the walk; each file is claimed by creating it in the lay-out
(``O_EXCL``), so the two meet without talking. The helper's answer is each file it did:
(sha256, inode, ctime_ns as written); while an agent runs in this process it is not retired
(``keep``). Any file neither finished (a read or write error, a file that changed, the
helper gone) is then done here by ``_hashing``'s own path, which raises what it raises for
it; a failure here, or in the walk, stops the helper (SIGKILL) before the lay-out is
removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import marshal
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .. import _forks
from ..spec.files import BadFile, open_regular
from . import _blobs, _hash_child, _statcache
from ._blobs import BLOB_MTIME_NS
from ._hash_child import HEAD, LINK, read_frame
from ._layout import Layer

__all__ = [
    "ENV_VAR",
    "STREAM_FROM",
    "Helper",
    "Stream",
    "claim",
    "give_back",
    "keep",
    "take",
    "take_idle",
]

#: Set to 0 to hash every tree in this process's threads (no helper).
ENV_VAR = "JUPYTER_RUNTIMEENV_HASH_HELPER"
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux
#: Fits a job of ~10,000 files (the largest an unprivileged process may ask by default).
_PIPE_SIZE = 1 << 20
_CHILD = str(Path(__file__).with_name("_hash_child.py"))
#: How long ``take`` waits for the answer to a job the caller did whole.
_PENDING_S = 5.0
#: How long an idle helper is kept: then this process ends and reaps it (before the
#: helper's own ``_hash_child.IDLE_S``, 20 s, which is left for a caller that cannot: its
#: exit would leave a zombie until the next ``take`` or this process's end).
RETIRE_S = 15.0
#: Files larger than this are read in chunks by ``_hashing`` (never sent to the helper).
_WHOLE_MAX = 8 << 20


class Helper:
    """The helper process: ``pid`` and the two ends of its pipes. ``lasting``: it never
    ends itself for being idle (started while an agent runs, ``keep``: this process ends
    it)."""

    def __init__(self, lasting: bool = False) -> None:
        to_r, self.to_w = os.pipe()
        self.from_r, from_w = os.pipe()
        # A job is ~100 bytes a file: a pipe of the default 64 KiB would hold the sender
        # until the helper has read the rest (blocked while it is not scheduled).
        with contextlib.suppress(OSError):
            fcntl.fcntl(self.to_w, _F_SETPIPE_SZ, _PIPE_SIZE)
        try:
            idle_s = 0.0 if lasting else _hash_child.IDLE_S
            pid = _forks.fork_hash_helper(to_r, from_w, _CHILD, idle_s)
            self.pid = pid or os.posix_spawn(
                sys.executable,
                [sys.executable, "-I", "-S", _CHILD, *(["0"] if lasting else [])],
                os.environ,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, to_r, 0),
                    (os.POSIX_SPAWN_DUP2, from_w, 1),
                    (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                ],
            )
            #: Forked from a warm template (``_forks``), not spawned.
            self.forked = pid is not None
            #: It never ends itself idle: only those are kept past ``RETIRE_S`` (``keep``).
            self.lasting = lasting
        except BaseException:
            os.close(self.to_w)
            os.close(self.from_r)
            raise
        finally:
            os.close(to_r)
            os.close(from_w)
        #: A job was sent whose answer is not read yet.
        self.pending = False
        #: Since when it is idle (``time.monotonic``, set by ``give_back``); None in use.
        self.idle_since: float | None = None
        #: Stopped (``stop``): its retirer (``_retire_when_idle``) returns.
        self.stopped = False
        self.retirer = False

    def send(
        self, root: str, files: list[tuple[int, str, str, int, int, int, int]], more: bool = False
    ) -> None:
        """A frame of a job: ``files`` to do in ``root``; ``more``: frames of it follow."""
        data = marshal.dumps((root, BLOB_MTIME_NS, files, more))
        _blobs.write_all(self.to_w, HEAD.pack(len(data)) + data)
        self.pending = True

    def answer(self) -> list[tuple[int, str, int, int]] | None:
        """The answer to the job sent (blocking); None if the helper is gone."""
        body = read_frame(self.from_r)
        self.pending = False
        if body is None:
            return None
        done: list[tuple[int, str, int, int]] = marshal.loads(body)
        return done

    def link(
        self, store: str, path: str, dirs: Sequence[str], links: list[tuple[str, str]]
    ) -> str | None:
        """Lay a spare tree out (``_hash_child.link_tree``) and wait for it: None, or the
        error that stopped it; ``OSError`` if the helper is gone (stop it before removing
        ``path``)."""
        data = marshal.dumps((LINK, store, path, tuple(dirs), links))
        _blobs.write_all(self.to_w, HEAD.pack(len(data)) + data)
        self.pending = True
        body = read_frame(self.from_r)
        if body is None:
            raise OSError("the hash helper is gone")
        self.pending = False
        error: str | None = marshal.loads(body)
        return error

    def ready(self, timeout: float) -> bool:
        """Whether it can take a job (the answer to the last one read first, waiting for it
        up to ``timeout`` s: a job left pending is one the caller did whole, so the helper
        claims nothing of it and answers as soon as it runs)."""
        if self.pending:
            readable, _, _ = select.select([self.from_r], [], [], timeout)
            if not readable or self.answer() is None:
                return False
        return self.alive()

    def alive(self) -> bool:
        try:
            return os.waitpid(self.pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:
            return False

    def stop(self, kill: bool = False) -> None:
        """End it (closing its input ends it; ``kill``: at once) and reap it."""
        with _changed:
            self.stopped = True
            _changed.notify_all()
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        for fd in (self.to_w, self.from_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


_lock = threading.Lock()
#: Notified when a helper is stopped (its retirer returns).
_changed = threading.Condition(_lock)
_idle: list[Helper] = []  # at most one, not in use
#: How many callers of ``keep`` want a helper ready: while any does, none is retired.
_kept = 0


def take() -> Helper | None:
    """The process's helper if it is free (started if there is none), else None."""
    if os.environ.get(ENV_VAR, "1") == "0" or not sys.executable:
        return None
    with _lock:
        helper = _idle.pop() if _idle else None
        if helper is not None:
            helper.idle_since = None
    if helper is not None:
        if helper.ready(_PENDING_S):
            return helper
        helper.stop(kill=helper.pending)  # gone, or stuck (stopped?) for seconds
    try:
        return Helper(lasting=_kept > 0)
    except OSError:
        return None


def keep() -> Callable[[], None]:
    """No helper is retired until the function returned is called (by every caller of
    ``keep``): the one a tree started stays ready for the next tree. Who calls it:
    ``_store.attach`` (an agent's start; its undo at the agent's stop): the trees its
    process hashes into lay-outs from then on. Nothing is started here: a process that
    never hashes a large tree (a kernel or a CLI command with no ``working_dir``) has no
    helper; helpers started meanwhile do not end themselves when idle. After the last
    undo an idle helper is retired ``RETIRE_S`` after its last tree, by its retirer thread
    (the undo neither stops it nor waits for it: an agent's stop, every CLI command's
    path, took ~20 ms more when it did, the lead's measure of 7b41718).

    Why: a helper retired ``RETIRE_S`` after a tree made a user's next tree, usually
    further apart in a notebook, pay a new helper's start (a python and hashlib's import,
    15-30 ms here) on its path, as a process's first large tree still does.
    """
    global _kept
    with _changed:
        _kept += 1
    released = False

    def release() -> None:
        global _kept
        nonlocal released
        with _changed:
            if released:
                return
            released = True
            _kept = max(_kept - 1, 0)
            _changed.notify_all()  # the retirers look again: from now on they retire

    return release


def give_back(helper: Helper) -> None:
    """Keep ``helper`` for the next ``take`` (one at most), ended ``RETIRE_S`` later if
    none takes it; another one is stopped now. Its retirer is a thread of its own, started
    at its first give-back and kept while it lives: a ``threading.Timer`` per give-back
    put a thread's start (0.3-4 ms at load 2-4 on this VM, the caller waits for it to run)
    on the path of every new tree, between the hash and its digest."""
    start = False
    with _changed:
        kept = not _idle and not helper.stopped
        if kept:
            _idle.append(helper)
            helper.idle_since = time.monotonic()
            start, helper.retirer = not helper.retirer, True
    if not kept:
        helper.stop()
    elif start:
        threading.Thread(
            target=_retire_when_idle, args=(helper,), name="jupyter-runtimeenv-hashhelp",
            daemon=True,
        ).start()  # fmt: skip


def take_idle() -> Helper | None:
    """The process's helper if one is idle and ready now (none is started here, nothing
    waited for): for work this thread can do itself (a spare's links, ``_spares``)."""
    with _lock:
        helper = _idle.pop() if _idle else None
        if helper is not None:
            helper.idle_since = None
    if helper is None or helper.ready(0):
        return helper
    if helper.pending and helper.alive():
        give_back(helper)  # its last answer is still to come: for ``take``, which waits
    else:
        helper.stop()
    return None


def _retire_when_idle(helper: Helper) -> None:
    """End ``helper`` once it has been idle ``RETIRE_S`` (its input closed: it exits) and
    reap it; return when it is stopped (by this or by its user)."""
    with _changed:
        while not helper.stopped:
            if _kept and helper.lasting:  # kept ready: woken by the last release, or ``stop``
                _changed.wait()
                continue
            # One started before the first ``keep`` ends itself ``IDLE_S`` idle, and would be
            # our zombie until the next ``take``: retired ``RETIRE_S`` idle, kept or not.
            # Not woken by ``give_back`` (a thread woken there would take the GIL from the
            # caller's digest): while the helper is in use it looks every ``RETIRE_S / 4``.
            since = helper.idle_since
            left = RETIRE_S / 4 if since is None else since + RETIRE_S - time.monotonic()
            if left > 0:
                _changed.wait(left)
                continue
            if helper in _idle:
                _idle.remove(helper)
            break
        else:
            return
    helper.stop()


def _forget_in_child() -> None:
    # A forked child has copies of the pipes: closed, so the helper still ends with us.
    global _lock, _changed, _kept
    _kept = 0
    for helper in _idle:
        for fd in (helper.to_w, helper.from_r):
            with contextlib.suppress(OSError):
                os.close(fd)
    _idle.clear()
    _lock = threading.Lock()
    _changed = threading.Condition(_lock)


os.register_at_fork(after_in_child=_forget_in_child)


#: A new tree's walk hands its files to the helper once it has found this many (``Stream``):
#: below, the whole hash is a few ms, less than the helper's first start.
STREAM_FROM = 128

#: (relative path, source path, stat key (``_statcache.key_of``), st_mode): ``_walk.Found``.
Found = tuple[str, str, tuple[int, int, int, int, int], int]
#: (relative path, source path, stat, blob mode) of each file of a tree to hash.
File = tuple[str, str, os.stat_result, int]


class Stream:
    """A new tree's files handed to the helper while the walk still finds them.

    ``feed`` is called before the walk lists each directory: from ``STREAM_FROM`` files found
    on, it takes the helper (starting one: its start overlaps the walk), makes the lay-out,
    and sends the files found since the last call (their directories made first), so the
    helper reads, hashes and writes from the front of the tree while this thread walks.
    ``finish`` (after the walk) sends the rest, claims files from the back on this thread
    until it meets the helper's, and takes the helper's answer (``claim``). ``abort``: the
    helper stopped (SIGKILL: it may be writing) and the lay-out removed; a no-op once
    ``finish`` began. Why a stream: the walk (a ``stat`` and the patterns per file, ~10 us
    a file on one thread) was a tenth of a 1,000-file tree's hash with the other core idle.
    """

    def __init__(self, path: str, mode_of: Callable[[int], int]) -> None:
        self.path = path
        self.mode_of = mode_of
        self.helper: Helper | None = None
        self.layer: Layer | None = None
        #: How many of the walk's files were sent; when reading began (``time.time_ns``).
        self.sent = 0
        self.started = 0
        #: No helper or no lay-out could be had: the caller hashes as without a stream.
        self.off = False
        #: After ``finish``: whether the lay-out is whole, and each file's (inode, ctime_ns).
        self.done = False
        self.made: dict[str, tuple[int, int]] = {}

    def feed(self, found: list[Found], final: bool = False) -> None:
        """Send the files of ``found`` not sent yet (``final``: the last of them)."""
        if self.off or (self.layer is None and (len(found) < STREAM_FROM or not self._begin())):
            return
        layer = self.layer
        if layer is None:
            return
        try:
            layer.add_dirs(found[i][0] for i in range(self.sent, len(found)))
        except OSError:
            layer.failed = True  # a full disk: the rest goes to the store (``rest``)
        jobs = [
            (i, path, rel, key[0], key[1], key[2], self.mode_of(st_mode))
            for i, (rel, path, key, st_mode) in enumerate(found[self.sent :], self.sent)
            if key[2] <= _WHOLE_MAX
        ]
        self.sent = len(found)
        if self.helper is not None and (jobs or final):
            try:
                self.helper.send(layer.path, jobs, more=not final)
            except OSError:  # gone since it was taken: the rest is done here
                self.helper.stop()
                self.helper = None

    def _begin(self) -> bool:
        helper = take()
        layer = Layer.make(self.path, [], 0) if helper is not None else None
        if helper is None or layer is None:
            if helper is not None:
                give_back(helper)
            self.off = True
            return False
        self.helper, self.layer, self.started = helper, layer, time.time_ns()
        return True

    def finish(
        self, found: list[Found], files: list[File], rest: Callable[[int, Layer], str]
    ) -> list[str] | None:
        """Every file's sha256, written into the lay-out (``files``: the walk's ``found``
        with each stat and blob mode); None if the stream never began (too few files, no
        helper: the caller hashes them). ``rest(i, layer)`` does a file neither did."""
        if not self.layer and (len(found) < 2 * STREAM_FROM or self.off):
            return None
        self.feed(found, final=True)
        layer, helper = self.layer, self.helper
        if layer is None:
            return None
        self.layer = self.helper = None  # this call lets go of them from here on
        shas: list[str | None] = [None] * len(files)
        ok = False
        try:
            claim(files, shas, layer, helper, self.started, lambda i: rest(i, layer))
            done = [sha for sha in shas if sha is not None]
            if len(done) != len(files):
                raise RuntimeError("hashing left files without a digest")
            ok = True
        finally:
            if helper is not None:
                if ok:
                    give_back(helper)
                else:
                    helper.stop(kill=True)  # before the lay-out is removed under it
            self.made = layer.made
            self.done = layer.release(ok)
        return done

    def abort(self) -> None:
        """Stop the helper and remove the lay-out (the walk failed); nothing after
        ``finish``."""
        helper, layer = self.helper, self.layer
        self.helper = self.layer = None
        if helper is not None:
            helper.stop(kill=True)
        if layer is not None:
            layer.release(False)


def claim(
    found: list[File],
    shas: list[str | None],
    layer: Layer,
    helper: Helper | None,
    started: int,
    rest: Callable[[int], str],
) -> None:
    """Fill ``shas`` for ``found`` (rel, path, stat, blob mode of each file) written into
    ``layer``: the helper was sent them from the front, this thread claims from the back,
    then ``rest(i)`` for every file neither did. ``started``: when reading began."""
    whole = [i for i, f in enumerate(found) if f[2].st_size <= _WHOLE_MAX]
    met = False
    for i in reversed(whole):
        rel, path, st, mode = found[i]
        try:
            out = _blobs.create_at(layer.root_fd, rel, mode)
        except FileExistsError:
            met = True  # the helper's from here on
            break
        except OSError:
            break  # the lay-out cannot take it: ``rest`` says so
        shas[i] = _claimed(layer, path, st, rel, mode, out, started)
    answer = None
    if helper is not None and (met or not all(shas[i] for i in whole)):
        answer = helper.answer()
    for index, sha, ino, ctime_ns in answer or ():
        rel, path, st, _mode = found[index]
        if shas[index] is None:
            shas[index] = sha
            layer.made[rel] = (ino, ctime_ns)
            _statcache.record(path, st, sha, started)
    for i, sha_done in enumerate(shas):
        if sha_done is None:
            shas[i] = rest(i)


def _claimed(
    layer: Layer, path: str, st: os.stat_result, rel: str, mode: int, out: int, started: int
) -> str | None:
    """Read, hash and write the file claimed as ``out``; None (the claim removed) if it is
    not the file stat'ed, whole, or cannot be written: ``rest`` does it then."""
    sha = None
    try:
        fd = open_regular(path, st)
        try:
            data = os.read(fd, st.st_size + 1)
        finally:
            os.close(fd)
        if len(data) == st.st_size:
            sha = hashlib.sha256(data).hexdigest()
            _blobs.write_all(out, data)
    except (BadFile, OSError):
        sha = None
    if sha is None or not layer.close(out, mode, ok=True, rel=rel, keep_going=True):
        if sha is None:
            os.close(out)
        with contextlib.suppress(OSError):
            os.unlink(rel, dir_fd=layer.root_fd)
        return None
    _statcache.record(path, st, sha, started)
    return sha
