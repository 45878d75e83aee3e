"""Fixtures shared by every test part.

The whole run uses a cache root of its own (``JUPYTER_RUNTIMEENV_CACHE``) so that tests
never touch the user's cache; tests that need isolation take ``cache_dir``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

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
