"""The driver's end of one worker's channel: frames out, frames in (see ``protocol``).

Owned by a ``WorkerProcess``; used by its reader thread (reading, outcomes) and, under the
worker's send lock, by whoever flushes calls to it. It keeps what the driver knows of the
worker: the functions it has (keys, mirrored LRU of ``FUNCTION_CACHE_SIZE``), the driver's
shared memory segments it has mapped and those lent to it (one per call with large
arguments, back to the arena when it says FREE or dies), the mappings of the worker's own
result segments, and its status word (the call it runs, read on cancel and at death).
"""

from __future__ import annotations

import mmap
import os
import pickle
import socket
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import protocol, shm
from .serialize import SMALL_VALUE, Call, load_outcome, load_small_return, split_return

if TYPE_CHECKING:
    from .future import Task

#: Mirrors ``_serve.FUNCTION_CACHE_SIZE``: the worker drops what FUNC tells it to.
FUNCTION_CACHE_SIZE = 256

Packet = tuple[list[Any], list[int]]
_NO_SPANS = bytes(4)  # a RETURN_HEAD's buffer count of 0
_RETURN_HEAD = protocol.RETURN_HEAD.size
_SPAN_COUNT = _RETURN_HEAD - 4  # where a RETURN_HEAD's buffer count starts
#: A RETURN up to this size is unpickled from a copy (``serialize.load_small_return``).
_SMALL_RETURN = _RETURN_HEAD + SMALL_VALUE
#: A CALL's flags by (``Task.raw``, a CPU spare), and what its one-call path packs with.
_FLAGS = {
    (raw, spare): (0 if raw else protocol.RESULT_SHARED) | (protocol.SPARE if spare else 0)
    for raw in (False, True)
    for spare in (False, True)
}
_CALL_HEAD = protocol.CALL_HEAD.pack
_CALL_HEAD_SIZE = protocol.CALL_HEAD.size
_HEADER = protocol.HEADER.pack
_SMALL = protocol._SMALL  # below it a frame is one buffer (``protocol.frame``)

_arena: shm.Arena | None = None
_arena_lock = threading.Lock()


def driver_arena() -> shm.Arena | None:
    """This process's arena for large arguments (made at first use); ``None`` where shared
    memory cannot be had."""
    global _arena
    if _arena is None:
        with _arena_lock:
            if _arena is None:
                _arena = shm.Arena(f"jupyter-runtimeenv-args-{os.getpid()}")
    return _arena


def shared_arena() -> shm.Arena | None:
    """The arena if it was made (``driver_arena`` makes it)."""
    return _arena


