"""Polling for the peer's next frame before blocking (``protocol.Spin``).

Where an idle CPU halts, each wake-up of a blocked reader costs ~30 us; both sides of a
worker's channel poll for a short window first, but only while frames come back to back and
a CPU is spare (``Spin.spare``: no more runnable tasks than CPUs, from ``_cpuload.Gauge``). One
loop (``Spin.wait``) serves both sides: here with scripted checks on a stepping clock, and
through the worker's ``Reader.wait`` on a real socketpair, through a wrapper that records
whether each read was a poll (``MSG_DONTWAIT``) or a blocking one. The machine's load is
injected as a ``loadavg`` file written here (a fake input, not a fake of the code that reads
it). The driver's side with real workers is ``test_answer_read.py``, run both on a machine
with a CPU to spare and on a busy one; the gauge itself is ``tests/test_cpuload.py``.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv._cpuload import Gauge
from jupyter_runtimeenv.workers import protocol
from jupyter_runtimeenv.workers.channel import Channel
from jupyter_runtimeenv.workers.future import RemoteFuture, Task
from jupyter_runtimeenv.workers.output import OutputTarget
from jupyter_runtimeenv.workers.protocol import Reader, Spin
from jupyter_runtimeenv.workers.serialize import dump_call

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
def clock(monkeypatch: pytest.MonkeyPatch) -> SteppingClock:
    """``protocol``'s clock, a ``SteppingClock``."""
    stepping = SteppingClock()
    monkeypatch.setattr(protocol, "time", stepping)
    return stepping


@pytest.fixture
def loadavg(tmp_path: Path, clock: SteppingClock) -> Path:
    """The file a test's ``Gauge`` reads, saying the machine is idle (a new ``Gauge`` of it
    reads it afresh: ``spin_on``)."""
    if cpus() < 2:
        pytest.skip("one CPU: never spins")
    path = tmp_path / "loadavg"
    path.write_bytes(IDLE)
    return path


def spin_on(loadavg: Path) -> Spin:
    return Spin(Gauge(str(loadavg)))


class FixedGauge:
    """A gauge that says ``least`` runnable tasks on ``cpus`` CPUs."""

    def __init__(self, least: int | None, cpus: int) -> None:
        self.answer = (least, cpus)

    def least(self, now: float) -> tuple[int | None, int]:
        return self.answer


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


def test_a_cpu_is_spare_while_no_task_waits_for_one() -> None:
    assert Spin(FixedGauge(2, 2)).spare(1.0)  # us and our peer
    assert not Spin(FixedGauge(3, 2)).spare(1.0)  # and a third: someone would wait
    assert Spin(FixedGauge(4, 4)).spare(1.0)
    assert not Spin(FixedGauge(1, 1)).spare(1.0)  # one CPU: the peer needs ours
    assert not Spin(FixedGauge(None, 8)).spare(1.0)  # unknown (not Linux): never
    assert not Spin(None).spare(1.0)


def test_a_spin_reads_the_machine_through_its_gauge(loadavg: Path) -> None:
    assert spin_on(loadavg).spare(1000.0)
    loadavg.write_bytes(BUSY)
    assert not spin_on(loadavg).spare(1000.0)
    loadavg.unlink()
    assert not spin_on(loadavg).spare(1000.0)


class Script:
    """A check that finds nothing ``empty`` times (each look one clock step, or ``gap``
    seconds for the look listed in ``slow``), then ``"came"``; and a block that records its
    timeout."""

    def __init__(self, clock: SteppingClock, empty: int, slow: int = -1, gap: float = 0.0):
        self.clock, self.empty, self.slow, self.gap = clock, empty, slow, gap
        self.looks = 0
        self.blocked: list[float | None] = []

    def check(self) -> str | None:
        self.looks += 1
        if self.looks == self.slow:
            self.clock.now += self.gap
        return "came" if self.looks > self.empty else None

    def block(self, timeout: float | None) -> str:
        self.blocked.append(timeout)
        return "blocked"


