"""Fixtures shared by every test part.

The whole run uses a cache root of its own (``JUPYTER_RUNTIMEENV_CACHE``) so that tests
never touch the user's cache; tests that need isolation take ``cache_dir``.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import processes
import psutil
import pytest

from jupyter_runtimeenv.agent import RuntimeEnvAgent

_SESSION_CACHE = tempfile.mkdtemp(prefix="jre-test-cache-")


def pytest_configure(config: pytest.Config) -> None:
    os.environ["JUPYTER_RUNTIMEENV_CACHE"] = _SESSION_CACHE
    # Agents use the user's own uv cache by default (plugins/_uv.py); the tests' installs of
    # their own wheelhouse must not land in the developer's ~/.cache/uv. The tests of that
    # choice (tests/plugins/test_uv_cache.py) unset this.
    os.environ["JUPYTER_RUNTIMEENV_UV_CACHE"] = "private"
    # Kernels and servers started by tests must not find a developer's running server.
    os.environ.pop("JUPYTER_RUNTIMEENV_URL", None)
    os.environ.pop("JUPYTER_RUNTIMEENV_TOKEN", None)
    # distributed warns when making a worker's scratch directory takes over 1 s: a loaded
    # machine, not a fault; as an error (pyproject's "error" filter) it failed a
    # LocalCluster's start in CI at load 25. Appended, so it takes precedence.
    config.addinivalue_line(
        "filterwarnings",
        "ignore:Creating scratch directories is taking a surprisingly long time:UserWarning",
    )


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    path = tmp_path / "cache"
    path.mkdir(mode=0o700)  # owner-only, as the agent makes it (a wider one gets a warning)
    return path


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 where a connection is refused, for the whole test: bound by this
    process and never listened on, so that no other process (another test's server, a kernel)
    can take it meanwhile, as it could a port found free and let go."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield int(holder.getsockname()[1])


@pytest.fixture
async def make_agent(cache_dir: Path) -> AsyncIterator[Callable[..., Any]]:
    """Start agents on ``cache_dir`` (by default); every one is stopped after the test."""
    agents: list[RuntimeEnvAgent] = []

    async def make(**kwargs: Any) -> RuntimeEnvAgent:
        kwargs.setdefault("cache_dir", cache_dir)
        agent = RuntimeEnvAgent(**kwargs)
        await agent.start()
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        await agent.stop()


# -- which test leaves worker processes behind ----------------------------------------------
# After each test, the worker processes (workers/_entry.py; not the --zygote templates, which
# outlive pools by design) among our descendants (a kernel's workers are its children): each
# new one is put down to the test after which it was first seen, and how long it lived on is
# kept. Those alive _LEFT_FOR seconds later are listed at the end of the run and, as they are
# found, appended to the file $JUPYTER_RUNTIMEENV_TEST_LEAKS if set. A report, not a
# failure: a worker of a kernel still shutting down is seen once and gone at the next look.
# (It found the kernels tests/notebooks left running, with their workers, for minutes.)
_LEFT_FOR = 30.0
_left: dict[psutil.Process, tuple[str, str, float, float]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield
    now = time.monotonic()
    for proc in processes.worker_children():
        seen = _left.get(proc)
        if seen is None:
            try:
                parent = f"{proc.ppid()} {processes.cmdline(proc.ppid())[:3]}"
            except psutil.Error:
                parent = "(gone)"
            _left[proc] = (item.nodeid, parent, now, now)
        else:
            _left[proc] = (*seen[:3], now)
            if now - seen[2] >= _LEFT_FOR and seen[3] - seen[2] < _LEFT_FOR:
                _note(
                    f"{seen[0]}: worker pid {proc.pid} (parent {seen[1]}) still alive "
                    f"{now - seen[2]:.0f} s later, after {item.nodeid}"
                )


def _note(line: str) -> None:
    # As it is found, too (the summary comes only at the end of a run of many minutes).
    log = os.environ.get("JUPYTER_RUNTIMEENV_TEST_LEAKS")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    now = time.monotonic()
    for proc in processes.worker_children():  # still alive at the end: seen until now
        if proc in _left:
            _left[proc] = (*_left[proc][:3], now)
    lasting = [(p, v) for p, v in _left.items() if v[3] - v[2] >= _LEFT_FOR]
    if lasting:
        terminalreporter.section("worker processes left behind by tests")
        for proc, (nodeid, parent, first, last) in lasting:
            terminalreporter.line(
                f"{nodeid}: worker pid {proc.pid} (parent {parent})"
                f" alive {last - first:.0f} s after it"
            )
