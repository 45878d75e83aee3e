"""``WorkerProcess``: the driver's handle on one worker process.

Created and owned by ``Pool``. ``start()`` forks the worker from a template of its
interpreter (``zygote``), or where that cannot give exactly the same worker spawns
``compose(ctx, [_entry.py, "--fd", N, ...])``; either way with one end of a socketpair as
fd ``N``, stdout/stderr on pipes, in a session of its own. One reader thread per worker
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
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from typing import Any, Protocol

import cloudpickle

from .._cpuload import Gauge
from ..context import EnvContext, compose, process_env
from ..errors import BrokenWorker, WorkerError, WorkerSetupError
from . import lifeline, protocol, stops, zygote
from ._entry import ORPHANED, STDIO_BROKEN
from ._serve import PRELOAD_SECONDS
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
_TAIL_BYTES = 4096
#: After the worker exited: how long frames and output it sent may still be read (a fork
#: that escaped its group may hold our end of the pipes open forever).
_EXIT_GRACE = 2.0


_ANSWERS = frozenset((protocol.RETURN, protocol.RAISE, protocol.SKIP))
#: How long a thread waiting for an answer reads the socket itself (``read_answer``) before
#: it leaves that to the reader thread again: a short call's answer comes well within it; a
#: longer call's output waits for the reader at most this long.
ANSWER_WINDOW = 0.005
_HANGUP = select.POLLHUP | select.POLLERR | select.POLLNVAL


class WorkerListener(Protocol):
    """What a worker's reader thread tells its owner (the pool). Called without locks held;
    after ``worker_ready`` and ``tasks_answered`` the thread flushes the worker's outbox."""

    def worker_hello(self, worker: WorkerProcess) -> list[str]: ...

    def worker_ready(self, worker: WorkerProcess) -> None: ...

    def tasks_answered(self, worker: WorkerProcess, durations: list[int | None]) -> list[Task]: ...

    def imports_learned(self, worker: WorkerProcess, modules: list[str]) -> None: ...

    def worker_died(self, worker: WorkerProcess, error: WorkerError) -> None: ...


