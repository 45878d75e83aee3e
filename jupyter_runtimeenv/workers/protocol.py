"""The worker protocol: a handshake, then length-prefixed frames on a socket.

Both sides use this module: the driver (``process.py``) imports it normally; the worker
bootstrap (``_entry.py``) loads it by file path, so it must import only the standard library.

A frame is a 9-byte header, ``kind`` (1 byte) and ``length`` (8 bytes, big endian), then
``length`` bytes of payload::

    worker -> driver   HELLO   JSON {"version", "pid", "python", "sys_path_added"}   once, first
    driver -> worker   CALL    cloudpickle of (task_id, function, args, kwargs)
    worker -> driver   RETURN  cloudpickle of (task_id, value)
    worker -> driver   RAISE   pickle of a dict of plain values (see ``_entry.failure``)

The driver sends one CALL at a time and the next only after the RETURN/RAISE, so when a
worker dies, unread bytes in its socket can only be the current CALL: Linux then reports
``ECONNRESET`` to the driver instead of EOF, which tells a task that never reached its
worker (it runs on a fresh one) from one that may have run (``BrokenWorker``).

The driver ends a worker by closing its end (the worker sees EOF and exits). Anything else
(an unknown kind, a length over ``MAX_FRAME``, EOF inside a frame) is a ``ProtocolError``:
the side that sees it stops talking, and the driver kills the worker.
"""

from __future__ import annotations

import struct

TYPE_CHECKING = False  # the bootstrap loads this file: no typing, no socket at run time
if TYPE_CHECKING:
    from typing import Protocol

    class Channel(Protocol):
        """A ``socket.socket``, or the bootstrap's ``FdChannel``."""

        def recv_into(self, buffer: memoryview, /) -> int: ...

        def sendall(self, data: bytes, /) -> None: ...


PROTOCOL_VERSION = 1

HELLO = 1
CALL = 2
RETURN = 3
RAISE = 4
KINDS = frozenset((HELLO, CALL, RETURN, RAISE))

HEADER = struct.Struct("!BQ")
#: Larger than any sane payload, small enough to catch a garbage length at once.
MAX_FRAME = 1 << 40
#: Below this a payload is copied behind the header so that a frame is one send.
_SMALL = 1 << 16
#: A frame's buffer is allocated up to this size at once; beyond, as the data arrives.
_UPFRONT = 1 << 26


class ProtocolError(Exception):
    """The peer broke the framing; the connection cannot be used any more."""


def send_frame(sock: Channel, kind: int, payload: bytes) -> None:
    """Send one frame. Called by one thread at a time per socket (the owner serialises)."""
    header = HEADER.pack(kind, len(payload))
    if len(payload) < _SMALL:
        sock.sendall(header + payload)
    else:
        sock.sendall(header)
        sock.sendall(payload)


def recv_exactly(sock: Channel, size: int) -> bytearray:
    """Exactly ``size`` bytes; EOF before that is a ``ProtocolError``.

    The buffer grows with what arrives (doubling past ``_UPFRONT``), so a length that lies
    (a task scribbling on the channel) costs no more memory than the bytes really sent.
    """
    buffer = bytearray(min(size, _UPFRONT))
    got = 0
    while True:
        with memoryview(buffer) as view:
            _fill(sock, view, got, size)
        got = len(buffer)
        if got == size:
            return buffer
        buffer.extend(bytes(min(size - got, got)))  # realloc, usually in place


def recv_frame(sock: Channel) -> tuple[int, bytearray] | None:
    """The next frame as ``(kind, payload)``; ``None`` when the peer closed between frames."""
    header = bytearray(HEADER.size)
    view = memoryview(header)
    first = sock.recv_into(view)
    if first == 0:
        return None
    _fill(sock, view, first)
    kind, length = HEADER.unpack(header)
    if kind not in KINDS:
        raise ProtocolError(f"unknown frame kind {kind}")
    if length > MAX_FRAME:
        raise ProtocolError(f"frame length {length} is over the limit")
    return kind, recv_exactly(sock, length)


def _fill(sock: Channel, view: memoryview, got: int, total: int | None = None) -> None:
    size = len(view)
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ProtocolError(
                f"connection closed inside a frame ({got} of {total or size} bytes)"
            )
        got += n
