"""The worker protocol: a handshake, then length-prefixed frames on a Unix socket.

Both sides use this module: the driver (``channel.py``) imports it normally; the worker
(``_entry.py``, ``_serve.py``) loads it by file path, so it imports only the standard library
(``_socket``, not ``socket``: the wrapper costs ~3 ms at every worker start).

A frame is a 9-byte header, ``kind`` (1 byte) and ``length`` (8 bytes, big endian), then
``length`` bytes of payload. File descriptors (memfds: the status word, shared memory
segments) travel as ``SCM_RIGHTS`` with the first bytes of the frame that names them::

    worker -> driver   HELLO    JSON {"version", "pid", "python", "sys_path_added", ...};
                                carries the status word's memfd
    driver -> worker   PRELOAD  JSON list of modules the pool learned (``Pool``), once
    worker -> driver   READY    JSON {"imported", "failed", "seconds"}, after PRELOAD
    driver -> worker   FUNC     ``KEY`` + the function's pickle, once per function and worker
    driver -> worker   CALL     ``CALL_HEAD`` + spans + the pickle of ``(args, kwargs)``
    driver -> worker   CANCEL   task ids (``ID`` each) to skip if not started yet
    driver -> worker   FREE     ids (``SEGMENT``) of the worker's segments the driver let go
    driver -> worker   DROP     ids of the driver's segments it truncated (unmap them)
    worker -> driver   RETURN   ``RETURN_HEAD`` + spans + the pickle of the value
    worker -> driver   RAISE    pickle of a dict of plain values (see ``_serve.failure``)
    worker -> driver   SKIP     the id of a cancelled call it did not start
    worker -> driver   FREE     ids of the driver's segments the worker let go
    worker -> driver   DROP     ids of the worker's segments it truncated
    worker -> driver   IMPORTS  JSON list of modules a call imported (learned by the pool)

Calls are pipelined: the driver may send a worker several CALLs; the worker runs them one at
a time in order and answers each (RETURN, RAISE or SKIP) before it starts the next, so the
answers come in the order of the calls. Before it starts a call the worker writes the call's
id into its *status word* (an 8-byte shared memory word the driver maps), then reads what has
arrived (a CANCEL turns the call into a SKIP), and clears the word after answering. The word
is how the driver knows, when a worker dies or a held call is cancelled, which call may have
run: every other unanswered call provably never started.

Only the worker's own process may answer. The driver's socket has ``SO_PASSCRED``: every
read returns bytes of one writer with the writer's pid (the kernel never glues bytes of two
writers into one read), and bytes written by any other process — a forked child of a task
that kept the socket — are dropped unread (``Reader.foreign``). The worker also takes the
socket away from its ``os.fork()`` children (``_serve``).

Each side waits for the other's next frame with a blocking read, or, while frames come back
to back and the machine has a CPU to spare, polls for it for up to ``SPIN_WINDOW`` first
(``Spin``, ``Reader.wait``): on a machine whose idle CPUs halt, a wake-up costs more than a
round trip's work. Whether a CPU is spare is read by the driver alone, and each CALL says
what it read (``SPARE``): both ends poll, or neither.

The driver ends a worker by closing its end (the worker sees EOF and exits). Anything else
(an unknown kind, a length over ``MAX_FRAME``, EOF inside a frame, a missing descriptor) is
a ``ProtocolError``: the side that sees it stops talking, and the driver kills the worker.
"""

from __future__ import annotations

import _socket
import os
import select
import struct
import time
from collections import deque

TYPE_CHECKING = False  # the bootstrap loads this file: no typing at run time
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import Protocol, TypeVar

    Buffer = bytes | bytearray | memoryview
    T = TypeVar("T")

    class Gauge(Protocol):
        def least(self, now: float) -> tuple[int | None, int]: ...


PROTOCOL_VERSION = 2

HELLO = 1
CALL = 2
RETURN = 3
RAISE = 4
FUNC = 5
CANCEL = 6
SKIP = 7
PRELOAD = 8
READY = 9
FREE = 10
IMPORTS = 11
DROP = 12
KINDS = frozenset(range(1, 13))

HEADER = struct.Struct("!BQ")
#: Function keys: a digest of the function's pickle (``serialize``), fixed length.
KEY_SIZE = 16
#: CALL: task id, function key, flags, out-of-band buffer count; then that many ``SPAN``s.
CALL_HEAD = struct.Struct(f"!Q{KEY_SIZE}sBI")
#: RETURN: task id, the call's duration in ns (the pool learns which calls are short),
#: out-of-band buffer count; then that many ``SPAN``s.
RETURN_HEAD = struct.Struct("!QQI")
#: An out-of-band buffer in shared memory: segment id, offset, length (``shm``).
SPAN = struct.Struct("!IQQ")
ID = struct.Struct("!Q")
SEGMENT = struct.Struct("!I")
#: The status word: the id of the call the worker runs, 0 between calls (native order).
STATUS = struct.Struct("=Q")

