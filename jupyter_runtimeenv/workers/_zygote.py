"""The template ("zygote") process: new workers forked from an interpreter that has started.

Started by ``template.Template`` (the driver's side) exactly like a worker, with ``--zygote``
last: ``python _entry.py --fd C --lifeline L --parent P --zygote``, in an environment whose
start-time settings (``PYTHON*``, locale, loader variables) are those of the workers it will
make. ``_entry.main`` loads this file by path (standard library only) and calls ``serve``,
which imports what every worker needs (the protocol, cloudpickle), says HELLO on the control
socket ``C`` and answers fork requests until the driver closes it.

One process, one thread: it never runs user code, never starts a thread (a fork copies only
the forking thread: a lock held by another would stay locked forever in the child).

A request carries the worker's three descriptors (its channel, the write ends of its stdout
and stderr pipes, as SCM_RIGHTS) and JSON: the worker's whole environment, cwd, umask,
resource limits, niceness and CPU affinity as the driver has them now (what a worker it
spawned would inherit). The template forks with ``clone(CLONE_PARENT)``, so the worker is the
driver's child, as a spawned one is: the driver reaps it and kills its group, the sidebar
finds it under its kernel, ``PR_SET_PDEATHSIG`` watches the driver, and the template can stop
while its workers run. The reply is the worker's pid.

The template keeps one such child cloned ahead of the request (the *spare*): it has made its
own process group already (``setpgid``) and waits on a socket of its own for a request, which
the template hands on to it unread, then answers with the spare's pid. A new spare is cloned
once the control socket has been quiet for ``SPARE_AFTER`` (not while the worker just handed
out sets itself up); a request that finds none is forked at once, as before. The driver
learns each spare's pid (``{"spare": pid}``, sent right after the clone), because a spare is
its child: one never handed out exits when the template does (EOF on its socket), and the
driver reaps it (``template.Template.stop``). A spare is cloned under a name of its own
(``/proc/PID/comm`` ``jrespare<template pid>``, ``spare_name``) that it keeps until it is handed
a request: a template SIGKILLed between a clone and that message (seen under a CPU hog) leaves
a spare the driver never heard of, and the driver finds it among its children by that name
when it stops the template (``template._reap_orphans``). Not covered: a worker forked for a
request in the microseconds before a SIGKILL of the template, before it answered its pid (the
child exits at its channel's EOF, a zombie until the driver exits); no test can hit that
instant, and a spare's ~10 ms after every HELLO was the window a hog run found.

The child then becomes what ``Popen`` plus an interpreter start would have made: the leader of
a process group of its own in the driver's session (the template is started in it, as a
worker is: ``lifeline.OWN_GROUP``; a session of its own would be a share of the CPUs of its
own), its stdio on the pipes, the channel on fd ``C``, the request's
environment (``os.environ``, so also what its children get), cwd, umask, limits, niceness and
affinity, ``--forked`` in place of ``--zygote`` in its command line, and returns to
``_entry`` (sys.path, watchdog, setup hook, HELLO) like a spawned worker.

A request whose JSON has ``hash`` (two descriptors: the pipes of a hash helper's stdin and
stdout) makes the same kind of child, a spare or a fork, but that child runs the driver's hash
helper program (``plugins/_hash_child.py``) instead of becoming a worker (``_be_hash_helper``):
a process's first large tree then does not wait for a new interpreter to start.

Where ``clone`` cannot be used as above (not Linux x86_64/aarch64 with glibc: the thread id
that glibc caches must be set in the child), the HELLO says so and the driver spawns.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

#: Bytes of the length that precedes each JSON message on the control socket.
_HEADER = struct.Struct("!I")
_MAX_REQUEST = 64 << 20
CLONE_PARENT = 0x00008000
CLONE_CHILD_SETTID = 0x01000000
#: machine -> (number of the clone system call, index of its child-tid argument).
_CLONE = {"x86_64": (56, 3), "aarch64": (220, 4)}
#: The ``--zygote`` flag, replaced in a forked worker's command line (same length).
ZYGOTE_FLAG = b"--zygote"
FORKED_FLAG = b"--forked"
#: ... and in a forked hash helper's (``_be_hash_helper``).
HASHER_FLAG = b"--hasher"

#: How long the control socket stays quiet after a fork before the next spare is cloned.
SPARE_AFTER = 0.01

_pdeath_signal = 0
_parent = 0


class _Clone:
    """``clone(CLONE_PARENT | CLONE_CHILD_SETTID)`` through libc's ``syscall``."""

    def __init__(self) -> None:
        machine = os.uname().machine
        if sys.platform != "linux" or machine not in _CLONE:
            raise OSError(f"forking workers needs Linux on x86_64 or aarch64, not {machine}")
        self.number, self.tid_index = _CLONE[machine]
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            # glibc publishes where struct pthread keeps the thread id (for libthread_db).
            where = (ctypes.c_uint32 * 3).in_dll(libc, "_thread_db_pthread_tid")
        except ValueError:
            raise OSError("this C library does not say where it keeps thread ids") from None
        libc.pthread_self.restype = ctypes.c_void_p
        self.tid_address = int(libc.pthread_self()) + int(where[2])
        if ctypes.c_int.from_address(self.tid_address).value != os.getpid():
            raise OSError("the C library's thread id is not where it says")
        self.syscall = libc.syscall
        self.prctl = libc.prctl
        self.syscall.restype = ctypes.c_long
        self.syscall.argtypes = [ctypes.c_long] + [ctypes.c_void_p] * 5
        self.api = ctypes.pythonapi

    def __call__(self) -> int:
        """The child's pid in the template, 0 in the child; ``OSError`` if it failed."""
        args: list[int | None] = [CLONE_PARENT | CLONE_CHILD_SETTID, None, None, None, None]
        args[self.tid_index] = self.tid_address  # glibc's cached tid: the child's own
        self.api.PyOS_BeforeFork()
        pid = self.syscall(self.number, *args)
        if pid == 0:
            self.api.PyOS_AfterFork_Child()
            return 0
        error = ctypes.get_errno()
        self.api.PyOS_AfterFork_Parent()
        if pid < 0:
            raise OSError(error, f"clone: {os.strerror(error)}")
        return int(pid)


