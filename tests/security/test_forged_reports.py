"""Threat: a forged kernel report gets any child of that kernel SIGKILLed.

The sidebar's Stop killed a pid if the kernel had reported it and the kernel was its parent;
but a report is whatever the kernel's code POSTs, so any child of the kernel (a database the
notebook started, a training run) could be named and killed.

Rule under test (``server/kernels.py``): besides being reported and a child of the kernel,
the process must run our worker bootstrap (``workers/_entry.py``) started for that kernel
(``--parent <kernel pid>``), and have the reported start time when one is given (a pool's
report gives each worker's: ``Pool.stats``); the signal goes through a pidfd opened before
the checks. Real processes and real pools; the "kernel" is this test's process, as in
``tests/server/test_kernel_reports.py``. Stopping a real worker of a real kernel over REST is
``tests/server/test_panel.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import processes
import psutil
import pytest

import jupyter_runtimeenv
from jupyter_runtimeenv.context import EnvContext
from jupyter_runtimeenv.server.kernels import KernelReports, validate_report
from jupyter_runtimeenv.workers import zygote
from jupyter_runtimeenv.workers.executor import resolve_driver_sys_path
from jupyter_runtimeenv.workers.future import RemoteFuture, Task
from jupyter_runtimeenv.workers.output import OutputTarget
from jupyter_runtimeenv.workers.pool import Pool
from jupyter_runtimeenv.workers.serialize import dump_call

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


# -- a real pool's report: each worker's start time, and a pid that came round again --------


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[Pool]:
    """A real pool of this process (the "kernel"), spawned workers (``--parent`` this pid)."""
    monkeypatch.setenv(zygote.ZYGOTE_VAR, "0")
    ctx = EnvContext(
        python=sys.executable, driver_sys_path=resolve_driver_sys_path(), env_id="e" * 64
    )
    made = Pool(lambda: ctx, max_workers=1)
    yield made
    made.close()


def _run_one(pool: Pool) -> int:
    """The pid of the worker that ran a call (the pool has started one)."""
    future: RemoteFuture[Any] = RemoteFuture("getpid")
    task = Task(b"", future, OutputTarget.capture("getpid"))
    task.payload = dump_call(task.id, os.getpid, (), {}, "getpid")
    assert pool.submit(task)
    pid: int = future.result(timeout=120)
    return pid


def _report_of(stats: dict[str, Any]) -> KernelReports:
    reports = KernelReports(lambda data: None, lambda kernel_id: os.getpid())
    reports.put("k", validate_report({"pools": [stats]}))
    return reports


def _at_pid(pid: int, argv: list[str], children: list[subprocess.Popen[bytes]]) -> bool:
    """Start ``argv`` as process ``pid``, as the kernel gives a pid out again once it came
    round (root sets ``ns_last_pid``; another process may take it first: tried again).
    False where this process may not choose (not root, no such file)."""
    for _ in range(200):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as file:
                file.write(str(pid - 1))
        except OSError:
            return False
        child = subprocess.Popen(argv)
        if child.pid == pid:
            children.append(child)
            return True
        child.kill()
        child.wait()
    return False


def test_a_pools_report_gives_each_workers_start_and_its_stop_kills_it(pool: Pool) -> None:
    worker = _run_one(pool)
    workers: Any = pool.stats()["workers"]
    [entry] = workers
    assert entry["pid"] == worker
    assert entry["started"] == psutil.Process(worker).create_time()
    _report_of(pool.stats()).stop_worker("k", worker)
    assert not processes.wait_gone([worker], 60), "the reported worker was not stopped"


def test_a_pid_reported_for_a_worker_that_ended_is_never_killed_in_its_new_process(
    pool: Pool, children: list[subprocess.Popen[bytes]]
) -> None:
    # The report is a few seconds old at best: its worker ended, and its pid went to another
    # process shaped like a worker of the same kernel (the bootstrap, --parent this pid).
    # Only the start time the pool reported tells them apart.
    worker = _run_one(pool)
    stats = pool.stats()
    started = psutil.Process(worker).create_time()
    pool.close()
    processes.wait_for(lambda: not psutil.pid_exists(worker), 60, "the worker reaped")
    processes.wait_for(lambda: time.time() > started + 3, 10, "a later start time")
    argv = [*SLEEP, ENTRY, "--parent", str(os.getpid())]
    if _at_pid(worker, argv, children):
        stand_in = children[-1]
    else:  # not root here: the pool's report, its pid now the new process's
        stand_in = _spawn(children, argv)
        stats["workers"][0]["pid"] = stand_in.pid  # type: ignore[index]
    processes.wait_for(lambda: processes.cmdline(stand_in.pid) == argv, 60, "the new process")
    with pytest.raises(LookupError, match="recycled pid"):
        _report_of(stats).stop_worker("k", stand_in.pid)
    assert stand_in.poll() is None
