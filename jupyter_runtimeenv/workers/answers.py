"""What a worker sends, as its handle reads it: the other half of ``process.WorkerProcess``.

``Answers`` is ``WorkerProcess``'s base class: ``process`` starts the worker, sends it calls,
runs the reader thread and ends the process; this handles what the reader thread (or a
thread waiting for its call's answer) read. Answers settle their calls' futures after the
output that came before them is drained (``_answered``, ``_drain``); the other frames
(HELLO, READY, FREE, DROP, IMPORTS) go to the pool, the worker's ``WorkerListener``
(``_notice``); and a thread waiting in ``RemoteFuture.result`` for the call the worker runs
reads its answer itself for a short while (``read_answer``; see ``process``'s docstring).

The attributes named below are made in ``WorkerProcess.__init__``, where each is described.
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ..errors import BrokenWorker, WorkerError, WorkerSetupError
from . import protocol, vcpu
from ._serve import PRELOAD_SECONDS
from .channel import Channel
from .future import SETTLED, Task
from .output import OutputTarget, StreamForwarder

_ANSWERS = frozenset((protocol.RETURN, protocol.RAISE, protocol.SKIP))
#: How long a thread waiting for an answer reads the socket itself (``read_answer``) before
#: it leaves that to the reader thread again: a short call's answer comes well within it; a
#: longer call's output waits for the reader at most this long.
ANSWER_WINDOW = 0.005
_HANGUP = select.POLLHUP | select.POLLERR | select.POLLNVAL
_DONTWAIT = int(socket.MSG_DONTWAIT)  # an int, not the enum member: converted at each read
_TAIL_BYTES = 4096


#: The worker's type as its listener knows it (``process.WorkerProcess``).
W_contra = TypeVar("W_contra", contravariant=True)


class WorkerListener(Protocol[W_contra]):
    """What a worker's reader thread tells its owner (the pool). Called without locks held;
    after ``worker_ready`` and ``tasks_answered`` the thread flushes the worker's outbox."""

    def worker_hello(self, worker: W_contra) -> list[str]: ...

    def worker_ready(self, worker: W_contra) -> None: ...

    def tasks_answered(self, worker: W_contra, durations: list[int | None]) -> list[Task]: ...

    def task_answered(self, worker: W_contra, duration: int) -> Task | None: ...

    def imports_learned(self, worker: W_contra, modules: list[str]) -> None: ...

    def worker_died(self, worker: W_contra, error: WorkerError) -> None: ...


