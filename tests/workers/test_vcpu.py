"""Moving a worker off the caller's vCPU (``workers.vcpu``), on real processes: a busy child
is moved off a CPU and keeps the affinity it had; where it cannot be moved, nothing changes.
The driver calls it from a late poll (``tests/workers/test_spin.py``); that it keeps the two
ends on two vCPUs is measured, not asserted (docs/benchmarks.md, W2 in session 12)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from jupyter_runtimeenv.workers import vcpu

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or not os.path.exists("/proc/thread-self/stat"),
    reason="Linux only",
)


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A busy child process (it runs, so a move is real)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_this_thread_runs_on_one_of_its_cpus() -> None:
    cpu = vcpu.current_cpu()
    assert cpu is not None
    assert cpu in os.sched_getaffinity(0)


def test_a_worker_is_moved_and_keeps_its_affinity(child: subprocess.Popen[bytes]) -> None:
    mask = os.sched_getaffinity(child.pid)
    if len(mask) < 2:
        pytest.skip("one CPU: nowhere to move to")
    cpu = min(mask)
    assert vcpu.part(child.pid, cpu)
    assert os.sched_getaffinity(child.pid) == mask  # as it was: moved, not pinned


def test_where_it_cannot_move_nothing_changes(child: subprocess.Popen[bytes]) -> None:
    mask = os.sched_getaffinity(child.pid)
    one = {min(mask)}
    os.sched_setaffinity(child.pid, one)
    assert not vcpu.part(child.pid, min(mask))  # its only CPU
    assert os.sched_getaffinity(child.pid) == one
    assert not vcpu.part(child.pid, max(mask) + 1)  # a CPU it may not use anyway
    assert os.sched_getaffinity(child.pid) == one
    child.kill()
    child.wait()
    assert not vcpu.part(child.pid, min(mask))  # gone
