"""pytest-jupyter and the shared server fixtures (see ``tests/server/jupyter_fixtures.py``)."""

from __future__ import annotations

import pytest

from tests.server.jupyter_fixtures import *  # noqa: F403


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "readonly: the server's authorizer grants read only")
    config.addinivalue_line("markers", "no_plugins: allowed_plugins is empty")
