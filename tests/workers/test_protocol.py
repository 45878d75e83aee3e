"""The framing, the bootstrap's sys.path rule and the driver's sys.path resolution."""

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


def test_frames_round_trip_small_and_large() -> None:
    left, right = socket.socketpair()
    big = os.urandom(3 << 20)
    sender = threading.Thread(
        target=lambda: [
            protocol.send_frame(left, protocol.CALL, b"small"),
            protocol.send_frame(left, protocol.RETURN, big),
            protocol.send_frame(left, protocol.RAISE, b""),
            left.close(),
        ]
    )
    sender.start()
    assert protocol.recv_frame(right) == (protocol.CALL, bytearray(b"small"))
    assert protocol.recv_frame(right) == (protocol.RETURN, bytearray(big))
    assert protocol.recv_frame(right) == (protocol.RAISE, bytearray())
    assert protocol.recv_frame(right) is None  # a clean EOF between frames
    sender.join()
    right.close()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x09" + (1).to_bytes(8, "big") + b"x", "unknown frame kind 9"),
        (bytes([protocol.CALL]) + (1 << 41).to_bytes(8, "big"), "over the limit"),
        (bytes([protocol.CALL]) + (10).to_bytes(8, "big") + b"abc", "inside a frame"),
        (bytes([protocol.CALL, 0, 0]), "inside a frame"),
    ],
)
def test_framing_errors(data: bytes, message: str) -> None:
    left, right = socket.socketpair()
    left.sendall(data)
    left.close()
    with pytest.raises(protocol.ProtocolError, match=message):
        protocol.recv_frame(right)
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