#: CALL flags.
ARGS_SHARED = 1  # the spans name segments of the driver's arena
RESULT_SHARED = 2  # large buffers of the result may go through the worker's arena
SPARE = 4  # the driver's gauge says a CPU is spare: the worker may poll for its next call

#: Larger than any sane payload, small enough to catch a garbage length at once.
MAX_FRAME = 1 << 40
#: A frame's buffer is allocated up to this size at once; beyond, as the data arrives.
_UPFRONT = 1 << 26
#: Below this a payload is copied behind its header so that a frame is one buffer.
_SMALL = 1 << 16
#: Descriptors accepted with one read (a frame carries one at most).
_MAX_FDS = 8
_CREDS = struct.Struct("iII")  # struct ucred: pid, uid, gid
_ANCILLARY = _socket.CMSG_SPACE(_CREDS.size) + _socket.CMSG_SPACE(4 * _MAX_FDS)
_IOV_MAX = 512


#: How long a side waiting for its peer's next frame polls before it blocks (``Spin``).
SPIN_WINDOW = 200e-6
#: A gap this long between two polls of a spin: the CPU was taken from us; block instead.
PREEMPTED = 50e-6
#: A spin still polling this long after it began calls its ``late`` (once): an idle peer that
#: polls answers a short call in ~10-30 us.
LATE = 30e-6


class Spin:
    """One side's wait for its peer's next frame: polled for a moment before it blocks.

    Where an idle CPU halts (a virtual machine's vCPU), waking a thread blocked in a read
    costs ~30 us (here: a raw pipe round trip takes 69 us on a quiet machine and 6 us when
    every CPU is busy), as much as both sides' work in a round trip. Polling for a short
    window (``SPIN_WINDOW``) instead catches a frame that comes soon without that wake-up.
    Only where it costs nobody:

    - a CPU is spare (``spare``, checked first: on a busy machine nothing else of this is
      done): where tasks wait for a CPU, a spinner takes one that its peer or anyone else
      needs, and gives up the head start a woken sleeper gets;
    - frames come back to back: the last wait ended within the window (a call after a pause
      is followed by one window of polling at most);
    - it keeps its CPU: a gap between two polls (``PREEMPTED``) says the CPU was taken from
      it, and it blocks.

    ``gauge`` is a ``_cpuload.Gauge`` (duck-typed: a worker loads that module by path, and
    this one imports none of the package's): the driver's. ``None``: the worker's, which
    does not read the machine itself but is told with each call (``told``, the CALL's
    ``SPARE``): one reading decides for both ends, so they poll together or not at all (each
    end reading its own, at other instants, a quick run's W2 could have one end polling:
    ~0.08 ms, where both polling is ~0.06 and neither ~0.11-0.16).
    """

    __slots__ = ("back_to_back", "ended", "gauge", "told")

    def __init__(self, gauge: Gauge | None) -> None:
        self.back_to_back = False
        #: When the last wait ended (``time.perf_counter``): a peer polls for our next frame
        #: ``SPIN_WINDOW`` after it answered, and sleeps after that (see ``wait``'s ``late``).
        self.ended = -1.0
        self.gauge = gauge
        self.told = False

    def spare(self, now: float) -> bool:
        """Whether a CPU is spare for polling, as the gauge read it at most its ``EVERY``
        before ``now`` (without one: as the peer last said)."""
        if self.gauge is None:
            return self.told
        least, cpus = self.gauge.least(now)
        # The count includes us and our peer (running while we wait for it): polling takes a
        # CPU, the peer needs one, and nobody else may be left waiting. One CPU: the peer
        # needs ours.
        return least is not None and cpus > 1 and least <= cpus

    def deadline(self, now: float) -> float:
        """Until when (``time.perf_counter``) to poll, a CPU being spare: ``now`` for not
        at all."""
        return now + SPIN_WINDOW if self.back_to_back else now

    def waited(self, seconds: float) -> None:
        """The wait for a frame that began with ``deadline`` lasted ``seconds``."""
        self.back_to_back = seconds < SPIN_WINDOW

    def wait(
        self,
        check: Callable[[], T | None],
        block: Callable[[float | None], T],
        end: float | None = None,
        late: Callable[[], object] | None = None,
    ) -> T:
        """Wait for what the peer sends: ``check()`` (non-blocking: ``None`` while nothing
        came) polled while a CPU is spare and frames come back to back, then (or at once)
        ``block(timeout)``, the blocking wait, ``timeout`` in seconds until ``end``
        (``time.perf_counter``; ``None``: no end). ``late()``, once, if it still polls
        ``LATE`` after it began (the driver's: see ``vcpu``), and only where the wait began
        within ``SPIN_WINDOW`` of the last one's end: the peer was still polling for what we
        sent, so it would have answered by now had it a CPU of its own. A peer that had
        stopped polling sleeps, and its wake-up alone outlasts ``LATE`` (~190 us here):
        ``late`` would cost each call made at a notebook's pace ~25 us for nothing."""
        clock = time.perf_counter
        start = last = clock()
        if not self.spare(start):
            got = block(None if end is None else max(0.0, end - start))
            self.ended = clock()
            return got
        if start - self.ended > SPIN_WINDOW:
            late = None
        stop = self.deadline(start)
        if end is not None and end < stop:
            stop = end
        while last < stop:
            came = check()
            if came is not None:
                self.ended = now = clock()
                self.waited(now - start)
                return came
            now = clock()
            if now - last > PREEMPTED:
                break  # the CPU was taken from us: the machine has none to spare
            if late is not None and now - start > LATE:
                late()
                late = None
                now = clock()
            last = now
        got = block(None if end is None else max(0.0, end - clock()))
        self.ended = now = clock()
        self.waited(now - start)
        return got


