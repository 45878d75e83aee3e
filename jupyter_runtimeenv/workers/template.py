"""A zygote template as the driver holds it: ``Template`` (start it, fork a worker from it,
stop it and reap what it made) and ``ForkedChild`` (a forked worker, as a ``Popen``).

Who calls it: ``zygote`` (the registry of templates, and the rules for when a worker is
forked at all: see its docstring); the template process itself is ``_zygote.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import struct
import subprocess
import threading
import time
from typing import Any

from .._umask import read_umask
from . import lifeline

__all__ = ["DEFAULT_IDLE_TIMEOUT", "ForkedChild", "Template"]

#: How long a template may take to say HELLO (an interpreter start and cloudpickle).
STARTUP_TIMEOUT = 60.0
DEFAULT_IDLE_TIMEOUT = 60.0
#: How long a stopping template's spare may take to see EOF and exit before it is killed.
SPARE_REAP_WAIT = 5.0
#: How long a hash helper's fork waits for a request under way (a worker's fork: ~2 ms)
#: before the helper is spawned instead.
HELPER_WAIT = 0.02
_HEADER = struct.Struct("!I")


class ForkedChild:
    """A forked worker, as ``process.WorkerProcess`` uses a ``Popen``: ``pid``, ``stdout``,
    ``stderr`` (the read ends of its pipes), ``returncode``, ``poll``, ``wait``."""

    def __init__(self, pid: int, stdout: int, stderr: int) -> None:
        self.pid = pid
        self.stdout = os.fdopen(stdout, "rb", 0)
        self.stderr = os.fdopen(stderr, "rb", 0)
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        return self._wait(os.WNOHANG)

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            code = self._wait(0)
            assert code is not None
            return code
        deadline = time.monotonic() + timeout
        while (code := self._wait(os.WNOHANG)) is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.005)
        return code

    def _wait(self, options: int) -> int | None:
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            try:
                pid, status = os.waitpid(self.pid, options)
            except ChildProcessError:  # reaped by someone else (os.wait() in user code)
                self.returncode = 255
                return self.returncode
            if pid == 0:
                return None
            self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode


class Template:
    """One template process (see ``zygote``'s docstring). ``state``: ``starting``,
    ``ready``, ``unusable`` (it cannot fork here: its workers are spawned) or ``stopped``."""

    def __init__(self, python: str, base: dict[str, str], entry: str) -> None:
        self.python = python
        self.base = base
        self.entry = entry
        self.state = "starting"
        self.error = ""
        self.pid = 0
        self.idle_timeout = DEFAULT_IDLE_TIMEOUT
        self.last_used = time.monotonic()
        #: Workers forked so far.
        self.forks = 0
        self.ready = threading.Event()
        self._lock = threading.Lock()  # one request at a time on the control socket
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        #: What the template's interpreter changed in the environment it was given as it
        #: started (PEP 538's locale coercion): a spawned worker's would change the same.
        self._added: dict[str, str] = {}
        self._removed: list[str] = []
        #: The template's spare (a worker cloned ahead of its request, ``_zygote.py``): our
        #: child, reaped here unless it is handed out. Under ``_lock``.
        self._spare = 0
        #: Spares the template replaced without handing them out (they died): to reap.
        self._dead: list[int] = []
        #: Set when ``start`` has returned (``stop`` waits for it: what a start launches
        #: after a stop is reaped by the start, before the stop returns).
        self._start_done = threading.Event()
        #: The thread running ``start`` (0: none yet; a stop in that thread does not wait).
        self._starter = 0

    def __repr__(self) -> str:
        return f"<Template {self.python} pid={self.pid} {self.state}>"

    def start(self) -> None:
        """Start the process and wait for its HELLO (in a background thread)."""
        self._starter = threading.get_ident()
        try:
            self._start()
        finally:
            self._start_done.set()

    def _start(self) -> None:
        with self._lock:
            if self.state != "starting":  # stopped before it began: launch nothing
                return
        ours, theirs = socket.socketpair()
        life = lifeline.lifeline_fd()
        argv = [
            self.python, self.entry, "--fd", str(theirs.fileno()), "--lifeline", str(life),
            "--parent", str(os.getpid()), "--zygote",
        ]  # fmt: skip
        try:
            # Its stdout and stderr are pipes, as a worker's are: the streams Python makes
            # for them as it starts (buffering, seekable or not) are what its forks keep.
            self._proc = lifeline.launch(
                lambda: subprocess.Popen(
                    argv,
                    env=self.base,
                    pass_fds=(theirs.fileno(), life),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    **lifeline.OWN_GROUP,  # a Ctrl-C meant for the driver is not for it
                )
            )
        except OSError as exc:
            ours.close()
            self.error = f"cannot start {self.python}: {exc}"
            self.state = "stopped"  # perhaps later (an env being rebuilt): try again then
            self.ready.set()
            return
        finally:
            theirs.close()
        self.pid = self._proc.pid
        with self._lock:
            stopped = self.state == "stopped"  # stop() ran before we launched it
            if not stopped:
                self._sock = ours
        if stopped:
            with contextlib.suppress(OSError):
                ours.shutdown(socket.SHUT_WR)  # as stop() would have: it goes after HELLO
        ours.settimeout(STARTUP_TIMEOUT)
        try:
            hello = _receive(ours)
        except (OSError, ValueError) as exc:
            self._fail(f"no HELLO from template pid {self.pid}: {exc}{self._stderr_tail()}")
            self._give_up(ours)
            return
        finally:
            if self._proc.stdout is not None:
                self._proc.stdout.close()  # it never writes there
        if hello.get("error"):
            self._fail(str(hello["error"]))  # its workers are spawned
            self._give_up(ours)
            return
        if self._proc.stderr is not None:
            self._proc.stderr.close()
        environ = hello.get("environ", {})
        self._added = {k: v for k, v in environ.items() if self.base.get(k) != v}
        self._removed = [k for k in self.base if k not in environ]
        with self._lock:
            ready = self._sock is ours and self.state == "starting"
            if ready:
                ours.settimeout(10.0)  # a fork takes milliseconds: longer, it is hung (SIGSTOP)
                self.state = "ready"
        if not ready:
            self._give_up(ours)  # stop() ran meanwhile
            return
        self.ready.set()

    def _give_up(self, ours: socket.socket) -> None:
        """``start`` ends short of ready: stop the template, or, if ``stop`` ran meanwhile
        (it only shut our socket for writing: ``start`` reads it, or it ran before the
        launch), read what the template said of spares until its EOF, close, and reap the
        template and its spares."""
        with self._lock:
            mine = self._sock is ours
        if mine:
            self.stop()
            return
        self._drain(ours)
        ours.close()
        self._reap_all()  # stop() ran before the launch, so it could not

    def _drain(self, sock: socket.socket) -> None:
        """EOF to the template (it exits), and what it said of spares until its own EOF."""
        with contextlib.suppress(OSError, ValueError):
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(2.0)
            while True:
                message = _receive(sock)  # OSError at its EOF
                with self._lock:
                    self._note(message)

    def _stderr_tail(self) -> str:
        stream = self._proc.stderr if self._proc is not None else None
        if stream is None:
            return ""
        os.set_blocking(stream.fileno(), False)
        try:
            tail = (stream.read() or b"")[-2000:].decode("utf-8", "replace").strip()
        except OSError:
            tail = ""
        stream.close()
        return f"\n--- its stderr ---\n{tail}" if tail else ""

    def _fail(self, error: str) -> None:
        self.error = error
        self.state = "unusable"
        self.ready.set()

    def fork(self, env: dict[str, str], cwd: str, channel: int, idle_timeout: float) -> ForkedChild:
        """Fork a worker with ``env`` and ``cwd``, its channel ``channel``; ``OSError`` if
        the template could not (the caller spawns)."""
        env = dict(env)  # the caller spawns with its own if this fails
        for name in self._removed:
            env.pop(name, None)
        env.update(self._added)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            request = {"env": env, "cwd": cwd, **_inherited()}
            pid = self._ask(request, [channel, out_w, err_w], idle_timeout)
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        self.forks += 1
        return ForkedChild(pid, out_r, err_r)

    def fork_hash_helper(self, stdin: int, stdout: int, program: str, idle_s: float) -> int:
        """A hash helper forked from this template (``_zygote._be_hash_helper``): ``program``
        (``plugins/_hash_child.py``) run on ``stdin`` and ``stdout`` (the caller closes its
        copies), ending after ``idle_s`` without a job (0: never); its pid, our child as a
        worker is. ``OSError`` if the template is busy (another request), not ready, or could
        not: the caller spawns the helper. Not a use of the template (``last_used``): only
        workers keep it up."""
        request = {"hash": program, "idle": idle_s, "cwd": os.getcwd(), "umask": _umask()}
        return self._ask(request, [stdin, stdout], None, wait=HELPER_WAIT)

    def _ask(
        self,
        request: dict[str, Any],
        fds: list[int],
        idle_timeout: float | None,
        wait: float = -1,
    ) -> int:
        """Send ``request`` with ``fds`` and return the pid of the child made for it;
        ``OSError`` if there is none, or if another request holds the socket longer than
        ``wait`` s (-1: wait for it). ``idle_timeout``: a worker's (a use of the template)."""
        body = json.dumps(request).encode()
        if not self._lock.acquire(timeout=wait):
            raise OSError(f"template pid {self.pid} is busy")
        try:
            sock = self._sock
            if sock is None or self.state != "ready":
                raise OSError(f"template {self.python} is {self.state}")
            if idle_timeout is not None:
                self.last_used = time.monotonic()
                self.idle_timeout = max(self.idle_timeout, idle_timeout)
            try:
                socket.send_fds(sock, [_HEADER.pack(len(body))], fds)
                sock.sendall(body)
                while "spare" in (reply := _receive(sock)):  # a spare made since
                    self._note(reply)
                self._note(reply)
            except (OSError, ValueError) as exc:
                self.state = "stopped"  # it died, or broke the protocol: a new one later
                raise OSError(f"template pid {self.pid}: {exc}") from exc
        finally:
            self._lock.release()
        self._reap_spares(0.0)
        if "pid" not in reply:
            raise OSError(f"template pid {self.pid}: {reply.get('error', reply)}")
        return int(reply["pid"])

    def _note(self, message: dict[str, Any]) -> None:
        """Under ``_lock``: what a message of the template says of its spare. Any answer to
        a request used the spare up: handed out (the answer's pid: a worker now) or not (it
        died, or the template killed it: ours to reap); a new spare replaces none."""
        if "spare" in message:
            gone, self._spare = self._spare, int(message["spare"])
        elif "pid" in message or "error" in message:
            gone, self._spare = self._spare, 0
            if gone == message.get("pid"):
                gone = 0
        else:
            return
        if gone:
            self._dead.append(gone)

    def _reap_spares(self, wait: float) -> None:
        """Reap the dead spares (and, once the template is gone, its last one): at once, or
        waiting up to ``wait`` seconds each, then SIGKILLed (never reaped yet: the pid is
        still that spare's)."""
        with self._lock:
            if self._sock is None and self._spare:
                self._dead.append(self._spare)
                self._spare = 0
            pids, self._dead = self._dead, []
        left = [pid for pid in pids if not _reap(pid, wait)]
        if left:
            with self._lock:
                self._dead.extend(left)

    def stop(self) -> None:
        """Close its control socket (it exits at EOF) and reap it, and its spare."""
        with self._lock:
            was = self.state
            if self.state in ("starting", "ready"):
                self.state = "stopped"
            sock, self._sock = self._sock, None
        if sock is not None and was == "starting":
            # start() reads it (a HELLO may come): EOF to the template, which exits after
            # its HELLO; start() then reads the rest, closes it and reaps the spares.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
        elif sock is not None:
            self._drain(sock)
            sock.close()
        self.ready.set()
        if was == "starting" and self._starter not in (0, threading.get_ident()):
            # A start under way may launch the template only now (its launch waits for
            # the launcher thread): it sees the stop and reaps what it made; wait for it,
            # so that nothing of ours is left unreaped once stop() returns.
            self._start_done.wait(STARTUP_TIMEOUT)
        self._reap_all()

    def _reap_all(self) -> None:
        """Wait for the template to exit (killed after 10 s), reap it, its spares and the
        spares it cloned without telling (``_reap_orphans``)."""
        proc = self._proc
        if proc is not None:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._reap_spares(SPARE_REAP_WAIT)
        if self.pid:
            _reap_orphans(self.pid)


def _reap_orphans(template_pid: int) -> None:
    """Kill and reap our children still named as spares of the stopped ``template_pid``
    (``_zygote.spare_name``): a spare cloned just before the template died, whose pid it
    never sent. A spare handed a request takes its own name back first, so no worker is
    ever one of them."""
    name = f"jrespare{template_pid}"[:15]
    children: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/children") as f:
                children.update(int(pid) for pid in f.read().split())
    for pid in children:
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != name:
                    continue
        except OSError:
            continue
        _reap(pid, SPARE_REAP_WAIT)  # it sees EOF from its dead template and exits


def _reap(pid: int, wait: float) -> bool:
    """Reap our child ``pid``, waiting up to ``wait`` seconds, then SIGKILL it; whether it
    is reaped (or was, by someone else: ``os.wait()`` in user code)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True
        if done:
            return True
        if time.monotonic() >= deadline:
            if wait <= 0:
                return False
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            return True
        time.sleep(0.005)


def _receive(sock: socket.socket) -> dict[str, Any]:
    header = _exactly(sock, _HEADER.size)
    (size,) = _HEADER.unpack(header)
    data: dict[str, Any] = json.loads(_exactly(sock, size))
    return data


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            raise OSError("the template closed its control socket")
        data += more
    return data


def _inherited() -> dict[str, Any]:
    """What a child spawned now would inherit from us (niceness and affinity are per thread
    on Linux: the launcher thread's, which spawns)."""
    launcher = lifeline.launcher_tid()
    limits = {
        name: list(resource.getrlimit(getattr(resource, name)))
        for name in dir(resource)
        if name.startswith("RLIMIT_")
    }
    return {
        "umask": _umask(),
        "rlimits": limits,
        "nice": os.getpriority(os.PRIO_PROCESS, launcher),
        "affinity": sorted(os.sched_getaffinity(launcher)),
    }


def _umask() -> int:
    mask = read_umask()
    if mask is not None:
        return mask
    # Without /proc: set and restore (another thread creating a file meanwhile would get 077).
    mask = os.umask(0o077)
    os.umask(mask)
    return mask
