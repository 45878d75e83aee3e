"""Fixtures of the worker tests: real worker processes, a real embedded agent.

``agent_executor`` is a ``LocalExecutor`` wired to an ``EmbeddedClient`` over a fresh cache
and installed as the session executor; ``make_pool`` builds pools on a context made here.
After every test no worker process of ours may be left, running or zombie (psutil).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import processes
import psutil
import pytest

from jupyter_runtimeenv import api
from jupyter_runtimeenv._cpuload import Gauge
from jupyter_runtimeenv.agent import RuntimeEnvAgent
from jupyter_runtimeenv.client import EmbeddedClient
from jupyter_runtimeenv.context import EnvContext
from jupyter_runtimeenv.workers import process, protocol, zygote
from jupyter_runtimeenv.workers.executor import LocalExecutor, resolve_driver_sys_path
from jupyter_runtimeenv.workers.pool import Pool
from tests.workers.helpers import worker_children


@pytest.fixture(autouse=True)
def no_leaked_workers() -> Iterator[None]:
    # Only what this test started counts: in a whole-suite run, processes another folder's
    # tests left (seen in CI: workers started minutes before, by then children of this
    # process) are not this test's leak and must not fail it. psutil.Process compares by
    # pid and start time, so a recycled pid is new.
    # Those are ended here, so that this test starts from none (tests here assert that no
    # worker process is left once a pool closes).
    stale = worker_children()
    for proc in stale:
        processes.kill(proc)
    processes.wait_gone([p.pid for p in stale], 10)
    for proc in stale:  # our own children among them: reaped, not left as zombies
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(proc.pid, os.WNOHANG)
    before = set(worker_children())
    zombies_before = set(_zombie_children())
    yield
    api.shutdown()
    zygote.stop_all()  # templates outlive executors (they serve the process); not tests
    leftovers = [p for p in worker_children() if p not in before]
    for proc in leftovers:
        processes.kill(proc)
    assert not leftovers, f"worker processes left behind: {[p.pid for p in leftovers]}"
    # Every process we started was waited for: no zombie either (a grace for reader
    # threads still reaping a worker that just died).
    deadline = time.monotonic() + 5
    while (
        zombies := [z for z in _zombie_children() if z not in zombies_before]
    ) and time.monotonic() < deadline:
        time.sleep(0.02)
    # Named as the kernel keeps a zombie's name (``jrespare<pid>``: a zygote spare; a
    # template's or a worker's python otherwise): which of them was not reaped.
    assert not zombies, f"zombie processes left behind: {[_named(z) for z in zombies]}"


def _named(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f"{pid} ({f.read().strip()})"
    except OSError:
        return f"{pid} (gone)"


def _zombie_children() -> list[int]:
    found = []
    for child in psutil.Process().children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                found.append(child.pid)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture
def ctx() -> EnvContext:
    # The driver's path goes along, as the agent's driver_sys_path plugin would put it:
    # the test functions live in modules of tests/workers.
    return EnvContext(
        python=sys.executable,
        env_vars={"JRE_TEST": "direct"},
        driver_sys_path=resolve_driver_sys_path(),
    )


@pytest.fixture
def make_pool(ctx: EnvContext) -> Iterator[Callable[..., Pool]]:
    pools: list[Pool] = []

    def make(context: EnvContext | None = None, **kwargs: Any) -> Pool:
        context = context or ctx
        pool = Pool(lambda: context, **kwargs)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


@pytest.fixture
def client(tmp_path: Path) -> Iterator[EmbeddedClient]:
    cache = tmp_path / "cache"
    cache.mkdir()
    client = EmbeddedClient(RuntimeEnvAgent(cache))
    yield client
    client.close()


@pytest.fixture
def agent_executor(client: EmbeddedClient) -> Iterator[LocalExecutor]:
    executor = LocalExecutor(
        max_workers=2, acquire=client.acquire_sync, release=client.release_sync
    )
    api.init(executor=executor)
    yield executor
    executor.shutdown()


@pytest.fixture(params=["spare CPU", "busy"])
def machine(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The driver's view of the machine: with a CPU to spare (``/proc/loadavg``'s runnable
    tasks: 1) a waiter polls for its answer; here every wait counts as back to back, so it
    polls for its whole read window whatever the real machine's timing; busy: it blocks.
    A test that takes it runs both ways (test_answer_read.py, test_idle_path.py)."""
    path = tmp_path / "loadavg"
    runnable = 1 if request.param == "spare CPU" else 64
    path.write_bytes(f"0.00 0.00 0.00 {runnable}/100 1\n".encode())
    monkeypatch.setattr(process, "GAUGE", Gauge(str(path)))
    if request.param == "spare CPU":
        monkeypatch.setattr(protocol, "SPIN_WINDOW", 60.0)
    return str(request.param)