def prepare_socket(sock: socket.socket) -> None:
    """Before the worker can write: every chunk read will carry its writer's pid."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)


class Channel:
    """What the driver sends a worker and how it reads the worker's frames."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock = sock
        self.pid = pid
        # The worker is the process started, or its descendant under a wrapper (``uv run``,
        # a shell): the first writer that is one of them is the worker from then on.
        self.reader = protocol.Reader(sock, admit=lambda writer: _descends(writer, pid))
        self.status: mmap.mmap | None = None
        self._functions: OrderedDict[bytes, None] = OrderedDict()
        self._segments: set[int] = set()  # the driver's segments this worker has mapped
        #: Segment id -> the call whose arguments it holds, while lent to this worker.
        self.lent: dict[int, Call] = {}
        self._lent_lock = threading.Lock()
        self.results = shm.Mappings()

    # -- the handshake ----------------------------------------------------------------------

    def map_status(self) -> None:
        """Map the status word that came with HELLO (read-only)."""
        fd = self.reader.take_fd()
        try:
            self.status = mmap.mmap(fd, protocol.STATUS.size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)

    def running(self) -> int:
        """The id of the call the worker has started and not answered, or 0."""
        status = self.status
        try:
            task_id: int = protocol.STATUS.unpack_from(status)[0] if status is not None else 0
        except ValueError:  # closed meanwhile: the worker is gone
            return 0
        return task_id

    # -- sending (under the worker's send lock) ---------------------------------------------

    def encode(self, tasks: Sequence[Task], spare: bool = False) -> list[Packet]:
        """The packets that send ``tasks``' calls, in order, with what is due before them
        (FUNC for functions the worker lacks, FREE and DROP of segments). A packet's
        descriptors go with its first byte: a call naming a segment new to the worker
        starts a packet of its own. ``spare``: each call tells the worker a CPU is spare
        (``protocol.SPARE``: it may poll for its next call)."""
        one = self.one_call(tasks, spare)
        if one is not None:
            return [([one], [])]
        return self.packets(tasks, spare)

    def packets(self, tasks: Sequence[Task], spare: bool = False) -> list[Packet]:
        """``encode`` without its one-call case: for a caller that tried ``one_call``."""
        packets: list[Packet] = []
        # What ``notices`` looks at, first here: there is nothing to tell on most calls.
        current = self.notices() if self.results.freed or self._segments else []
        base = protocol.SPARE if spare else 0
        for task in tasks:
            call = task.call
            if call.key in self._functions:
                self._functions.move_to_end(call.key)
            else:
                current += self._function(call)
            flags = base if task.raw else base | protocol.RESULT_SHARED
            fds: list[int] = []
            segment = call.segment
            if call.spans and segment is not None:
                flags |= protocol.ARGS_SHARED
                if segment.id not in self._segments:
                    self._segments.add(segment.id)
                    fds.append(segment.fd)
                call.lend()
                with self._lent_lock:
                    self.lent[segment.id] = call
            head = protocol.CALL_HEAD.pack(call.task_id, call.key, flags, len(call.spans))
            if call.spans:
                head += b"".join(protocol.SPAN.pack(*span) for span in call.spans)
            frame = protocol.frame(protocol.CALL, head, call.body)
            if fds:
                if current:
                    packets.append((current, []))
                packets.append((frame, fds))
                current = []
            else:
                current += frame
        if current:
            packets.append((current, []))
        return packets

    def one_call(self, tasks: Sequence[Task], spare: bool = False) -> bytes | None:
        """``encode``'s one buffer for an idle worker's one call, where nothing else is due
        with it (the function known to the worker, no segments, no notices); else ``None``.
        ``WorkerProcess.flush`` writes it as it is: the same frame, fewer steps."""
        if len(tasks) != 1 or self.results.freed or self._segments:
            return None
        task = tasks[0]
        call = task.call
        if call.spans or call.key not in self._functions:
            return None
        body = call.body
        size = _CALL_HEAD_SIZE + len(body)
        if size >= _SMALL:
            return None
        self._functions.move_to_end(call.key)
        head = _CALL_HEAD(call.task_id, call.key, _FLAGS[task.raw, spare], 0)
        return _HEADER(protocol.CALL, size) + head + body

    def _function(self, call: Call) -> list[Any]:
        forget = []
        self._functions[call.key] = None
        while len(self._functions) > FUNCTION_CACHE_SIZE:
            forget.append(self._functions.popitem(last=False)[0])
        return protocol.frame(protocol.FUNC, pickle.dumps((call.key, call.blob, forget)))

    def notices(self) -> list[Any]:
        """FREE of the worker's result segments the driver let go; DROP of the driver's
        segments the arena truncated that this worker had mapped."""
        out: list[Any] = []
        # Looked at without the lock first (one freed meanwhile goes with the next call).
        freed = self.results.take_freed() if self.results.freed else None
        if freed:
            out += protocol.frame(protocol.FREE, b"".join(map(protocol.SEGMENT.pack, freed)))
        if self._segments and _arena is not None:
            gone = self._segments - _arena.live()
            if gone:
                self._segments -= gone
                out += protocol.frame(protocol.DROP, b"".join(map(protocol.SEGMENT.pack, gone)))
        return out

    def cancel(self, task_ids: Sequence[int]) -> Packet:
        return protocol.frame(protocol.CANCEL, b"".join(map(protocol.ID.pack, task_ids))), []

    def preload(self, modules: list[str]) -> Packet:
        return protocol.frame(protocol.PRELOAD, _json(modules)), []

    # -- reading (the reader thread) --------------------------------------------------------

    def freed(self, payload: bytes | bytearray) -> None:
        """FREE from the worker: it let go of these segments of ours."""
        for (segment_id,) in protocol.SEGMENT.iter_unpack(payload):
            with self._lent_lock:
                call = self.lent.pop(segment_id, None)
            if call is not None:
                call.unlend()

    def dropped(self, payload: bytes | bytearray) -> None:
        """DROP from the worker: it truncated these segments of its own."""
        for (segment_id,) in protocol.SEGMENT.iter_unpack(payload):
            self.results.drop(segment_id)

    def returned(self, task: Task, payload: bytes | bytearray) -> Any:
        """``outcome`` of a RETURN: a small value with no buffers in shared memory (an idle
        worker's usual answer) in a straight line (``load_small_return``)."""
        if (
            task.raw
            or payload[_SPAN_COUNT:_RETURN_HEAD] != _NO_SPANS
            or len(payload) > _SMALL_RETURN
        ):
            return self.outcome(task, protocol.RETURN, payload)
        return load_small_return(payload, task.call.task_id, task.output.name)

    def outcome(self, task: Task, kind: int, payload: bytes | bytearray) -> Any:
        """The task's value (or raises its error), as ``load_outcome``; large buffers of a
        RETURN are mapped from the worker's segments."""
        if task.raw:
            return kind, bytes(payload)
        head = protocol.RETURN_HEAD.size
        if kind != protocol.RETURN or payload[head - 4 : head] == _NO_SPANS:
            return load_outcome(kind, payload, task.call.task_id, task.name, task.sources)
        spans = split_return(payload)[2]
        segments = sorted({span[0] for span in spans})
        for segment_id in segments:
            if not self.results.knows(segment_id):
                self.results.attach(segment_id, self.reader.take_fd())
        self.results.hold(segments)
        try:
            buffers = self.results.views(spans)
            return load_outcome(kind, payload, task.call.task_id, task.name, task.sources, buffers)
        finally:
            self.results.unhold(segments)

    def close(self) -> None:
        """The worker is gone: it holds none of our segments any more."""
        with self._lent_lock:
            lent, self.lent = list(self.lent.values()), {}
        for call in lent:
            call.unlend()
        self.reader.close()
        self.results.close()
        if self.status is not None:
            self.status.close()


def _descends(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` is ``ancestor`` or one of its descendants (a vanished one is not)."""
    for _ in range(32):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rpartition(b")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def _json(value: object) -> bytes:
    import json

    return json.dumps(value).encode()