def test_the_one_wait_polls_back_to_back_with_a_spare_cpu(clock: SteppingClock) -> None:
    spin = Spin(FixedGauge(1, 2))
    script = Script(clock, empty=3)
    # Not back to back yet: blocks at once, never looks.
    assert spin.wait(script.check, script.block) == "blocked"
    assert (script.looks, script.blocked) == (0, [None])
    assert spin.back_to_back  # that wait was short (a few steps)
    # Back to back: looks until it comes, never blocks.
    script.blocked.clear()
    assert spin.wait(script.check, script.block) == "came"
    assert (script.looks, script.blocked) == (4, [])
    assert spin.back_to_back


def test_the_one_wait_blocks_after_its_window(clock: SteppingClock) -> None:
    spin = Spin(FixedGauge(1, 2))
    spin.back_to_back = True
    never = Script(clock, empty=1 << 30)
    end = clock.now + 1.0
    assert spin.wait(never.check, never.block, end) == "blocked"
    steps = protocol.SPIN_WINDOW / SteppingClock.STEP
    assert steps / 2 <= never.looks <= steps + 2  # looked for the window (two reads a look)
    (timeout,) = never.blocked
    assert timeout is not None
    assert 1.0 - 2 * protocol.SPIN_WINDOW < timeout < 1.0
    assert not spin.back_to_back  # it waited the whole window: a pause
    # An end before the window's: looks until then, blocks for what is left (nothing).
    spin.back_to_back = True
    soon = Script(clock, empty=1 << 30)
    assert spin.wait(soon.check, soon.block, clock.now + 20 * SteppingClock.STEP) == "blocked"
    assert 0 < soon.looks <= 20
    assert soon.blocked == [0.0]


def test_the_one_wait_blocks_when_its_cpu_was_taken(clock: SteppingClock) -> None:
    spin = Spin(FixedGauge(1, 2))
    spin.back_to_back = True
    gap = 2 * protocol.PREEMPTED  # a lost CPU, well within the window
    assert gap < protocol.SPIN_WINDOW / 1.5
    taken = Script(clock, empty=1 << 30, slow=3, gap=gap)
    assert spin.wait(taken.check, taken.block) == "blocked"
    assert taken.looks == 3  # the third look lost the CPU for a while: no fourth
    assert taken.blocked == [None]
    assert spin.back_to_back  # and the block found it at once: still back to back


def test_a_poll_still_going_after_late_calls_late_once(clock: SteppingClock) -> None:
    """``late`` (the driver's: move a worker that has not started the call off this vCPU)
    is called once per wait, ``LATE`` into the poll, and the poll goes on to its frame."""
    spin = Spin(FixedGauge(1, 2))
    spin.back_to_back = True
    spin.ended = clock.now  # the last wait ended just now: the peer still polls
    looks_at_late = protocol.LATE / SteppingClock.STEP  # one clock read a look
    script = Script(clock, empty=int(3 * looks_at_late))
    called: list[int] = []
    assert (
        spin.wait(script.check, script.block, None, lambda: called.append(script.looks)) == "came"
    )
    assert script.blocked == []
    assert len(called) == 1
    assert looks_at_late / 2 <= called[0] <= looks_at_late + 2


def test_a_wait_begun_after_the_peer_stopped_polling_is_never_late(
    clock: SteppingClock,
) -> None:
    """A call sent more than ``SPIN_WINDOW`` after the last answer finds its worker asleep:
    its wake-up outlasts ``LATE``, and moving it would only cost the caller (calls made 1 ms
    apart: 229-245 vs 201-212 us with ``late`` called at each). The wait after it, begun at
    once, is late again."""
    spin = Spin(FixedGauge(1, 2))
    spin.back_to_back = True
    looks_at_late = protocol.LATE / SteppingClock.STEP
    called: list[int] = []
    spin.ended = clock.now
    clock.now += protocol.SPIN_WINDOW * 2  # a notebook's pause since that answer
    script = Script(clock, empty=int(3 * looks_at_late))
    assert spin.wait(script.check, script.block, None, lambda: called.append(1)) == "came"
    assert called == []
    assert spin.ended >= clock.now - SteppingClock.STEP
    script = Script(clock, empty=int(3 * looks_at_late))
    assert spin.wait(script.check, script.block, None, lambda: called.append(2)) == "came"
    assert called == [2]