class WorkerProcess:
    """One worker. ``held``, ``outbox`` and ``retired`` are written under the pool's lock."""

    def __init__(
        self, ctx: EnvContext, listener: WorkerListener, *, startup_timeout: float = 60.0
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
        self._thread: threading.Thread | None = None
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
            if self._thread is not None:
                self._thread.start()

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
                    # workers. Its own session: its group is killed as a whole.
                    start_new_session=True,
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
        self._thread = threading.Thread(
            target=self._run, name=f"jupyter-runtimeenv-worker-{self.pid}", daemon=True
        )

    def flush(self) -> None:
        """Send the calls waiting in ``outbox``, in order. A failure means the worker is
        dying: its reader thread reports it."""
        if not self.outbox and (self.channel is None or not self.channel.results.freed):
            return
        with self._send_lock:
            tasks = []
            while self.outbox:
                try:
                    tasks.append(self.outbox.popleft())
                except IndexError:  # a cancel took the last one meanwhile
                    break
            self._send(lambda channel: channel.encode(tasks))

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
        if thread is None or thread is threading.current_thread():
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
                    # Output written before a frame is reported by the same poll (the worker
                    # flushes, then sends; epoll is level-triggered), so it is drained first.
                    if len(readable) > (sock_fd in readable):
                        self._drain(self.task.output if self.task is not None else self._last)
                    if sock_fd not in readable:
                        continue
                    try:
                        alive = channel.reader.pump(socket.MSG_DONTWAIT)
                    except BlockingIOError:  # a thread waiting for its answer read it all
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
                    self._frames(channel)
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

    def _frames(self, channel: Channel) -> None:
        """Handle the frames read so far (read lock held)."""
        answers: list[tuple[int, bytes | bytearray]] = []
        for kind, payload in channel.reader.frames():
            if kind in _ANSWERS:
                answers.append((kind, payload))
            else:
                self._notice(kind, payload)
        if answers:
            self._last = self._answered(answers)

    def read_answer(self, task: Task, timeout: float | None) -> None:
        """Read what the worker sends, in this thread (one waiting for ``task``'s future),
        until the future is done, for ``ANSWER_WINDOW`` (or ``timeout``) at most; then the
        reader thread reads again. Only while ``task`` is the call the worker runs and no
        one else reads (else it returns at once). An interrupt while it waits leaves
        nothing half-read; one while it handles what it read (tens of microseconds) breaks
        the worker: the calls it answered then fail with ``BrokenWorker``."""
        window = ANSWER_WINDOW if timeout is None else min(ANSWER_WINDOW, timeout)
        if window <= 0 or not self.ready or self._poller is None:
            return
        try:  # one step: the reader thread may take the last call off between two
            running = self.held[0]
        except IndexError:
            return
        if running is not task:
            return
        lock = self._read_lock
        if lock._is_owned():  # type: ignore[attr-defined]  # reading already: a done-callback
            return
        # An interrupt (KeyboardInterrupt in the main thread) can come at the end of any
        # call below: whatever it skips, the finally clauses undo (the lock is an RLock:
        # released only by its owner, so not taking it is no harm), and each undoing step
        # is one call, done before the next interrupt could be raised.
        try:
            if not lock.acquire(blocking=False):
                return
            poller, sock, channel = self._poller, self._sock, self.channel
            if poller is None or sock is None or channel is None or self._stopping:
                return
            if self._broken is not None or self._exited_at is not None:
                return
            sock_fd = sock.fileno()
            try:
                poller.modify(sock_fd, 0)  # the reader thread is not woken for what we read
                self._read_for(task, window, sock_fd, channel)
            finally:
                poller.modify(sock_fd, select.EPOLLIN)  # what is left wakes it at once
        finally:
            try:  # noqa: SIM105 - contextlib.suppress's __enter__ is Python: interruptible
                lock.release()
            except RuntimeError:  # not ours: the reader thread's, or never taken
                pass

    def _read_for(self, task: Task, window: float, sock_fd: int, channel: Channel) -> None:
        """``read_answer``'s loop (read lock held)."""
        waiter = self._waiter
        if waiter is None:  # made again when an output pipe is gone
            waiter = self._waiter = select.poll()
            waiter.register(sock_fd, select.POLLIN)
            for fd in self._watched:
                waiter.register(fd, select.POLLIN)
        future = task.future
        end = time.perf_counter() + window
        while not future.done():
            events = self._poll(waiter, end)
            if not events:
                return
            if any(mask & _HANGUP for _fd, mask in events):
                return  # it died or closed a stream: the reader thread sees to it
            owed = list(self.held)
            answered = any(fd == sock_fd for fd, _mask in events)
            try:
                if len(events) > answered:  # output before the answer: shown first
                    self._drain(self.task.output if self.task is not None else self._last)
                if not answered:
                    continue
                try:
                    alive = channel.reader.pump(socket.MSG_DONTWAIT)
                except (BlockingIOError, ConnectionResetError):
                    return
                if not alive:
                    return  # EOF: the reader thread reads it again and reports the death
                self._frames(channel)
            except BaseException as exc:
                # Half-handled: the stream or the pool's view of it cannot be trusted. The
                # worker goes; the calls whose answers were read and not settled fail; the
                # reader thread reports the rest as a death.
                message = f"worker pid {self.pid}: reading its answer failed: {exc!r}"
                self._broken = exc if isinstance(exc, Exception) else BrokenWorker(message)
                self.kill()
                _break([t for t in owed if t not in self.held and not t.future.done()], message)
                if isinstance(exc, Exception):
                    return
                raise

    def _poll(self, waiter: select.poll, end: float) -> list[tuple[int, int]]:
        """``read_answer``'s wait for what the worker sends, until ``end``: with a CPU to
        spare, polled for a moment first while its calls are answered back to back
        (``protocol.Spin``). Past ``end``: what is there already."""
        return self._spin.wait(
            lambda: waiter.poll(0) or None, lambda timeout: waiter.poll((timeout or 0.0) * 1e3), end
        )

    _hello_seen = False
    _preloading = False
    _deadline = 0.0

    @property
    def preloading(self) -> bool:
        """Between HELLO and READY: importing what the pool learned."""
        return self._preloading

    def _notice(self, kind: int, payload: bytes | bytearray) -> None:
        """A frame that answers no call."""
        channel = self.channel
        assert channel is not None
        if kind == protocol.HELLO and not self._hello_seen:
            self._hello_seen = True
            self._hello(payload)
            channel.map_status()
            modules = self.listener.worker_hello(self)
            if modules:  # it imports them, then says READY
                self._preloading = True
                self._deadline = time.monotonic() + PRELOAD_SECONDS + self.startup_timeout
                self.preload(modules)
            else:
                self._become_ready()
        elif kind == protocol.READY and self._preloading:
            self._preloading = False
            self._become_ready()
        elif kind == protocol.FREE:
            channel.freed(payload)
        elif kind == protocol.DROP:
            channel.dropped(payload)
        elif kind == protocol.IMPORTS and self._hello_seen:  # a call may precede READY
            modules = json.loads(payload)
            if isinstance(modules, list):
                self.listener.imports_learned(self, [m for m in modules if isinstance(m, str)])
        else:
            raise protocol.ProtocolError(f"unexpected frame kind {kind}")

    def _become_ready(self) -> None:
        self.ready = True
        self.listener.worker_ready(self)
        self.flush()

    def _hello(self, payload: bytes | bytearray) -> None:
        hello: dict[str, Any] = json.loads(payload)
        if hello.get("version") != protocol.PROTOCOL_VERSION:
            self.kill()
            raise WorkerError(
                f"worker pid {self.pid} speaks protocol {hello.get('version')}, "
                f"the driver {protocol.PROTOCOL_VERSION}: mixed jupyter-runtimeenv versions"
            )
        writer = self.channel.reader.peer if self.channel is not None else None
        if hello.get("pid") != writer:  # the credentials of the bytes say who wrote them
            raise protocol.ProtocolError(f"HELLO says pid {hello.get('pid')}, written by {writer}")
        failed = hello.get("setup_error")
        if failed:
            self.kill()
            raise WorkerSetupError(
                f"worker pid {self.pid} did not start: worker_process_setup_hook"
                f" {failed['hook']} raised {failed['type']}: {failed['message']}",
                hook=str(failed["hook"]),
                traceback=str(failed["traceback"]),
            )

    def _answered(self, answers: list[tuple[int, bytes | bytearray]]) -> OutputTarget:
        """Answers of the oldest calls held, in order: hand the worker its next calls, then
        settle the futures."""
        if not self.ready:
            raise protocol.ProtocolError("an answer before the worker was ready")
        durations = [_duration(p) if k == protocol.RETURN else None for k, p in answers]
        tasks = self.listener.tasks_answered(self, durations)
        if len(tasks) < len(answers):
            _break(tasks, f"worker pid {self.pid} answered calls it was not given")
            raise protocol.ProtocolError(f"{len(answers)} answers for {len(tasks)} calls")
        self.flush()  # the worker's next calls go out before the waiters wake: keeps it busy
        for forwarder in self._forwarders.values():
            forwarder.flush(tasks[-1].output)
        channel = self.channel
        assert channel is not None
        for index, (task, (kind, payload)) in enumerate(zip(tasks, answers, strict=True)):
            value: Any
            try:
                if kind == protocol.SKIP:
                    if protocol.ID.unpack(payload)[0] != task.call.task_id:
                        raise protocol.ProtocolError(f"SKIP of a call other than {task.id}")
                    continue  # its future was cancelled: nothing to settle
                value, failed = channel.outcome(task, kind, payload), False
            except protocol.ProtocolError as exc:
                _break(tasks[index:], f"worker pid {self.pid} broke the protocol: {exc}")
                raise
            except Exception as exc:
                value, failed = exc, True
            del payload
            if failed:
                task.future.settle_exception(value)
            else:
                task.future.settle_result(value)
        return tasks[-1].output

    def _drain(self, target: OutputTarget | None) -> None:
        """Read the output pipes until they are empty (read lock held, or the reader done)."""
        for fd, forwarder in self._forwarders.items():
            while True:
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:  # EOF: the process is gone or closed its stream
                    if fd in self._watched:
                        self._watched.discard(fd)
                        self._waiter = None
                        if self._poller is not None:
                            self._poller.unregister(fd)
                    break
                if not self.ready and forwarder.stream == 2:
                    self._startup_tail = (self._startup_tail + data)[-_TAIL_BYTES:]
                forwarder.feed(data, target)

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


def _duration(payload: bytes | bytearray) -> int:
    """A RETURN's call duration (ns); its head is checked when the value is loaded."""
    if len(payload) < protocol.RETURN_HEAD.size:
        raise protocol.ProtocolError(f"RETURN of {len(payload)} bytes is too short")
    duration: int = protocol.RETURN_HEAD.unpack_from(payload)[1]
    return duration


def _break(tasks: list[Task], message: str) -> None:
    for task in tasks:
        task.future.settle_exception(BrokenWorker(message))


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
