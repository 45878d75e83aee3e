"""A remote namespace moves to a new worker: the worker's half (``_remote_handover`` is the
kernel's).

When the local code of an env changes (a file written into its working dir, a module
edited), its next ``%%remote`` cell runs in a worker of the new env. ``export`` runs in the
old worker (``_cell_runner.export_namespace``), as its last call, and writes the namespace's
names into one file: one pickler for all of them, so two names of one object stay one
object, each name in a stretch of its own, so one that cannot be pickled (or loaded) is left
out alone and named with its cause (after a failure the pickling starts over without it, as
a failed dump leaves its objects in the pickler's memo). A name that is an attribute of a
module (what ``from pylab import *`` binds: ``rcParams``) goes as that reference, not as a
copy. ``seed`` runs in the new worker before the cell: the names are loaded into its new
namespace, and functions the cells defined read it as their globals again. Shipped by value
with the cell runner.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

#: Values cheaper and safer to copy than to look up as a module's attribute.
_PLAIN = (int, float, complex, str, bytes, bool, type(None))


def export(values: dict[str, Any], path: str) -> dict[str, Any]:
    """Write a namespace's ``values`` (name -> value) to ``path``: ``carried`` (names),
    ``lost`` (name -> why). Who calls it: ``_cell_runner.export_namespace``."""
    import pickle

    references = _module_attributes(values)
    items = {
        name: ("ref", references[name]) if name in references else ("value", value)
        for name, value in values.items()
    }
    lost: dict[str, str] = {}
    written = None
    while written is None:  # again only after a failure, without what failed (in ``lost``)
        written = _pickled(items, lost)
    data, index = written
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        pickle.dump(index, file)
        file.write(data)
    return {"carried": [name for name, _, _ in index], "lost": lost}


def _pickled(
    items: dict[str, Any], lost: dict[str, str]
) -> tuple[bytes, list[tuple[str, int, int]]] | None:
    """The items not in ``lost``, through one pickler (its memo shared: what two names share
    stays shared), each in a stretch of its own: ``(bytes, [(name, start, end)])``. When
    one fails, every item is tried alone (each that fails goes into ``lost``, with why) and
    ``None`` is returned, for a new pass without them: a failed dump leaves entries in the
    memo that later names could refer to."""
    import io
    import pickle

    import cloudpickle

    buffer = io.BytesIO()
    pickler = cloudpickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    index: list[tuple[str, int, int]] = []
    for name, item in items.items():
        if name in lost:
            continue
        start = buffer.tell()
        try:
            pickler.dump(item)
        except Exception as exc:
            for other, each in items.items():
                if other in lost:
                    continue
                try:
                    cloudpickle.dumps(each, protocol=pickle.HIGHEST_PROTOCOL)
                except Exception as why:
                    lost[other] = f"{type(why).__name__}: {why}"[:200]
            lost.setdefault(name, f"{type(exc).__name__}: {exc}"[:200])
            return None
        index.append((name, start, buffer.tell()))
    return buffer.getvalue(), index


def seed(namespace: dict[str, Any], path: str) -> list[str]:
    """Load what ``export`` wrote into a new namespace (then remove the file); the names
    that could not be loaded, with why (said in the cell's output)."""
    import importlib
    import io
    import pickle

    try:
        with open(path, "rb") as file:
            index = pickle.load(file)
            data = io.BytesIO(file.read())
    finally:
        os.unlink(path)
    unpickler = pickle.Unpickler(data)
    failed = []
    for name, start, _end in index:
        data.seek(start)
        try:
            kind, value = unpickler.load()
            if kind == "ref":
                value = getattr(importlib.import_module(value[0]), value[1])
        except Exception as exc:
            failed.append(f"{name} ({type(exc).__name__}: {exc})"[:200])
            continue
        if isinstance(value, types.FunctionType) and value.__module__ == "__main__":
            value = _rebound(value, namespace)
        namespace[name] = value
    return failed


def _module_attributes(values: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """``name -> (module, name)`` for each value that is that module's attribute of the same
    name (a star import's, or ``from m import x``), other than a function, class or module
    (which pickle as references already) or a plain value. One pass over the modules."""
    wanted = {
        name
        for name, value in values.items()
        if not isinstance(value, (*_PLAIN, types.FunctionType, types.ModuleType, type))
    }
    found: dict[str, tuple[str, str]] = {}
    for module_name, module in list(sys.modules.items()):
        if module_name == "__main__" or module is None:
            continue
        try:
            attributes = vars(module)
        except TypeError:
            continue
        for name in wanted & attributes.keys():
            if attributes[name] is values[name] and (
                name not in found or len(module_name) < len(found[name][0])
            ):
                found[name] = (module_name, name)
    return found


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