def test_a_frame_that_comes_soon_is_not_late(clock: SteppingClock) -> None:
    spin = Spin(FixedGauge(1, 2))
    spin.back_to_back = True
    spin.ended = clock.now
    script = Script(clock, empty=3)
    called: list[int] = []
    assert spin.wait(script.check, script.block, None, lambda: called.append(1)) == "came"
    assert called == []
    # Nor a wait that does not poll (not back to back): it blocks at once.
    spin.back_to_back = False
    assert spin.wait(script.check, script.block, None, lambda: called.append(1)) == "blocked"
    assert called == []


def test_the_one_wait_blocks_at_once_on_a_busy_machine(clock: SteppingClock) -> None:
    spin = Spin(FixedGauge(3, 2))
    spin.back_to_back = True
    script = Script(clock, empty=0)
    end = clock.now + 0.5
    assert spin.wait(script.check, script.block, end) == "blocked"
    assert script.looks == 0
    (timeout,) = script.blocked
    assert timeout is not None
    assert 0.5 - 4 * SteppingClock.STEP < timeout <= 0.5


def test_a_spin_only_while_frames_come_back_to_back() -> None:
    spin = Spin(None)
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
        spin = spin_on(loadavg)
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
        spin = spin_on(loadavg)
        spin.waited(0.0)  # back to back
        protocol.send_frame(theirs, protocol.FREE, b"x")
        assert reader.wait(spin)
        assert recording.flags == [0]
        assert reader.frames() == [(protocol.FREE, b"x")]
        # A frame cut in two: the first poll reads its head, the next read the rest.
        loadavg.write_bytes(IDLE)
        spin = spin_on(loadavg)
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


def test_a_worker_s_spin_polls_as_its_driver_said() -> None:
    """A worker reads no gauge: each call tells it whether the driver's says a CPU is spare
    (``protocol.SPARE``), so both ends poll or neither."""
    spin = Spin(None)
    assert not spin.spare(1.0)  # nothing said yet: never
    spin.told = True
    assert spin.spare(1.0)
    spin.told = False
    assert not spin.spare(1.0)


@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize("spare", [True, False])
def test_each_call_says_what_the_driver_read(spare: bool, raw: bool) -> None:
    """Through ``Channel.encode``'s general path (a batch, a function new to the worker) and
    its one-call path (an idle worker's next call of a function it has): the same CALL."""
    ours, theirs = pair()
    try:
        channel = Channel(ours, os.getpid())
        future: RemoteFuture[Any] = RemoteFuture("noop")
        task = Task(b"", future, OutputTarget.capture("noop"), raw=raw)
        task.payload = dump_call(task.id, len, ((),), {}, "noop")
        reader = Reader(theirs)
        calls: list[bytes | bytearray] = []
        for batch in ([task, task], [task]):
            for buffers, _fds in channel.encode(batch, spare):
                protocol.send(ours, buffers)
            sent: list[bytes | bytearray] = []
            while len(sent) < len(batch):
                reader.pump()
                sent += [p for kind, p in reader.frames() if kind == protocol.CALL]
            calls += sent
        assert calls[0] == calls[1] == calls[2]  # the one-call path's frame is the same
        for payload in calls:
            flags = protocol.CALL_HEAD.unpack_from(payload)[2]
            assert bool(flags & protocol.SPARE) is spare
            assert bool(flags & protocol.RESULT_SHARED) is not raw  # the others kept
    finally:
        ours.close()
        theirs.close()
