"""Ray-style runtime environments for Jupyter.

Declare an environment (packages, local code, environment variables, plugins and the
notebook's own ``sys.path``) and run functions, cells or kernels in processes that start
inside it. Names are imported lazily so that ``import jupyter_runtimeenv`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from .agent import RuntimeEnvAgent
    from .client import AgentClient, EmbeddedClient, get_client
    from .context import EnvContext, compose, process_env
    from .errors import (
        AgentUnavailable,
        BrokenWorker,
        BuildError,
        BuildTimeout,
        EnvInUse,
        EnvNotFound,
        PluginNotFound,
        RemoteTaskError,
        RuntimeEnvError,
        SpecError,
        WorkerError,
    )
    from .plugins import BuildContext, RuntimeEnvPlugin
    from .spec import RuntimeEnvConfig, RuntimeEnvSpec, merge, parse

_EXPORTS = {
    "AgentClient": "client",
    "AgentUnavailable": "errors",
    "BrokenWorker": "errors",
    "BuildContext": "plugins",
    "BuildError": "errors",
    "BuildTimeout": "errors",
    "EmbeddedClient": "client",
    "EnvContext": "context",
    "EnvInUse": "errors",
    "EnvNotFound": "errors",
    "PluginNotFound": "errors",
    "RemoteTaskError": "errors",
    "RuntimeEnvAgent": "agent",
    "RuntimeEnvConfig": "spec",
    "RuntimeEnvError": "errors",
    "RuntimeEnvPlugin": "plugins",
    "RuntimeEnvSpec": "spec",
    "SpecError": "errors",
    "WorkerError": "errors",
    "compose": "context",
    "get_client": "client",
    "merge": "spec",
    "parse": "spec",
    "process_env": "context",
}

__all__ = [
    "AgentClient",
    "AgentUnavailable",
    "BrokenWorker",
    "BuildContext",
    "BuildError",
    "BuildTimeout",
    "EmbeddedClient",
    "EnvContext",
    "EnvInUse",
    "EnvNotFound",
    "PluginNotFound",
    "RemoteTaskError",
    "RuntimeEnvAgent",
    "RuntimeEnvConfig",
    "RuntimeEnvError",
    "RuntimeEnvPlugin",
    "RuntimeEnvSpec",
    "SpecError",
    "WorkerError",
    "__version__",
    "compose",
    "get_client",
    "merge",
    "parse",
    "process_env",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'jupyter_runtimeenv' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
