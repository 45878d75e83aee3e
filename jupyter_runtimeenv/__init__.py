"""Ray-style runtime environments for Jupyter.

Declare an environment (packages, local code, environment variables, plugins and the
notebook's own ``sys.path``) and run functions, cells or kernels in processes that start
inside it. Names are imported lazily so that ``import jupyter_runtimeenv`` stays cheap.
"""

from __future__ import annotations

from ._lazy import exports
from ._version import __version__

TYPE_CHECKING = False  # typing's import (re, enum, functools: ~8 ms) is not every command's
if TYPE_CHECKING:
    from typing import Any

    from .agent import RuntimeEnvAgent
    from .api import RemoteFunction, get, init, prestart, remote, shutdown, wait
    from .client import AgentClient, EmbeddedClient, get_client
    from .context import EnvContext, compose, process_env
    from .dask import DaskExecutor
    from .errors import (
        AgentUnavailable,
        BrokenWorker,
        BuildError,
        BuildTimeout,
        CacheUnavailable,
        EnvInUse,
        EnvNotFound,
        InvalidName,
        KernelStartError,
        PluginNotFound,
        RemoteCellError,
        RemoteInterrupt,
        RemoteTaskError,
        RuntimeEnvError,
        SerializationError,
        SpecError,
        WorkerError,
        WorkerSetupError,
    )
    from .ipython.tasks import progress
    from .plugins import BuildContext, RuntimeEnvPlugin
    from .spec import RuntimeEnvConfig, RuntimeEnvSpec, SpecPolicy, merge, parse
    from .workers import Executor, LocalExecutor, RemoteFuture, cancel

_EXPORTS = {
    "DaskExecutor": "dask",
    "AgentClient": "client",
    "AgentUnavailable": "errors",
    "BrokenWorker": "errors",
    "BuildContext": "plugins",
    "BuildError": "errors",
    "BuildTimeout": "errors",
    "CacheUnavailable": "errors",
    "EmbeddedClient": "client",
    "EnvContext": "context",
    "EnvInUse": "errors",
    "EnvNotFound": "errors",
    "InvalidName": "errors",
    "KernelStartError": "errors",
    "SpecPolicy": "spec",
    "Executor": "workers",
    "LocalExecutor": "workers",
    "RemoteFunction": "api",
    "RemoteFuture": "workers",
    "SerializationError": "errors",
    "cancel": "workers",
    "get": "api",
    "init": "api",
    "prestart": "api",
    "remote": "api",
    "shutdown": "api",
    "wait": "api",
    "PluginNotFound": "errors",
    "RemoteCellError": "errors",
    "RemoteInterrupt": "errors",
    "RemoteTaskError": "errors",
    "RuntimeEnvAgent": "agent",
    "RuntimeEnvConfig": "spec",
    "RuntimeEnvError": "errors",
    "RuntimeEnvPlugin": "plugins",
    "RuntimeEnvSpec": "spec",
    "SpecError": "errors",
    "WorkerError": "errors",
    "WorkerSetupError": "errors",
    "compose": "context",
    "get_client": "client",
    "merge": "spec",
    "parse": "spec",
    "process_env": "context",
    "progress": "ipython.tasks",
}

__all__ = [
    "AgentClient",
    "AgentUnavailable",
    "BrokenWorker",
    "BuildContext",
    "BuildError",
    "BuildTimeout",
    "CacheUnavailable",
    "DaskExecutor",
    "EmbeddedClient",
    "EnvContext",
    "EnvInUse",
    "EnvNotFound",
    "Executor",
    "InvalidName",
    "KernelStartError",
    "LocalExecutor",
    "PluginNotFound",
    "RemoteCellError",
    "RemoteFunction",
    "RemoteFuture",
    "RemoteInterrupt",
    "RemoteTaskError",
    "RuntimeEnvAgent",
    "RuntimeEnvConfig",
    "RuntimeEnvError",
    "RuntimeEnvPlugin",
    "RuntimeEnvSpec",
    "SerializationError",
    "SpecError",
    "SpecPolicy",
    "WorkerError",
    "WorkerSetupError",
    "__version__",
    "cancel",
    "compose",
    "get",
    "get_client",
    "init",
    "merge",
    "parse",
    "prestart",
    "process_env",
    "progress",
    "remote",
    "shutdown",
    "wait",
]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """Lets ``jupyter server --ServerApp.jpserver_extensions={'jupyter_runtimeenv': True}``
    find the extension by the package's own name."""
    from .server import _jupyter_server_extension_points as points

    return points()


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_runtimeenv``: the ``%runtime_env`` magic and a bare ``@remote``."""
    from .ipython import load_ipython_extension as load

    load(ipython)


__getattr__, __dir__ = exports(__name__, _EXPORTS, __all__)
