"""Threat: a forged kernel report gets any child of that kernel SIGKILLed.

The sidebar's Stop killed a pid if the kernel had reported it and the kernel was its parent;
but a report is whatever the kernel's code POSTs, so any child of the kernel (a database the
notebook started, a training run) could be named and killed.

Rule under test (``server/kernels.py``): besides being reported and a child of the kernel,
the process must run our worker bootstrap (``workers/_entry.py``) started for that kernel
(``--parent <kernel pid>``), and have the reported start time when one is given; the
signal goes through a pidfd opened before the checks. Real processes; the "kernel" is this
test's process, as in ``tests/server/test_kernel_reports.py``. Stopping a real worker of a
real kernel over REST is ``tests/server/test_panel.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

import jupyter_runtimeenv
from jupyter_runtimeenv.server.kernels import KernelReports, validate_report

ENTRY = os.path.join(os.path.dirname(jupyter_runtimeenv.__file__), "workers", "_entry.py")
SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for child in started:
        child.kill()
        child.wait()


def _spawn(children: list[subprocess.Popen[bytes]], argv: list[str]) -> subprocess.Popen[bytes]:
    """Start ``argv`` and wait (bounded) until it runs it: between fork and exec a child still
    shows this process's command line."""
    child = subprocess.Popen(argv)
    children.append(child)
    deadline = time.monotonic() + 60
    while True:
        try:
            if psutil.Process(child.pid).cmdline() == argv:
                return child
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass
        assert time.monotonic() < deadline, f"{argv} never started"
        time.sleep(0.01)


def _reports(*pids: int, started: float | None = None) -> KernelReports:
    reports = KernelReports(lambda data: None, lambda kernel_id: os.getpid())
    workers = [{"pid": pid, **({"started": started} if started else {})} for pid in pids]
    reports.put("k", validate_report({"pools": [{"env_id": "e", "workers": workers}]}))
    return reports


def test_a_child_that_is_not_a_worker_is_never_killed(
    children: list[subprocess.Popen[bytes]],
) -> None:
    database = _spawn(children, SLEEP)  # a child of the "kernel", reported as a worker
    with pytest.raises(LookupError, match="not the worker bootstrap"):
        _reports(database.pid).stop_worker("k", database.pid)
    assert database.poll() is None


def test_a_worker_started_for_another_process_is_never_killed(
    children: list[subprocess.Popen[bytes]],
) -> None:
    other = _spawn(children, [*SLEEP, ENTRY, "--parent", "1"])
    with pytest.raises(LookupError, match="started for process 1"):
        _reports(other.pid).stop_worker("k", other.pid)
    assert other.poll() is None


def test_a_recycled_pid_is_never_killed(children: list[subprocess.Popen[bytes]]) -> None:
    worker = _spawn(children, [*SLEEP, ENTRY, "--parent", str(os.getpid())])
    earlier = psutil.Process(worker.pid).create_time() - 3600  # reported for another process
    with pytest.raises(LookupError, match="recycled pid"):
        _reports(worker.pid, started=earlier).stop_worker("k", worker.pid)
    assert worker.poll() is None


def test_a_worker_of_the_kernel_is_killed(children: list[subprocess.Popen[bytes]]) -> None:
    worker = _spawn(children, [*SLEEP, ENTRY, "--parent", str(os.getpid())])
    started = psutil.Process(worker.pid).create_time()
    _reports(worker.pid, started=started).stop_worker("k", worker.pid)
    assert worker.wait(timeout=30) == -9