class ProtocolError(Exception):
    """The peer broke the framing; the connection cannot be used any more."""


def frame(kind: int, *parts: Buffer) -> list[Buffer]:
    """One frame as buffers for ``send``: small ones joined, large ones left uncopied."""
    length = sum(map(len, parts))
    if length < _SMALL:
        return [HEADER.pack(kind, length) + b"".join(parts)]
    return [HEADER.pack(kind, length), *parts]


def send(sock: _socket.socket, buffers: Sequence[Buffer], fds: Sequence[int] = ()) -> None:
    """Write every byte of ``buffers`` (``fds`` go with the first bytes). One thread at a
    time per socket: the owner serialises."""
    if not fds and len(buffers) == 1:  # the common case: one small frame (or a joined batch)
        sock.sendall(buffers[0])
        return
    ancillary = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, _pack_fds(fds))] if fds else []
    pending = deque(memoryview(b).cast("B") for b in buffers if len(b))
    while pending:
        batch = [pending[i] for i in range(min(len(pending), _IOV_MAX))]
        sent = sock.sendmsg(batch, ancillary)
        ancillary = []
        while sent:
            head = pending[0]
            if sent >= len(head):
                sent -= len(head)
                pending.popleft()
            else:
                pending[0] = head[sent:]
                sent = 0


def send_frame(sock: _socket.socket, kind: int, payload: Buffer, fds: Sequence[int] = ()) -> None:
    send(sock, frame(kind, payload), fds)


def _pack_fds(fds: Iterable[int]) -> bytes:
    return struct.pack(f"{len(list(fds))}i", *fds)


