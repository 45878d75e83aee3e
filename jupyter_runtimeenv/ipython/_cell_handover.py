"""A remote namespace moves to a new worker: the worker's half (``_remote_handover`` is the
kernel's).

When the local code of an env changes (a file written into its working dir, a module
edited), its next ``%%remote`` cell runs in a worker of the new env. ``export`` runs in the
old worker, as its last call: it pickles the namespace's names into one file (one pickle,
so two names of one object stay one object; a name that cannot be pickled is left out and
named with its cause). ``seed`` runs in the new worker before the cell: the names are
loaded into its new namespace, and functions the cells defined read it as their globals
again. Shipped by value with the cell runner.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

#: The module ``_cell_runner`` keeps the namespaces in (see ``_cell_runner.NAMESPACES``).
_NAMESPACES = "_jupyter_runtimeenv_namespaces"
#: What the runner puts in a namespace itself (``_cell_runner._OWN``): not carried.
_OWN = frozenset({"__builtins__", "__name__", "get_ipython", "_", "_exit_code"})


def export(key: str, path: str) -> dict[str, Any]:
    """Write the names of namespace ``key`` to ``path``: ``carried`` (names), ``lost``
    (name -> why); ``missing`` when this worker does not hold it."""
    import cloudpickle

    module = sys.modules.get(_NAMESPACES)
    space = None if module is None else module.__dict__["spaces"].get(key)
    if space is None:
        return {"missing": True, "carried": [], "lost": {}}
    namespace: dict[str, Any] = space["ns"]
    values = {
        name: value
        for name, value in namespace.items()
        if name not in _OWN and not name.startswith("__")
    }
    lost: dict[str, str] = {}
    try:
        blob = cloudpickle.dumps(values, protocol=5)
    except Exception:
        for name in list(values):  # which ones cannot go (one pickle each, to say why)
            try:
                cloudpickle.dumps(values[name], protocol=5)
            except Exception as exc:
                lost[name] = f"{type(exc).__name__}: {exc}"[:200]
                del values[name]
        blob = cloudpickle.dumps(values, protocol=5)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(blob)
    return {"carried": sorted(values), "lost": lost}


def seed(namespace: dict[str, Any], path: str) -> None:
    """Load what ``export`` wrote into a new namespace (then remove the file)."""
    import pickle

    try:
        with open(path, "rb") as file:
            values = pickle.load(file)
    finally:
        os.unlink(path)
    for name, value in values.items():
        if isinstance(value, types.FunctionType) and value.__module__ == "__main__":
            value = _rebound(value, namespace)
        namespace[name] = value


def _rebound(function: types.FunctionType, namespace: dict[str, Any]) -> types.FunctionType:
    """``function`` with ``namespace`` as its globals, as it had in the old worker (a
    pickled function gets globals of its own: it would not see the next cells' names)."""
    again = types.FunctionType(
        function.__code__,
        namespace,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
    again.__kwdefaults__ = function.__kwdefaults__
    again.__qualname__ = function.__qualname__
    again.__doc__ = function.__doc__
    again.__dict__.update(function.__dict__)
    again.__annotations__ = function.__annotations__
    return again
