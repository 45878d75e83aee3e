"""The one reader of the machine's count of runnable tasks (``_cpuload``).

The kernel's file is replaced by one written here (a fake input: the count a test needs,
which the real ``/proc/loadavg`` cannot be made to say), and the gauge's clock is the
``now`` each test passes. The callers' rules are tested where they are stated:
``tests/workers/test_spin.py`` (polling) and ``tests/plugins/test_spares.py`` (a spare at once).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jupyter_runtimeenv import _cpuload
from jupyter_runtimeenv._cpuload import EVERY, RECHECK, Gauge, cpus, runnable


def loadavg(path: Path, count: int) -> None:
    path.write_bytes(f"0.52 0.58 0.59 {count}/467 12345\n".encode())


@pytest.fixture
def path(tmp_path: Path) -> Path:
    p = tmp_path / "loadavg"
    loadavg(p, 2)
    return p


def test_runnable_reads_the_fourth_field(path: Path) -> None:
    assert runnable(str(path)) == 2
    loadavg(path, 17)
    assert runnable(str(path)) == 17


def test_the_real_count_includes_the_reader() -> None:
    if not os.path.exists(_cpuload.LOADAVG):
        pytest.skip("no /proc/loadavg here")
    count = runnable()
    assert count is not None
    assert count >= 1


@pytest.mark.parametrize("text", [b"", b"garbage", b"0.1 0.2 0.3 x/9 1", b"0.1 0.2 0.3"])
def test_a_count_that_cannot_be_parsed_is_unknown(path: Path, text: bytes) -> None:
    path.write_bytes(text)
    assert runnable(str(path)) is None


def test_an_unreadable_file_is_unknown(path: Path) -> None:
    assert runnable(str(path.parent / "missing")) is None
    assert runnable(str(path.parent)) is None  # a directory
    gauge = Gauge(str(path.parent / "missing"))
    assert gauge.least(10.0)[0] is None
    assert gauge.least(10.0 + EVERY / 2)[0] is None  # kept like any count


def test_cpus_are_this_process_s(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cpus() == len(os.sched_getaffinity(0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})
    assert cpus() == 1  # one CPU: what each caller's rule sees
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert cpus() == 1  # no affinity and no count: one


def test_one_cpu_reaches_the_gauge(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {3})
    assert Gauge(str(path)).least(1.0) == (2, 1)


def test_a_count_that_did_not_rise_is_kept_longer_each_time(path: Path) -> None:
    """Read again after RECHECK, then twice as long each time, up to EVERY (a fall is seen
    at the first read: that is how a read shows here)."""
    gauge = Gauge(str(path))
    t, count = 100.0, 50
    loadavg(path, count)
    assert gauge.least(t)[0] == count
    hold, holds = RECHECK, []
    while True:
        count -= 1
        loadavg(path, count)
        assert gauge.least(t + hold * 0.9)[0] == count + 1  # kept: not read
        t += hold * 1.05
        assert gauge.least(t)[0] == count  # read
        holds.append(hold)
        if hold == EVERY:
            break
        hold = min(2 * hold, EVERY)
    assert holds == [RECHECK, 2 * RECHECK, 4 * RECHECK, 8 * RECHECK, 16 * RECHECK, EVERY]


def test_an_instant_s_task_does_not_count(path: Path) -> None:
    gauge = Gauge(str(path))
    gauge.least(100.0)
    t = 100.0 + RECHECK * 1.5
    assert gauge.least(t)[0] == 2
    loadavg(path, 3)  # a task woken for an instant
    t += RECHECK * 2.5
    assert gauge.least(t)[0] == 2  # read: it rose, so not believed yet
    loadavg(path, 9)
    assert gauge.least(t + RECHECK / 2)[0] == 2  # kept RECHECK only
    loadavg(path, 2)  # gone
    assert gauge.least(t + RECHECK * 1.5)[0] == 2
    # A rise that lasts is believed at its third read.
    loadavg(path, 5)
    t += RECHECK * 1.5 + EVERY
    assert gauge.least(t)[0] == 2
    assert gauge.least(t + RECHECK * 1.5)[0] == 2
    assert gauge.least(t + RECHECK * 3)[0] == 5


def test_a_rise_read_twice_in_a_row_does_not_count(path: Path) -> None:
    """A task woken for an instant is sometimes in two reads in a row (``RECHECK`` apart):
    not believed either (the lower of two believed it, and a quiet run's W2 stopped polling
    for tens of round trips when the only other runnable task was a kernel thread)."""
    gauge = Gauge(str(path))
    t = 100.0
    for _ in range(3):
        assert gauge.least(t)[0] == 2
        t += RECHECK * 1.05
    loadavg(path, 3)
    assert gauge.least(t)[0] == 2
    t += RECHECK * 1.05
    assert gauge.least(t)[0] == 2  # the second read in a row that saw it
    loadavg(path, 2)
    for _ in range(5):
        t += RECHECK * 1.05
        assert gauge.least(t)[0] == 2


def test_a_load_that_starts_is_seen_within_two_rechecks(path: Path) -> None:
    """Two busy-loop hogs start while a caller asks on every wait: believed at the third
    read that saw them, ~2 ``RECHECK`` after the first, and kept believed while they run."""
    gauge = Gauge(str(path))
    t = 100.0
    while t < 100.0 + 3 * EVERY:  # quiet for a while: read every EVERY by now
        assert gauge.least(t)[0] == 2
        t += RECHECK / 4
    loadavg(path, 4)  # us, our peer and two hogs
    start, seen = t, None
    while seen is None:
        if gauge.least(t)[0] == 4:
            seen = t
        t += RECHECK / 4
    assert seen - start <= EVERY + 2 * RECHECK + RECHECK / 4
    while t < seen + 10 * EVERY:
        assert gauge.least(t)[0] == 4
        t += RECHECK / 4


def test_a_count_after_a_pause_is_checked_soon(path: Path) -> None:
    gauge = Gauge(str(path))
    gauge.least(100.0)
    assert gauge.least(100.0 + RECHECK * 1.5)[0] == 2
    loadavg(path, 3)
    later = 100.0 + 10 * EVERY  # the count before is too old to weigh against
    assert gauge.least(later)[0] == 3  # believed, for RECHECK
    loadavg(path, 2)
    assert gauge.least(later + RECHECK / 2)[0] == 3
    assert gauge.least(later + RECHECK * 1.5)[0] == 2  # it fell: believed at once


def test_a_lasting_load_is_always_seen(path: Path) -> None:
    """On a loaded machine every answer is the load: the least of two high counts."""
    loadavg(path, 6)
    gauge = Gauge(str(path))
    t = 50.0
    for step in range(200):
        loadavg(path, 5 + step % 3)
        least, _cpus = gauge.least(t)
        assert least is not None
        assert least >= 5
        t += RECHECK * 0.7
