"""Polling for the peer's next frame before blocking (``protocol.Spin``).

Where an idle CPU halts, each wake-up of a blocked reader costs ~30 us; both sides of a
worker's channel poll for a short window first, but only while frames come back to back and
a CPU is spare (``spare_cpu``: fewer runnable tasks than CPUs, from ``/proc/loadavg``). The
machine's load is injected as a ``loadavg`` file written here (a fake input, not a fake of
the code that reads it); the reads are of a real socketpair, through a wrapper that records
whether each read was a poll (``MSG_DONTWAIT``) or a blocking one. The driver's side with
real workers is ``test_answer_read.py``, run both on a machine with a CPU to spare and on a
busy one.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.workers import protocol
from jupyter_runtimeenv.workers.protocol import Reader, Spin, room, spare_cpu

IDLE = b"0.00 0.01 0.05 1/90 4242\n"
BUSY = b"9.80 9.10 7.70 9/120 4242\n"


def cpus() -> int:
    return len(os.sched_getaffinity(0))


class SteppingClock:
    """``time`` for ``protocol``: each ``perf_counter()`` is ``STEP`` after the last. With the
    real clock a wait of a frame already there could last longer than ``SPIN_WINDOW`` (the
    test preempted on a loaded machine: it failed so in a run of tests/workers at load ~10)
    and a poll gap longer than ``PREEMPTED``; here a wait lasts as many steps as it looked."""

    STEP = 2e-6  # well under PREEMPTED: never taken for a lost CPU

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        self.now += self.STEP
        return self.now


@pytest.fixture
def loadavg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file ``spare_cpu`` reads, saying the machine is idle (rewrite it to change that);
    and ``protocol``'s clock a ``SteppingClock``."""
    if cpus() < 2:
        pytest.skip("one CPU: never spins")
    path = tmp_path / "loadavg"
    path.write_bytes(IDLE)
    monkeypatch.setattr(protocol, "LOADAVG", str(path))
    monkeypatch.setattr(protocol, "_sample", (-1.0, False))
    monkeypatch.setattr(protocol, "time", SteppingClock())
    return path


class Recording:
    """A socket whose reads are recorded: their flags (0: a blocking read)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.flags: list[int] = []

    def fileno(self) -> int:
        return self.sock.fileno()

    def recvmsg_into(self, buffers: Any, ancbufsize: int, flags: int = 0) -> Any:
        self.flags.append(flags)
        return self.sock.recvmsg_into(buffers, ancbufsize, flags)


def test_room_counts_runnable_tasks_against_cpus() -> None:
    assert room(b"0.10 0.20 0.30 2/123 4567\n", 2)  # us and our peer
    assert not room(b"0.10 0.20 0.30 3/123 4567\n", 2)  # and a third: someone would wait
    assert room(b"3.00 2.00 1.00 4/99 1\n", 4)
    assert not room(b"0.00 0.00 0.00 1/50 1\n", 1)  # one CPU: the peer needs ours
    with pytest.raises(IndexError):
        room(b"garbage", 2)
    with pytest.raises(ValueError, match="invalid literal"):
        room(b"0.1 0.2 0.3 x/9 1", 2)


def test_spare_cpu_reads_the_load_and_keeps_its_answer_briefly(loadavg: Path) -> None:
    assert spare_cpu(1000.0)
    loadavg.write_bytes(BUSY)
    assert spare_cpu(1000.0 + protocol._SAMPLE_EVERY / 2)  # kept: not read again yet
    assert not spare_cpu(1000.0 + protocol._SAMPLE_EVERY * 2)  # read again
    loadavg.write_bytes(b"not a loadavg")
    assert not spare_cpu(1001.0)
    loadavg.unlink()
    assert not spare_cpu(1002.0)  # unreadable (not Linux): never spins


def test_a_spin_only_while_frames_come_back_to_back() -> None:
    spin = Spin()
    assert spin.deadline(10.0) == 10.0  # nothing came yet
    spin.waited(protocol.SPIN_WINDOW / 4)
    assert spin.deadline(10.0) == 10.0 + protocol.SPIN_WINDOW
    spin.waited(protocol.SPIN_WINDOW * 2)  # a pause between calls
    assert spin.deadline(40.0) == 40.0


def pair() -> tuple[socket.socket, socket.socket]:
    ours, theirs = socket.socketpair()
    return ours, theirs


def test_a_reader_polls_while_frames_come_back_to_back(loadavg: Path) -> None:
    ours, theirs = pair()
    try:
        recording = Recording(ours)
        reader = Reader(recording)  # type: ignore[arg-type]  # reads through recvmsg_into
        spin = Spin()
        # Not back to back yet: a blocking read.
        protocol.send_frame(theirs, protocol.FREE, b"first")
        assert reader.wait(spin)
        assert recording.flags == [0]
        assert reader.frames() == [(protocol.FREE, b"first")]
        # The frame came at once: from now on it polls, and reads a frame that is there
        # without blocking.
        assert spin.back_to_back
        recording.flags.clear()
        protocol.send_frame(theirs, protocol.FREE, b"second")
        assert reader.wait(spin)
        assert recording.flags == [socket.MSG_DONTWAIT]
        assert reader.frames() == [(protocol.FREE, b"second")]
        assert spin.back_to_back
        # Nothing within the window: it polls, then blocks until the frame comes.
        recording.flags.clear()
        later = threading.Timer(0.05, protocol.send_frame, (theirs, protocol.FREE, b"late"))
        later.start()
        assert reader.wait(spin)
        later.join()
        assert recording.flags == [0]  # polled (nothing to read), then one blocking read
        assert reader.frames() == [(protocol.FREE, b"late")]
        assert not spin.back_to_back  # a pause: the next wait blocks at once
        # EOF while it polls.
        spin.waited(0.0)
        recording.flags.clear()
        theirs.close()
        assert not reader.wait(spin)
        assert recording.flags == [socket.MSG_DONTWAIT]
    finally:
        ours.close()
        theirs.close()


def test_a_reader_blocks_at_once_on_a_busy_machine(loadavg: Path) -> None:
    loadavg.write_bytes(BUSY)
    ours, theirs = pair()
    try:
        recording = Recording(ours)
        reader = Reader(recording)  # type: ignore[arg-type]
        spin = Spin()
        spin.waited(0.0)  # back to back
        protocol.send_frame(theirs, protocol.FREE, b"x")
        assert reader.wait(spin)
        assert recording.flags == [0]
        assert reader.frames() == [(protocol.FREE, b"x")]
        # A frame cut in two: the first poll reads its head, the next read the rest.
        loadavg.write_bytes(IDLE)
        protocol._sample = (-1.0, False)
        spin.waited(0.0)
        recording.flags.clear()
        data = protocol.HEADER.pack(protocol.FREE, 4) + b"ab"
        theirs.sendall(data)
        assert reader.wait(spin)
        assert reader.frames() == []
        rest = threading.Timer(0.01, theirs.sendall, (b"cd",))
        rest.start()
        while not (frames := reader.frames()):
            assert reader.wait(spin)
        rest.join()
        assert frames == [(protocol.FREE, b"abcd")]
    finally:
        ours.close()
        theirs.close()
