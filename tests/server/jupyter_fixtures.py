"""Fixtures of the server and kernel tests: a real Jupyter server (pytest-jupyter) with the
extension, a non-root base URL, token auth required everywhere, and a cache of the test's own.

The ``conftest.py`` of ``tests/server`` and ``tests/kernels`` star-import this module: pytest
refuses ``pytest_plugins`` outside the top-level conftest, and importing pytest-jupyter's
fixtures and hooks is the same thing, scoped to these directories.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403

API = ("jupyter-runtimeenv", "api")
SCRIPT_PLUGIN = "tests.server.plugins.ScriptPlugin"


@pytest.fixture
async def jp_asyncio_loop() -> asyncio.AbstractEventLoop:
    """pytest-jupyter's loop, made the one pytest-asyncio runs the test on.

    pytest-jupyter starts the server on ``jp_asyncio_loop``; pytest-asyncio (asyncio_mode=auto)
    runs async tests on its own runner's loop. Handing pytest-jupyter the runner's loop puts
    the server and the test on one loop. The runner closes it, not us.
    """
    return asyncio.get_running_loop()


@pytest.fixture
def jp_base_url() -> str:
    return "/a/b/"


@pytest.fixture
def extension_config() -> dict[str, Any]:
    """Tests override this to configure ``RuntimeEnvExtension``."""
    return {}


@pytest.fixture
def jp_server_config(tmp_path: Path, extension_config: dict[str, Any]) -> dict[str, Any]:
    return {
        "ServerApp": {
            # jupyter_server_terminals trips the server's auth warning (an error here).
            "jpserver_extensions": {
                "jupyter_runtimeenv": True,
                "jupyter_server_terminals": False,
            },
            "allow_unauthenticated_access": False,
        },
        "RuntimeEnvExtension": {
            "cache_dir": str(tmp_path / "runtimeenv-cache"),
            # The tests' own plugin, named by import path: the operator allows it.
            "allowed_plugins": [SCRIPT_PLUGIN],
            **extension_config,
        },
    }
