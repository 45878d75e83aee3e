"""``WorkerProcess``: the driver's handle on one worker process.

Created and owned by ``Pool``. ``start()`` forks the worker from a template of its
interpreter (``zygote``), or where that cannot give exactly the same worker spawns
``compose(ctx, [_entry.py, "--fd", N, ...])``; either way with one end of a socketpair as
fd ``N``, stdout/stderr on pipes, leading a process group of its own in the driver's session
(``lifeline.OWN_GROUP``). One reader thread per worker
multiplexes the three: output is fed to ``StreamForwarder``s, frames (read and
decoded by the worker's ``Channel``) become outcomes. Before handling answers the thread
drains the output pipes, so every line a task printed (the worker flushes before answering)
is shown before its result; the pool pipelines only calls whose output goes to the same place
(see ``Pool``), so it is attributed to the right cell. The thread reports to its
``WorkerListener`` (the pool): hello (which may ask for a preload), ready, calls answered
(which refills the worker's pipeline), imports learned, died.

A worker holds up to the pool's pipeline depth of calls (``held``, oldest first; the first
one runs). The pool appends to ``held`` and ``outbox`` under its lock; ``flush`` sends what
is in ``outbox`` in order, under the worker's send lock, so calls reach the worker in the
order of ``held`` whichever thread flushes.

A thread waiting for the answer of the call a worker runs reads it itself
(``read_answer``, from ``RemoteFuture.result``) for a short while: the socket is taken out of
the reader thread's epoll meanwhile, so an answer wakes one thread instead of the reader
thread, which then woke the waiter (that hand-over was ~20 us of a ~80 us round trip on an
idle worker, ``benchmarks/bench_workers.py``). Whoever handles what the worker sent holds
its *read lock*: the reader thread for each batch of events, a waiter while it reads. The
waiter reads only the happy path (answers, notices, output before them); anything else (EOF,
a hang-up, the window over) goes back to the reader thread as it was. While the worker's calls
are answered back to back and a CPU is spare, the waiter polls for a moment before it blocks
(``protocol.Spin``; the worker does the same for its next call).

What the worker sends is handled in ``answers.py`` (``Answers``, this class's base: frames,
output drained before the answers it preceded, the waiter's own read); this module starts the
worker, sends it calls, runs the reader thread and ends the process.
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from typing import Any

import cloudpickle

from .._cpuload import Gauge
from ..context import EnvContext, compose, process_env
from ..errors import BrokenWorker, WorkerError
from . import lifeline, protocol, stops, threads, zygote
from ._entry import ORPHANED, STDIO_BROKEN
from .answers import Answers, WorkerListener
from .channel import Channel, prepare_socket
from .future import Task
from .output import OutputTarget, StreamForwarder

#: This process's count of runnable tasks, for every worker's ``Spin`` (one read per
#: ``_cpuload.EVERY`` whatever the number of workers).
GAUGE = Gauge()
ENTRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_entry.py")
CLOUDPICKLE_VAR = "JUPYTER_RUNTIMEENV_CLOUDPICKLE_DIR"
#: Only the cloudpickle package itself, for environments that lack it (see ``_entry``).
_CLOUDPICKLE_DIR = os.path.dirname(os.path.abspath(cloudpickle.__file__))
#: After the worker exited: how long frames and output it sent may still be read (a fork
#: that escaped its group may hold our end of the pipes open forever).
_EXIT_GRACE = 2.0


class WorkerProcess(Answers):
    """One worker. ``held``, ``outbox`` and ``retired`` are written under the pool's lock."""

    def __init__(
        self,
        ctx: EnvContext,
        listener: WorkerListener[WorkerProcess],
        *,
        startup_timeout: float = 60.0,
    ) -> None:
        self.ctx = ctx
        self.listener = listener
        self.startup_timeout = startup_timeout
        #: The calls handed to it and not answered yet, oldest (the running one) first.
        self.held: deque[Task] = deque()
        #: Calls of ``held`` not sent yet, in order (``flush`` sends them).
        self.outbox: deque[Task] = deque()
        self.pid = 0
        self.idle_since = 0.0
        self.ready = False
        #: Being killed (a call it ran was cancelled): it takes no other call. Pool's lock.
        self.retired = False
        self.proc: subprocess.Popen[bytes] | zygote.ForkedChild | None = None
        self.channel: Channel | None = None
        self._sock: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._stopping = False
        #: The reader thread's job (``threads.run``), once started.
        self._thread: threads.Job | None = None
        self._startup_tail = b""
        #: A pidfd of the process (Linux): readable once it exits. Reader thread's.
        self._exit_fd: int | None = None
        #: When the reader saw it exit (monotonic), None while it lives.
        self._exited_at: float | None = None
        #: Held while signalling the group and while reaping: never one after the other.
        self._reap_lock = threading.Lock()
        #: Held by whoever handles what the worker sent: the reader thread, for each batch of
        #: events, or a thread reading its own call's answer (``read_answer``). An RLock for
        #: its owner: an interrupted reader releases it only if it took it.
        self._read_lock = threading.RLock()
        #: The reader thread's epoll, while it reads (None before and after). Read lock.
        self._poller: select.epoll | None = None
        #: The descriptors registered in it: the output pipes until their EOF.
        self._watched: set[int] = set()
        #: What ``read_answer`` polls: the socket and ``_watched``. Read lock.
        self._waiter: select.poll | None = None
        self._forwarders: dict[int, StreamForwarder] = {}
        #: Where the output of the last answered call went (output after it goes there too).
        self._last: OutputTarget | None = None
        #: What went wrong while a waiting thread read (``read_answer``): the reader reports it.
        self._broken: BaseException | None = None
        #: Whether a thread waiting for an answer polls before blocking (``protocol.Spin``).
        self._spin = protocol.Spin(GAUGE)

    def __repr__(self) -> str:
        return f"<WorkerProcess pid={self.pid} ready={self.ready} held={len(self.held)}>"

    @property
    def task(self) -> Task | None:
        """The call it runs (or is about to): the oldest it holds."""
        held = self.held
        return held[0] if held else None

    # -- lifecycle, called by the pool -----------------------------------------------------

    def start(self) -> None:
        """Launch the process and its reader thread; ``WorkerError`` if it cannot start.

        A worker stopped or killed before it started (its pool closed meanwhile) is not
        launched. Holding ``_send_lock`` makes ``stop`` wait for the launch, so the pool's
        ``join`` that follows sees the process.
        """
        with self._send_lock:
            if self._stopping:
                return
            self._launch()
            if self.proc is not None:
                self._thread = threads.run(self._run, f"jupyter-runtimeenv-worker-{self.pid}")

    def _launch(self) -> None:
        env = process_env(self.ctx)
        env[CLOUDPICKLE_VAR] = _CLOUDPICKLE_DIR
        ours, theirs = socket.socketpair()
        prepare_socket(ours)
        life = lifeline.lifeline_fd()
        args = ["--fd", str(theirs.fileno()), "--lifeline", str(life), "--parent", str(os.getpid())]
        argv = compose(self.ctx, [ENTRY, *args])
        idle = float(getattr(self.listener, "idle_timeout", zygote.DEFAULT_IDLE_TIMEOUT))
        try:
            # Forked from a template where it can be exactly what a spawn would make (~2 ms
            # instead of an interpreter start), else spawned.
            self.proc = zygote.fork(
                self.ctx,
                env,
                theirs.fileno(),
                entry=ENTRY,
                idle_timeout=idle,
                extra={CLOUDPICKLE_VAR: _CLOUDPICKLE_DIR},
            ) or lifeline.launch(
                lambda: subprocess.Popen(
                    argv,
                    env=env,
                    cwd=self.ctx.cwd,
                    pass_fds=(theirs.fileno(), life),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    # A Ctrl-C meant for the driver must not kill tasks; the driver ends
                    # workers. Its own group (killed as a whole), in the driver's session.
                    **lifeline.OWN_GROUP,
                )
            )
        except OSError as exc:
            ours.close()
            raise WorkerError(f"cannot start a worker with {argv[0]!r}: {exc}") from exc
        finally:
            theirs.close()
        self.pid = self.proc.pid
        self._exit_fd = lifeline.exit_fd(self.pid)
        self._sock = ours
        self.channel = Channel(ours, self.pid)

    def flush(self) -> None:
        """Send the calls waiting in ``outbox``, in order. A failure means the worker is
        dying: its reader thread reports it."""
        if not self.outbox and (self.channel is None or not self.channel.results.freed):
            return
        outbox = self.outbox
        with self._send_lock:
            tasks = []
            while outbox:
                try:
                    tasks.append(outbox.popleft())
                except IndexError:  # a cancel took the last one meanwhile
                    break
            channel, sock = self.channel, self._sock
            if sock is None or self._stopping or channel is None:
                return
            # Whether a CPU is spare, as the gauge read it lately: the worker polls for its
            # next call if so (the waiter for this one reads the same, ``read_answer``).
            spare = self._spin.spare(time.perf_counter())
            try:  # as ``_send``, without a closure per call: this is on every round trip
                one = channel.one_call(tasks, spare)
                if one is not None:  # an idle worker's call: one buffer, one write
                    sock.sendall(one)
                    return
                for buffers, fds in channel.packets(tasks, spare):
                    protocol.send(sock, buffers, fds)
            except OSError:
                pass  # dying: the reader thread reports it

    def cancel(self, task: Task) -> bool:
        """Tell the worker to skip ``task`` (sent, not answered); kill the worker if its
        status word says it runs it already (``True``). The CANCEL is written before the
        word is read, so a worker that had not started the call skips it (``protocol``)."""
        with self._send_lock:
            self._send(lambda channel: [channel.cancel([task.call.task_id])])
        channel = self.channel
        if channel is not None and channel.running() == task.call.task_id:
            self.kill()
            return True
        return False

    def preload(self, modules: list[str]) -> None:
        with self._send_lock:
            self._send(lambda channel: [channel.preload(modules)])

    def _send(self, packets: Any) -> None:
        """Under ``_send_lock``: write what ``packets(channel)`` makes."""
        channel = self.channel
        if self._sock is None or self._stopping or channel is None:
            return
        try:
            for buffers, fds in packets(channel):
                protocol.send(self._sock, buffers, fds)
        except OSError:
            pass  # dying: the reader thread reports it

    def running(self) -> int:
        """The id of the call the worker has started and not answered (its status word)."""
        return self.channel.running() if self.channel is not None else 0

    def stop(self) -> None:
        """Ask the worker to exit: it sees EOF on the channel and returns."""
        self._stopping = True
        with self._send_lock:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_WR)

    def kill(self) -> None:
        """SIGKILL the worker's process group: the worker and whatever its task started (a
        cancelled task, a framing error, a close that timed out). Never after the worker was
        reaped: its pid, and so its group id, may then be someone else's."""
        self._stopping = True
        with self._reap_lock:
            if self.proc is not None and self.proc.returncode is None:
                lifeline.kill_group(self.pid)

    def join(self, timeout: float) -> None:
        """Wait for the worker to end and its reader thread to report it (it reaps the
        worker and kills its group); kill it after ``timeout``."""
        thread = self._thread
        if thread is None or thread.is_current():
            return
        thread.join(timeout)
        if thread.is_alive():
            self.kill()
            thread.join(timeout)

    # -- the reader thread ---------------------------------------------------------------

    def _run(self) -> None:
        proc, sock, channel = self.proc, self._sock, self.channel
        if proc is None or proc.stdout is None or proc.stderr is None or sock is None:
            return
        if channel is None:
            return
        forwarders = self._forwarders = {
            proc.stdout.fileno(): StreamForwarder(1, self.pid),
            proc.stderr.fileno(): StreamForwarder(2, self.pid),
        }
        poller = select.epoll()
        for fd in forwarders:
            os.set_blocking(fd, False)
            poller.register(fd, select.EPOLLIN)
            self._watched.add(fd)
        sock_fd = sock.fileno()
        poller.register(sock_fd, select.EPOLLIN)
        if self._exit_fd is not None:
            poller.register(self._exit_fd, select.EPOLLIN)
        self._poller = poller
        error: WorkerError | None = None
        self._deadline = time.monotonic() + self.startup_timeout
        try:
            while True:
                timeout = None if self.ready else max(0.0, self._deadline - time.monotonic())
                if self._exited_at is not None:  # what it sent before it died, then done
                    grace = self._exited_at + _EXIT_GRACE - time.monotonic()
                    timeout = max(0.0, grace if timeout is None else min(timeout, grace))
                partial = _partial_due(forwarders)  # a progress bar's line is not held back
                if partial is not None:
                    wait = max(0.0, partial - time.monotonic())
                    timeout = wait if timeout is None else min(timeout, wait)
                events = poller.poll(-1 if timeout is None else timeout)
                with self._read_lock:  # a thread reading its answer may have taken it all
                    if self._broken is not None:
                        raise self._broken
                    if partial is not None:
                        target = self.task.output if self.task is not None else self._last
                        for forwarder in forwarders.values():
                            forwarder.tick(target)
                    if not events and self._exited_at is not None:
                        if time.monotonic() < self._exited_at + _EXIT_GRACE:
                            continue
                        error = None if self._stopping else self._died()
                        break
                    if not events and not self.ready:
                        if time.monotonic() < self._deadline:
                            continue
                        what = "import the pool's modules" if self._hello_seen else "say HELLO"
                        error = self._startup_error(f"did not {what} in time")
                        break
                    if not events:
                        continue
                    readable = {fd for fd, _ in events}
                    if self._exit_fd is not None and self._exit_fd in readable:
                        # Its own exit, not the EOF of pipes a fork of it may still hold: end
                        # its group (those forks die, their copies close), read what is left.
                        poller.unregister(self._exit_fd)
                        readable.discard(self._exit_fd)
                        self._exited_at = time.monotonic()
                        with self._reap_lock:
                            lifeline.kill_group(self.pid)
                        sock.settimeout(_EXIT_GRACE)
                    if sock_fd not in readable:  # output alone: shown as it comes
                        self._drain(self.task.output if self.task is not None else self._last)
                        continue
                    try:
                        alive = channel.reader.pump(socket.MSG_DONTWAIT)
                    except BlockingIOError:  # a thread waiting for its answer read it all
                        if len(readable) > 1:
                            self._drain(self.task.output if self.task is not None else self._last)
                        continue
                    except ConnectionResetError:  # it died with bytes of ours unread
                        alive = False
                    except OSError:
                        if self._exited_at is None:
                            raise
                        alive = False  # it died inside a frame; a survivor holds the socket
                    if not alive:
                        error = None if self._stopping else self._died()
                        break
                    self._frames_after_output(channel, poller.poll, sock_fd)
        except (protocol.ProtocolError, OSError, ValueError) as exc:
            self.kill()
            error = BrokenWorker(f"worker pid {self.pid} broke the protocol: {exc}")
        except WorkerError as exc:
            error = exc
        except Exception as exc:  # MemoryError, a bug: never leave the task hanging
            self.kill()
            error = BrokenWorker(f"worker pid {self.pid}: the driver failed to read it: {exc!r}")
        finally:
            with self._read_lock:  # no waiting thread touches it from now on
                self._poller = None
            poller.close()
        self._finish(error)

    def _died(self) -> WorkerError:
        code = self._exit_code()
        if not self.ready:
            return self._startup_error(f"exited ({_describe_exit(code)}) before it was ready")
        running = f" while running {self.task.name}" if self.task is not None else ""
        # Killed by someone who said why (the sidebar's Stop): their words, not SIGKILL's.
        note = stops.take(self.pid) if code == -signal.SIGKILL else None
        if note is not None:
            return BrokenWorker(f"worker pid {self.pid} {note}{running}")
        return BrokenWorker(f"worker pid {self.pid} died{running}: {_describe_exit(code)}")

    def _startup_error(self, what: str) -> WorkerError:
        self.kill()
        tail = self._startup_tail.decode("utf-8", "replace").strip()
        detail = f"\n--- its stderr ---\n{tail}" if tail else ""
        return WorkerError(f"worker pid {self.pid} ({self.ctx.python}) {what}{detail}")

    def _exit_code(self) -> int | None:
        return self._reap(5.0)

    def _reap(self, timeout: float) -> int | None:
        """Wait for the worker to exit (killing it after ``timeout``: it closed its end but
        lives on), SIGKILL its group while its pid is still ours, then reap it."""
        proc = self.proc
        if proc is None:
            return None
        if proc.returncode is None and not self._wait_exit(timeout):
            self.kill()
            self._wait_exit(None)
        with self._reap_lock:
            if proc.returncode is None:
                lifeline.kill_group(self.pid)  # forks of a task, its children
            return proc.wait()

    def _wait_exit(self, timeout: float | None) -> bool:
        """Whether the worker exited within ``timeout``, without reaping it (a zombie keeps
        its pid reserved for ``kill_group``)."""
        if self._exit_fd is not None:
            if self._exited_at is not None:
                return True
            with selectors.DefaultSelector() as waiter:
                waiter.register(self._exit_fd, selectors.EVENT_READ)
                return bool(waiter.select(timeout))
        # No pidfd: waitid(WNOWAIT) where there is one, else give up the group kill.
        waitid = getattr(os, "waitid", None)
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            if waitid is None:
                return self._poll_reaps(timeout)
            try:
                if waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG):
                    return True
            except ChildProcessError:
                return True
            if end is not None and time.monotonic() >= end:
                return False
            time.sleep(0.01)

    def _poll_reaps(self, timeout: float | None) -> bool:
        assert self.proc is not None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _finish(self, error: WorkerError | None) -> None:
        self._stopping = True
        target = self.task.output if self.task is not None else self._last
        if self.proc is not None:
            self._exit_code()
            if self._exit_fd is not None:
                os.close(self._exit_fd)
                self._exit_fd = None
            self._drain(target)
            for forwarder in self._forwarders.values():
                forwarder.flush(target)
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()
        with self._send_lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
        self.listener.worker_died(
            self, error or WorkerError(f"worker pid {self.pid} stopped ({self._status()})")
        )
        if self.channel is not None:  # after the pool read the status word
            self.channel.close()

    def _status(self) -> str:
        return _describe_exit(None if self.proc is None else self.proc.returncode)


#: Exit codes of the bootstrap's own (``_entry``), explained.
_KNOWN_EXITS = {
    STDIO_BROKEN: "a task closed its stdout or stderr, so it was replaced",
    ORPHANED: "its driver was gone",
}


def _partial_due(forwarders: dict[int, StreamForwarder]) -> float | None:
    """The earliest time a forwarder's pending partial line is to be written."""
    dues = [due for f in forwarders.values() if (due := f.due()) is not None]
    return min(dues, default=None)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed by signal {-code}"
    known = _KNOWN_EXITS.get(code)
    return f"exit code {code} ({known})" if known else f"exit code {code}"
