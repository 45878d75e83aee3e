"""The agent: builds, caches and hands out environments.

Names are imported on first use: a kernel that only needs ``agent.events`` (a build's
event type) or talks to the server's agent must not import the agent itself (its build
machinery pulls in psutil, the plugins and the installers' modules).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .agent import DEFAULT_MAX_CACHE_BYTES, RuntimeEnvAgent
    from .cache import CACHE_ENV_VAR, Cache, default_cache_dir
    from .events import Event
    from .state import EnvState

_EXPORTS = {
    "CACHE_ENV_VAR": "cache",
    "DEFAULT_MAX_CACHE_BYTES": "agent",
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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'jupyter_runtimeenv.agent' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