def serve(control_fd: int, lifeline: int | None, parent: int, pdeath_offset: int) -> Any:
    """The template's life. Returns only in a forked child: the request it was made for
    (the child's channel is then on ``control_fd``). The template itself exits here."""
    global _pdeath_signal, _parent
    _parent = parent
    control = socket.socket(fileno=control_fd)
    hello: dict[str, Any] = {"pid": os.getpid(), "environ": dict(os.environ)}
    clone: _Clone | None = None
    try:
        if not hasattr(socket, "recv_fds"):
            raise OSError(f"Python {sys.version.split()[0]} cannot pass descriptors (3.9+ can)")
        clone = _Clone()
    except OSError as exc:
        hello["error"] = str(exc)
    # The driver starts us itself (never behind a command prefix): a parent that is not
    # our parent any more died while we imported. Its lifeline and our control socket may
    # still be open in a fork of it (a notebook's multiprocessing), so neither tells.
    if parent and os.getppid() != parent:
        os._exit(0)
    if sys.platform == "linux" and clone is not None and parent:
        _pdeath_signal = signal.SIGRTMIN + pdeath_offset
        signal.signal(_pdeath_signal, _on_pdeath)  # this is the main (and only) thread
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, _pdeath_signal, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(0)
    _send(control, hello)
    # The first spare, too, once the driver has been quiet for SPARE_AFTER: its pid goes out
    # right after the clone (a spare the driver never hears of would be its zombie).
    spare: tuple[int, socket.socket] | None = None
    if clone is None:
        _wait_for_eof(control, lifeline)
        os._exit(0)
    watched = [control] + ([lifeline] if lifeline is not None else [])
    warm = False
    while True:
        # EINTR: retried (PEP 475). Quiet for SPARE_AFTER without a spare: clone one.
        timeout = None if spare is not None else SPARE_AFTER
        readable, _, _ = select.select(watched, [], [], timeout)
        if not readable:
            if not warm:  # before the first spare: it and every later child have it
                _warm_for_hash_helpers()
                warm = True
            made = _clone_spare(clone)
            if made[0] == 0:  # in the spare, once it is a worker
                return _be_spare(made[1], control, clone, made[2])
            if made[0] > 0:
                spare = made[0], made[1]
                _send(control, {"spare": made[0]})
            else:  # cannot clone now: try again after the next request
                select.select(watched, [], [])
            continue
        if lifeline in readable and not os.read(lifeline, 64):
            os._exit(0)  # the driver is gone (our spare sees EOF and goes too)
        if control not in readable:
            continue
        received = _receive(control)
        if received is None:
            os._exit(0)  # the driver stopped us (idle) or is gone
        body, fds = received
        request: dict[str, Any] = {}
        try:
            if spare is not None and _hand_over(spare, body, fds):
                pid = spare[0]
            else:
                if spare is not None:  # dead, or not reading: never hand it work again
                    _kill(spare[0])
                request = json.loads(body)
                pid = _fork(clone, request, fds, control)
        except (OSError, ValueError) as exc:
            _send(control, {"error": str(exc)})
            continue
        finally:
            spare = None
            for fd in fds:
                os.close(fd)
        if pid == 0:
            return request  # in the child, which is now the worker
        _send(control, {"pid": pid})


