"""The framing (batches, descriptors, who may write), the bootstrap's sys.path rule and the
driver's sys.path resolution."""

from __future__ import annotations

import os
import socket
import sys
import sysconfig
import threading
from pathlib import Path

import pytest

from jupyter_runtimeenv.workers import protocol
from jupyter_runtimeenv.workers._entry import apply_sys_path
from jupyter_runtimeenv.workers.executor import resolve_driver_sys_path


def _read_all(reader: protocol.Reader) -> list[tuple[int, bytes | bytearray]]:
    frames = []
    while reader.pump():
        frames += reader.frames()
    return frames + reader.frames()


def test_frames_round_trip_small_large_and_batched() -> None:
    left, right = socket.socketpair()
    big = os.urandom(3 << 20)
    batch = [b for i in range(50) for b in protocol.frame(protocol.SKIP, protocol.ID.pack(i))]
    sender = threading.Thread(
        target=lambda: [
            protocol.send_frame(left, protocol.CALL, b"small"),
            protocol.send_frame(left, protocol.RETURN, big),
            protocol.send_frame(left, protocol.RAISE, b""),
            protocol.send(left, batch),  # fifty frames in one write, read in one go
            left.close(),
        ]
    )
    sender.start()
    frames = _read_all(protocol.Reader(right))  # ends at a clean EOF between frames
    sender.join()
    right.close()
    assert frames[:3] == [
        (protocol.CALL, b"small"),
        (protocol.RETURN, bytearray(big)),
        (protocol.RAISE, b""),
    ]
    assert frames[3:] == [(protocol.SKIP, protocol.ID.pack(i)) for i in range(50)]


def test_descriptors_come_with_their_frames() -> None:
    left, right = socket.socketpair()
    read_end, write_end = os.pipe()
    try:
        protocol.send(left, protocol.frame(protocol.HELLO, b"{}"), [write_end])
        reader = protocol.Reader(right)
        assert reader.pump()
        assert reader.frames() == [(protocol.HELLO, b"{}")]
        fd = reader.take_fd()
        os.write(fd, b"through the passed descriptor")
        os.close(fd)
        assert os.read(read_end, 100) == b"through the passed descriptor"
        with pytest.raises(protocol.ProtocolError, match="did not come"):
            reader.take_fd()
    finally:
        for fd in (read_end, write_end):
            os.close(fd)
        left.close()
        right.close()


def test_only_the_peer_may_write() -> None:
    """Bytes a forked child writes on an inherited socket are dropped, descriptors closed."""
    left, right = socket.socketpair()
    right.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    reader = protocol.Reader(right, admit=lambda pid: pid == os.getpid())
    protocol.send(left, protocol.frame(protocol.SKIP, protocol.ID.pack(1)))
    child = os.fork()
    if child == 0:  # a forged answer, and a descriptor with it
        try:
            protocol.send(left, protocol.frame(protocol.SKIP, protocol.ID.pack(666)), [1])
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    protocol.send(left, protocol.frame(protocol.SKIP, protocol.ID.pack(2)))
    left.close()
    frames = _read_all(reader)
    right.close()
    assert frames == [(protocol.SKIP, protocol.ID.pack(1)), (protocol.SKIP, protocol.ID.pack(2))]
    assert reader.peer == os.getpid()
    assert reader.foreign == protocol.HEADER.size + protocol.ID.size
    assert not reader.fds


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x63" + (1).to_bytes(8, "big") + b"x", "unknown frame kind 99"),
        (bytes([protocol.CALL]) + (1 << 41).to_bytes(8, "big"), "over the limit"),
        (bytes([protocol.CALL]) + (10).to_bytes(8, "big") + b"abc", "inside a frame"),
        (bytes([protocol.CALL]) + (1 << 20).to_bytes(8, "big") + b"abc", "inside a frame"),
        (bytes([protocol.CALL, 0, 0]), "inside a frame"),
    ],
)
def test_framing_errors(data: bytes, message: str) -> None:
    left, right = socket.socketpair()
    left.sendall(data)
    left.close()
    with pytest.raises(protocol.ProtocolError, match=message):
        _read_all(protocol.Reader(right))
    right.close()


def test_bootstrap_puts_missing_entries_first_in_the_driver_order() -> None:
    path = ["/env/site", "/shared"]
    added = apply_sys_path(["/a", "/shared", "/b", "/a"], path)
    assert added == ["/a", "/b"]
    assert path == ["/a", "/b", "/env/site", "/shared"]


def test_driver_path_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    stdlib = sysconfig.get_paths()["stdlib"]
    purelib = sysconfig.get_paths()["purelib"]
    resolved = resolve_driver_sys_path(["", "src", stdlib, "/x/y", purelib, "/x/y"])
    assert resolved == (str(tmp_path), str(tmp_path / "src"), "/x/y")
    # Memoised, but a cwd change is seen when relative entries are present.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert resolve_driver_sys_path(["", "src", stdlib, "/x/y", purelib, "/x/y"])[0] == str(
        elsewhere
    )
    assert not set(resolve_driver_sys_path()) & {stdlib, purelib, os.path.dirname(os.__file__)}
    assert sys.path  # untouched