class Reader:
    """Frames from a socket, read in large chunks (many frames per system call).

    ``pump()`` reads once; ``frames()`` returns the complete frames read so far. On the
    driver's side (the socket has ``SO_PASSCRED``) only one process may write: ``peer``, or,
    until it is known, the first writer ``admit`` accepts (the worker may be a child of the
    process the driver started, under a wrapper such as ``uv run``). A chunk written by any
    other process is dropped and counted in ``foreign``, and descriptors that came with it
    are closed. Descriptors of the peer queue in ``fds``, in the order they came, for the
    frames that name them (``take_fd``).
    """

    def __init__(
        self,
        sock: _socket.socket,
        peer: int | None = None,
        size: int = 1 << 18,
        admit: Callable[[int], bool] | None = None,
    ) -> None:
        self.sock = sock
        self.peer = peer
        self.admit = admit
        self.fds: deque[int] = deque()
        self.foreign = 0
        self._buf = bytearray(size)
        self._view = memoryview(self._buf)
        self._lo = self._hi = 0
        self._ready: list[tuple[int, bytes | bytearray]] = []
        self._incoming: select.poll | None = None  # ``arrived``'s, made at its first call
        # A frame larger than the buffer is read straight into its own bytearray.
        self._big: bytearray | None = None
        self._big_kind = 0
        self._big_len = 0
        self._big_got = 0

    def pump(self, flags: int = 0) -> bool:
        """Read once (``flags``: e.g. ``MSG_DONTWAIT``); ``False`` at EOF between frames.

        ``BlockingIOError`` when non-blocking and nothing is there; ``ProtocolError`` at EOF
        inside a frame.
        """
        if self._big is not None:
            if self._big_got == len(self._big):  # grow as the data arrives (a liar pays)
                self._big.extend(bytes(min(self._big_len - self._big_got, self._big_got)))
            with memoryview(self._big) as view:
                n, pid, fds = self._recv(view[self._big_got : self._big_len], flags)
            if n == 0:
                return self._eof()
            if self._accept(n, pid, fds):
                self._big_got += n
                if self._big_got == self._big_len:
                    self._ready.append((self._big_kind, self._big))
                    self._big = None
            return True
        if self._hi == len(self._buf):
            self._compact()
        n, pid, fds = self._recv(self._view[self._hi :], flags)
        if n == 0:
            return self._eof()
        if self._accept(n, pid, fds):
            self._hi += n
            self._parse()
        return True

    def arrived(self) -> bool:
        """Whether bytes (or EOF) are there to read: a poll, ~4x cheaper than a
        non-blocking read that finds nothing (which raises)."""
        incoming = self._incoming
        if incoming is None:
            incoming = self._incoming = select.poll()
            incoming.register(self.sock.fileno(), select.POLLIN)
        return bool(incoming.poll(0))

    def wait(self, spin: Spin) -> bool:
        """``pump()`` that waits for the peer: with a CPU to spare, polled for a moment
        first while ``spin`` says frames come back to back."""
        return spin.wait(self._came, self._block)

    def _came(self) -> bool | None:
        """``pump()`` if bytes (or EOF) are there, without blocking; ``None`` if not."""
        if not self.arrived():
            return None
        try:
            return self.pump(_socket.MSG_DONTWAIT)
        except BlockingIOError:  # not for us after all: looked at again, then blocked for
            return None

    def _block(self, _timeout: float | None) -> bool:
        return self.pump()

    def _eof(self) -> bool:
        if self._big is not None:
            have, total = self._big_got, f"{self._big_len}"
        elif self._hi > self._lo:
            have, total = self._hi - self._lo, "a whole frame's"
        else:
            return False
        raise ProtocolError(f"connection closed inside a frame ({have} of {total} bytes)")

    def _recv(self, view: memoryview, flags: int) -> tuple[int, int | None, list[int]]:
        n, ancillary, _msg_flags, _addr = self.sock.recvmsg_into([view], _ANCILLARY, flags)
        pid: int | None = None
        fds: list[int] = []
        for level, kind, data in ancillary:
            if level != _socket.SOL_SOCKET:
                continue
            if kind == _socket.SCM_RIGHTS:
                count = len(data) // 4
                fds.extend(struct.unpack(f"{count}i", data[: count * 4]))
            elif kind == _socket.SCM_CREDENTIALS and len(data) >= _CREDS.size:
                pid = _CREDS.unpack_from(data)[0]
        return n, pid, fds

    def _accept(self, n: int, pid: int | None, fds: list[int]) -> bool:
        if self.peer is None and self.admit is not None and pid is not None and self.admit(pid):
            self.peer = pid
        if (self.peer is not None or self.admit is not None) and pid != self.peer:
            self.foreign += n
            _close_all(fds)
            return False
        self.fds.extend(fds)
        return True

    def _compact(self) -> None:
        size = self._hi - self._lo
        if self._lo == 0:  # a whole buffer of one unfinished header: cannot happen
            raise ProtocolError("frame header larger than the read buffer")
        self._view[:size] = self._view[self._lo : self._hi]
        self._lo, self._hi = 0, size

    def _parse(self) -> None:
        view, lo, hi = self._view, self._lo, self._hi
        while hi - lo >= HEADER.size:
            kind, length = HEADER.unpack_from(view, lo)
            if kind not in KINDS:
                raise ProtocolError(f"unknown frame kind {kind}")
            if length > MAX_FRAME:
                raise ProtocolError(f"frame length {length} is over the limit")
            end = lo + HEADER.size + length
            if end <= hi:
                self._ready.append((kind, bytes(view[lo + HEADER.size : end])))
                lo = end
                continue
            if HEADER.size + length > len(self._buf) // 2:
                have = hi - lo - HEADER.size
                big = bytearray(min(length, max(_UPFRONT, have)))
                big[:have] = view[lo + HEADER.size : hi]
                self._big, self._big_kind, self._big_len, self._big_got = big, kind, length, have
                lo = hi
            break
        if lo == hi:
            lo = hi = 0
        self._lo, self._hi = lo, hi

    def frames(self) -> list[tuple[int, bytes | bytearray]]:
        """The complete frames read so far, in order (and forget them)."""
        ready, self._ready = self._ready, []
        return ready

    def take_fd(self) -> int:
        """The next descriptor that came with the frames, for the frame that names it."""
        if not self.fds:
            raise ProtocolError("a frame names a descriptor that did not come")
        return self.fds.popleft()

    def close(self) -> None:
        """Close descriptors that came but were never taken."""
        _close_all(self.fds)
        self.fds.clear()


def _close_all(fds: Iterable[int]) -> None:
    for fd in fds:
        try:  # noqa: SIM105 - contextlib is not imported before it is needed
            os.close(fd)
        except OSError:
            pass