def _warm_for_hash_helpers() -> None:
    """Import hashlib (OpenSSL's, ~4.7 ms here) once, while quiet: a hash helper forked
    from us (``_be_hash_helper``) answers a process's first tree's job 4.2 ms after the
    request instead of 8.4 (quiet, median of 12). Each child has it mapped from us: a
    forked worker's RSS +0.5 MB (14.8 -> 15.4 MB), its PSS +0.1-0.2 MB."""
    try:  # noqa: SIM105 - as few imports as possible in what forks
        import hashlib  # noqa: F401
    except ImportError:
        pass


def spare_name(template_pid: int) -> bytes:
    """The name (``/proc/PID/comm``, at most 15 bytes) of a spare of ``template_pid`` until
    it is handed a request."""
    return f"jrespare{template_pid}".encode()[:15]


def _set_name(clone: _Clone, name: bytes) -> None:
    clone.prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME (this thread: the only one)


def _clone_spare(clone: _Clone) -> tuple[int, socket.socket, bytes]:
    """Clone a spare: ``(pid, our end of its socket, our name)`` in the template, ``(0, its
    end, the name to take back)`` in the spare, ``(-1, ...)`` if it could not be cloned
    (requests are then forked at once). The spare is born with ``spare_name``: a clone copies
    the name, so there is no instant at which it lives under another."""
    ours, theirs = socket.socketpair()
    name = ctypes.create_string_buffer(16)
    clone.prctl(16, name, 0, 0, 0)  # PR_GET_NAME
    _set_name(clone, spare_name(os.getpid()))
    try:
        pid = _clone_checked(clone)
    except OSError:
        _set_name(clone, name.value)
        ours.close()
        theirs.close()
        return -1, ours, name.value
    if pid == 0:
        ours.close()
        return 0, theirs, name.value
    _set_name(clone, name.value)
    theirs.close()
    return pid, ours, name.value


def _be_spare(
    sock: socket.socket, control: socket.socket, clone: _Clone, name: bytes
) -> dict[str, Any]:
    """In a spare: make our process group now, then wait for the request the template
    hands on and become that worker (``_become_worker``, under our ``name`` again); exit at
    EOF (the template stopped)."""
    try:
        os.setpgid(0, 0)
        # The template's control socket is not ours to hold (the driver must see EOF when
        # the template exits): its number is kept for the channel (our argv names it).
        os.dup2(sock.fileno(), control.fileno())
        received = _receive(sock)
        if received is None:
            os._exit(0)
        _set_name(clone, name)  # a worker now: never one the driver reaps as a lost spare
        body, fds = received
        sock.close()
        request: dict[str, Any] = json.loads(body)
        if "hash" in request:
            _be_hash_helper(request, fds)
        try:
            _become_worker(request, fds, control, new_group=False)
        finally:
            for fd in fds:
                os.close(fd)
    except BaseException as exc:  # nothing half-made may run tasks: tell, and go
        _setup_failed(exc)
    return request


def _setup_failed(exc: BaseException) -> NoReturn:
    """In a forked child whose setup failed: say why on its stderr and exit."""
    try:
        os.write(2, f"jupyter-runtimeenv: forked worker setup failed: {exc!r}\n".encode())
    finally:
        os._exit(2)


def _hand_over(spare: tuple[int, socket.socket], body: bytes, fds: list[int]) -> bool:
    """Pass a request, unread, to the spare; False if it cannot take it (it died)."""
    sock = spare[1]
    try:
        socket.send_fds(sock, [_HEADER.pack(len(body)) + body], fds)
    except OSError:
        return False
    finally:
        sock.close()
    return True


def _kill(pid: int) -> None:
    # Our sibling, the driver's child: the driver has not reaped it (it reaps a spare only
    # once we said another replaced it, or after we exit), so the pid is still this one.
    try:  # noqa: SIM105 - as few imports as possible in what forks
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _on_pdeath(signum: int, frame: object) -> None:
    if os.getppid() != _parent:
        os._exit(0)


def _wait_for_eof(control: socket.socket, lifeline: int | None) -> None:
    watched = [control] + ([lifeline] if lifeline is not None else [])
    while True:
        readable, _, _ = select.select(watched, [], [])
        if lifeline in readable and not os.read(lifeline, 64):
            return
        if control in readable and not control.recv(4096):
            return


def _send(control: socket.socket, message: dict[str, Any]) -> None:
    data = json.dumps(message).encode()
    control.sendall(_HEADER.pack(len(data)) + data)


def _receive(control: socket.socket) -> tuple[bytes, list[int]] | None:
    """One request (its JSON, unread) and its descriptors; None at EOF."""
    data, fds, _flags, _addr = socket.recv_fds(control, _HEADER.size, 8)
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    while len(data) < _HEADER.size:
        more = control.recv(_HEADER.size - len(data))
        if not more:
            return None
        data += more
    (size,) = _HEADER.unpack(data)
    if size > _MAX_REQUEST:
        raise OSError(f"request of {size} bytes")
    body = bytearray()
    while len(body) < size:
        more = control.recv(min(size - len(body), 1 << 20))
        if not more:
            return None
        body += more
    return bytes(body), list(fds)