class Answers:
    """The reading half of a ``WorkerProcess`` (its base class)."""

    # Made in ``WorkerProcess.__init__`` (described there).
    pid: int
    ready: bool
    held: deque[Task]
    listener: WorkerListener[Any]  # of the WorkerProcess this is
    channel: Channel | None
    startup_timeout: float
    _sock: socket.socket | None
    _stopping: bool
    _exited_at: float | None
    _read_lock: threading.RLock
    _poller: select.epoll | None
    _watched: set[int]
    _waiter: select.poll | None
    _forwarders: dict[int, StreamForwarder]
    _last: OutputTarget | None
    _broken: BaseException | None
    _spin: protocol.Spin
    _startup_tail: bytes

    # ``WorkerProcess``'s.
    @property
    def task(self) -> Task | None:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError

    def preload(self, modules: list[str]) -> None:
        raise NotImplementedError

    _hello_seen = False
    _preloading = False
    _deadline = 0.0

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
        # The future's state, read without its lock (a stale PENDING costs one more poll).
        while future._state not in SETTLED:
            events = self._poll(waiter, end, task)
            if not events:
                return
            answered = False
            for fd, mask in events:  # a loop, not any(): this is on every round trip
                if mask & _HANGUP:
                    return  # it died or closed a stream: the reader thread sees to it
                if fd == sock_fd:
                    answered = True
            owed = list(self.held)
            try:
                if not answered:  # output alone: shown as it comes
                    self._drain(self.task.output if self.task is not None else self._last)
                    continue
                try:
                    alive = channel.reader.pump(_DONTWAIT)
                except (BlockingIOError, ConnectionResetError):
                    return
                if not alive:
                    return  # EOF: the reader thread reads it again and reports the death
                if len(events) == 1 and len(owed) == 1:
                    # Its one call's answer, and no output: this poll looked at the socket
                    # first (``waiter`` has it first, and a poll takes its descriptors in
                    # order), and at the pipes after, when all that call printed was in
                    # them (the worker flushes before it answers). It holds no other call,
                    # so nothing read came after this answer: no second poll for output.
                    self._frames(channel)
                    continue
                self._frames_after_output(channel, waiter.poll, sock_fd)
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

    def _poll(self, waiter: select.poll, end: float, task: Task) -> list[tuple[int, int]]:
        """``read_answer``'s wait for what the worker sends, until ``end``: with a CPU to
        spare, polled for a moment first while its calls are answered back to back
        (``protocol.Spin``). Past ``end``: what is there already."""
        return self._spin.wait(
            lambda: waiter.poll(0) or None,
            lambda timeout: waiter.poll((timeout or 0.0) * 1e3),
            end,
            lambda: self._late(task),
        )

    def _late(self, task: Task) -> None:
        """A poll for ``task``'s answer is late (``protocol.LATE``): if the worker has not
        even started it (its status word), it waits for a CPU, perhaps the one this thread
        polls on: moved off it once (``vcpu.part``)."""
        channel = self.channel
        if channel is not None and channel.running() != task.call.task_id:
            vcpu.part(self.pid)

    def _frames_after_output(
        self, channel: Channel, poll: Callable[[float], list[tuple[int, int]]], sock_fd: int
    ) -> None:
        """Handle the frames just read, after the output the worker wrote before them.

        The worker flushes its output, then sends: once a frame is read, what its call
        printed is in the pipes. It is drained here, after the read, to the call that runs:
        not by the events of a poll before the read, which may be stale (the reader thread
        waited for the read lock while a caller read) or older than a frame that came after
        them. Drained after its call was answered, a line went to the next call's cell (a
        cell's first line, about 1 in 1,500 alternations of two cells; test_pipeline).
        (Not called for the one answer of a worker that held one call, read by its waiter
        right after a poll of its own that saw the socket alone: ``_read_for`` says why.)"""
        for fd, _ in poll(0):  # a loop, not any() of a generator: on every round trip
            if fd != sock_fd:
                self._drain(self.task.output if self.task is not None else self._last)
                break
        self._frames(channel)

    def _frames(self, channel: Channel) -> None:
        """Handle the frames read so far (read lock held)."""
        frames = channel.reader.frames()
        if len(frames) == 1 and frames[0][0] == protocol.RETURN:  # an idle worker's answer
            payload = frames.pop()[1]
            self._last = self._returned(channel, payload)
            return
        answers: list[tuple[int, bytes | bytearray]] = []
        for kind, payload in frames:
            if kind in _ANSWERS:
                answers.append((kind, payload))
            else:
                self._notice(kind, payload)
        if answers:
            self._last = self._answered(answers)

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

    def _returned(self, channel: Channel, payload: bytes | bytearray) -> OutputTarget:
        """``_answered`` for one RETURN, the answer of a worker that ran one call: the same
        steps, in a straight line (no lists of answers to pair with their tasks)."""
        if not self.ready:
            raise protocol.ProtocolError("an answer before the worker was ready")
        task = self.listener.task_answered(self, _duration(payload))
        if task is None:
            raise protocol.ProtocolError("1 answers for 0 calls")
        self.flush()  # the worker's next calls go out before the waiter wakes
        output = task.output
        for forwarder in self._forwarders.values():
            forwarder.flush(output)
        future = task.future
        try:
            value = channel.returned(task, payload)
        except protocol.ProtocolError as exc:
            _break([task], f"worker pid {self.pid} broke the protocol: {exc}")
            raise
        except Exception as exc:
            del payload
            future.settle_exception(exc)
            return output
        del payload
        future.settle_result(value)
        return output

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


def _duration(payload: bytes | bytearray) -> int:
    """A RETURN's call duration (ns); its head is checked when the value is loaded."""
    if len(payload) < protocol.RETURN_HEAD.size:
        raise protocol.ProtocolError(f"RETURN of {len(payload)} bytes is too short")
    duration: int = protocol.RETURN_HEAD.unpack_from(payload)[1]
    return duration


def _break(tasks: list[Task], message: str) -> None:
    for task in tasks:
        task.future.settle_exception(BrokenWorker(message))
