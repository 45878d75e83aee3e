"""The Jupyter server extension: the agent hosted by the server, its REST API and events.

``RuntimeEnvExtension`` is imported on first use: a kernel imports ``server.client`` (its
way to the server's agent) and must not pay for jupyter_server, jupyter_events and
jsonschema, which ``server.app`` pulls in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._version import __version__

if TYPE_CHECKING:
    from .app import RuntimeEnvExtension

__all__ = ["RuntimeEnvExtension", "__version__"]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """Called by jupyter_server to find the extension app of this package."""
    from .app import RuntimeEnvExtension

    return [{"module": "jupyter_runtimeenv.server", "app": RuntimeEnvExtension}]


def __getattr__(name: str) -> Any:
    if name == "RuntimeEnvExtension":
        from .app import RuntimeEnvExtension

        return RuntimeEnvExtension
    raise AttributeError(f"module 'jupyter_runtimeenv.server' has no attribute {name!r}")
