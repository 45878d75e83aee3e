"""Scale-out on Dask: ``DaskExecutor`` (the driver) and the node agent (each Dask worker).

``distributed`` is an optional dependency (``pip install 'jupyter-runtimeenv[dask]'``):
this package imports it only when an executor is made, and says what to install if it is
missing. ``init(executor=client_or_address)`` comes here through ``executor_for``.
"""

from __future__ import annotations

from typing import Any

from .executor import DaskExecutor, require_distributed

__all__ = ["DaskExecutor", "executor_for", "require_distributed"]


def executor_for(target: Any) -> DaskExecutor:
    """A ``DaskExecutor`` for a ``distributed.Client`` or a scheduler address."""
    return DaskExecutor(target)
