"""pytest-jupyter and the shared server fixtures (see ``tests/server/jupyter_fixtures.py``)."""

from __future__ import annotations

from tests.server.jupyter_fixtures import *  # noqa: F403
