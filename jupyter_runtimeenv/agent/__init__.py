"""The agent: builds, caches and hands out environments.

Names are imported on first use: a kernel that only needs ``agent.events`` (a build's
event type) or talks to the server's agent must not import the agent itself (its build
machinery pulls in psutil, the plugins and the installers' modules).
"""

from __future__ import annotations

from .._lazy import exports

TYPE_CHECKING = False  # typing is not imported with the package (``answers``)
if TYPE_CHECKING:
    from .agent import RuntimeEnvAgent
    from .cache import CACHE_ENV_VAR, Cache, default_cache_dir
    from .core import DEFAULT_MAX_CACHE_BYTES
    from .events import Event
    from .state import EnvState

_EXPORTS = {
    "CACHE_ENV_VAR": "cache",
    "DEFAULT_MAX_CACHE_BYTES": "core",
    "Cache": "cache",
    "EnvState": "state",
    "Event": "events",
    "RuntimeEnvAgent": "agent",
    "default_cache_dir": "cache",
}

__all__ = [
    "CACHE_ENV_VAR",
    "DEFAULT_MAX_CACHE_BYTES",
    "Cache",
    "EnvState",
    "Event",
    "RuntimeEnvAgent",
    "default_cache_dir",
]


__getattr__, __dir__ = exports(__name__, _EXPORTS, __all__)
