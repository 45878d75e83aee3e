"""The agent: builds, caches and hands out environments."""

from __future__ import annotations

from .agent import DEFAULT_MAX_CACHE_BYTES, RuntimeEnvAgent
from .cache import CACHE_ENV_VAR, Cache, default_cache_dir
from .events import Event
from .state import EnvState

__all__ = [
    "CACHE_ENV_VAR",
    "DEFAULT_MAX_CACHE_BYTES",
    "Cache",
    "EnvState",
    "Event",
    "RuntimeEnvAgent",
    "default_cache_dir",
]
