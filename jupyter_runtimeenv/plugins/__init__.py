"""Plugins: built-in and third-party, loaded the same way."""

from __future__ import annotations

from .base import BuildContext, RunResult, RuntimeEnvPlugin
from .registry import ENTRY_POINT_GROUP, PluginRegistry, default_registry, load_plugin

__all__ = [
    "ENTRY_POINT_GROUP",
    "BuildContext",
    "PluginRegistry",
    "RunResult",
    "RuntimeEnvPlugin",
    "default_registry",
    "load_plugin",
]
