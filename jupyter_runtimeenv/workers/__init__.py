"""Remote task execution: workers started in a composed environment, and the ``remote`` API.

Public names: ``init``, ``remote``, ``get``, ``wait``, ``cancel``, ``prestart``, ``shutdown``,
``RemoteFunction``, ``RemoteFuture``, ``Executor``, ``LocalExecutor``. Imported lazily, so
that importing the package (as ``python -m jupyter_runtimeenv.workers._entry`` does) stays
cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import RemoteFunction, get, init, prestart, remote, shutdown, wait
    from .executor import Executor, LocalExecutor
    from .future import RemoteFuture
    from .interrupt import cancel

_EXPORTS = {
    "Executor": "executor",
    "LocalExecutor": "executor",
    "RemoteFunction": "api",
    "RemoteFuture": "future",
    "cancel": "interrupt",
    "get": "api",
    "init": "api",
    "prestart": "api",
    "remote": "api",
    "shutdown": "api",
    "wait": "api",
}

__all__ = [
    "Executor",
    "LocalExecutor",
    "RemoteFunction",
    "RemoteFuture",
    "cancel",
    "get",
    "init",
    "prestart",
    "remote",
    "shutdown",
    "wait",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