def _fork(clone: _Clone, request: dict[str, Any], fds: list[int], control: socket.socket) -> int:
    wanted = 2 if "hash" in request else 3
    if len(fds) != wanted:
        raise OSError(f"expected {wanted} descriptors, got {len(fds)}")
    pid = _clone_checked(clone)
    if pid == 0:
        if wanted == 2:
            _be_hash_helper(request, fds)
        try:
            _become_worker(request, fds, control, new_group=True)
        except BaseException as exc:  # nothing half-made may run tasks: tell, and go
            _setup_failed(exc)
    return pid


def _be_hash_helper(request: dict[str, Any], fds: list[int]) -> NoReturn:
    """In a child (a spare or a fork): the hash helper, what ``plugins/_hashhelp.Helper``
    would spawn as ``python -I -S _hash_child.py``: the program the request names (that
    file, loaded by path: standard library only) run on the request's two pipes as stdin
    and stdout, stderr on /dev/null, in a process group of its own, with the driver's cwd
    and umask; ``--hasher`` in its command line. It never returns to ``_entry``: it exits
    at the end of its input (the driver gone or done with it) or after its idle time."""
    try:
        if len(fds) != 2:
            raise OSError(f"expected 2 descriptors, got {len(fds)}")
        if os.getpgid(0) != os.getpid():
            os.setpgid(0, 0)
        if _pdeath_signal:
            signal.signal(_pdeath_signal, signal.SIG_DFL)
        os.dup2(fds[0], 0)
        os.dup2(fds[1], 1)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)  # the rest (this too) the program closes
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        _rename_argv(HASHER_FLAG)
        spec = importlib.util.spec_from_file_location("_jre_hash_child", request["hash"])
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {request['hash']}")
        program = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(program)
        program.main(float(request["idle"]))
    except BaseException:
        os._exit(2)
    os._exit(0)


def _clone_checked(clone: _Clone) -> int:
    import _thread

    if _thread._count():
        raise OSError("the template has a thread: it cannot fork safely")
    return clone()


def _become_worker(
    request: dict[str, Any], fds: list[int], control: socket.socket, *, new_group: bool
) -> None:
    """In the child: what ``Popen(process_group=0, env=, cwd=, pass_fds=)`` and a new
    interpreter would have given it (a spare made its group already)."""
    if len(fds) != 3:
        raise OSError(f"expected 3 descriptors, got {len(fds)}")
    channel, out, err = fds
    if new_group:
        os.setpgid(0, 0)
    if _pdeath_signal:  # the watchdog of _entry arms its own (a worker's is sigwait-based)
        signal.signal(_pdeath_signal, signal.SIG_DFL)
    os.dup2(out, 1)
    os.dup2(err, 2)
    control_fd = control.detach()
    os.dup2(channel, control_fd)  # the channel takes the control socket's number (our argv)
    for fd in fds:
        os.close(fd)
    fds.clear()
    # Only what differs (most of a worker's environment is its template's): clearing and
    # setting all of it was ~0.2 ms of putenv/unsetenv for 40 variables, 5x this.
    environ, wanted = os.environ, request["env"]
    for name in [name for name in environ if name not in wanted]:
        del environ[name]
    for name, value in wanted.items():
        if environ.get(name) != value:
            environ[name] = value
    time.tzset()  # the time module read TZ when the template imported it
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    for name, limits in request["rlimits"].items():
        which = getattr(resource, name)
        wanted = (int(limits[0]), int(limits[1]))
        if resource.getrlimit(which) != wanted:
            resource.setrlimit(which, wanted)
    nice = int(request["nice"])
    if os.getpriority(os.PRIO_PROCESS, 0) != nice:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    cpus = set(request["affinity"])
    if cpus and os.sched_getaffinity(0) != cpus:
        os.sched_setaffinity(0, cpus)
    _rename_argv()


def _rename_argv(flag: bytes = FORKED_FLAG) -> None:
    """``--zygote`` -> ``flag`` in ``/proc/self/cmdline`` (the memory the kernel shows: the
    bytes of the original argv; the same length, so nothing moves) and in ``sys.argv``."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
    raw = ctypes.string_at(start, end - start)
    at = raw.rfind(b"\0" + ZYGOTE_FLAG + b"\0")
    if at >= 0:
        ctypes.memmove(start + at + 1, flag, len(flag))
    for argv in (sys.argv, getattr(sys, "orig_argv", [])):
        if argv and argv[-1] == ZYGOTE_FLAG.decode():
            argv[-1] = flag.decode()
