"""The Jupyter server extension: the agent hosted by the server, its REST API and events."""

from __future__ import annotations

from typing import Any

from .._version import __version__
from .app import RuntimeEnvExtension

__all__ = ["RuntimeEnvExtension", "__version__"]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """Called by jupyter_server to find the extension app of this package."""
    return [{"module": "jupyter_runtimeenv.server", "app": RuntimeEnvExtension}]
