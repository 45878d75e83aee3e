"""Remote task execution: workers started in a composed environment, their pools and the
local executor. (The ``remote`` API on top of it is ``jupyter_runtimeenv.api``.)

Public names: ``cancel``, ``RemoteFuture``, ``Executor``, ``LocalExecutor``. Imported lazily, so
that importing the package (as ``python -m jupyter_runtimeenv.workers._entry`` does) stays
cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .executor import Executor, LocalExecutor
    from .future import RemoteFuture
    from .interrupt import cancel

_EXPORTS = {
    "Executor": "executor",
    "LocalExecutor": "executor",
    "RemoteFuture": "future",
    "cancel": "interrupt",
}

__all__ = [
    "Executor",
    "LocalExecutor",
    "RemoteFuture",
    "cancel",
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
