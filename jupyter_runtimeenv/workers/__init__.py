"""Remote task execution: workers started in a composed environment, their pools and the
local executor. (The ``remote`` API on top of it is ``jupyter_runtimeenv.api``.)

Public names: ``cancel``, ``RemoteFuture``, ``Executor``, ``LocalExecutor``. Imported lazily, so
that importing the package (as ``python -m jupyter_runtimeenv.workers._entry`` does) stays
cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import exports

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


__getattr__, __dir__ = exports(__name__, _EXPORTS, __all__)
