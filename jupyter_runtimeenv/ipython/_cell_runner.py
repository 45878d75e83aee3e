"""What a ``%%remote`` cell runs in its worker: ``run_cell``.

Shipped by value (``cloudpickle.register_pickle_by_value`` on this module and its two
siblings, in ``remote_cell.py``), so an environment that cannot import
``jupyter_runtimeenv`` runs it too: the standard library and cloudpickle only (IPython and
matplotlib when the env has them, through ``_cell_display``).

The cell runs in its *remote namespace*: one per notebook and env, kept in this worker
(``NAMESPACES`` in ``sys.modules``) for as long as the worker lives; the pool routes every
cell of that namespace to this worker (``Task.affinity``). Names a cell defines and modules
it imports are there for the next cell, as in a kernel; the inputs the kernel sends are
bound first. The body (already through IPython's input transforms in the kernel) runs like
an IPython cell: the last expression's value is formatted here into a mime bundle and comes
back for the kernel to show as ``Out[n]``, unless the cell ends with ``;``; it is stored as
``_`` in the namespace, never shipped. The inputs and the ``--out`` values travel pickled
together (``_cell_values``: what they share stays shared), the latter with the versions of
the packages each one's pickle names, for when it cannot be unpickled in the kernel. Errors
come back as data: the traceback without this module's frame, and the exception described
by ``_exc_state``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._exc_state import describe, safe_str
from ._cell_display import add_printers, begin_cell, end_cell, format_object
from ._cell_handover import export, seed
from ._cell_magics import RemoteShell
from ._cell_values import aliases, dump, load, segment

#: The per-process registry of remote namespaces (a module, so it outlives each cell's
#: by-value copy of this file).
NAMESPACES = "_jupyter_runtimeenv_namespaces"
#: Names the runner puts in a namespace: never reported as the cell's own.
_OWN = frozenset({"__builtins__", "__name__", "get_ipython", "_", "_exit_code"})


def _registry() -> dict[str, Any]:
    import sys
    import types

    module = sys.modules.get(NAMESPACES)
    if module is None:
        module = types.ModuleType(NAMESPACES, "remote namespaces of %%remote cells")
        module.__dict__["spaces"] = {}
        sys.modules[NAMESPACES] = module
    return module.__dict__["spaces"]  # type: ignore[no-any-return]


def _error(exc: BaseException, skip: int) -> dict[str, Any]:
    import traceback

    import cloudpickle

    tb = exc.__traceback__
    for _ in range(skip):
        if tb is not None:
            tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return {
        "text": text,
        "exception": describe(exc, cloudpickle.dumps),
        "type": type(exc).__name__,
        "message": safe_str(exc),
    }


def _modules_in(blob: bytes) -> list[str]:
    """The top-level modules a pickle names (its classes and functions), minus the
    standard library's: the packages whose versions decide whether it unpickles."""
    import pickletools
    import sys

    found: list[str] = []
    strings: list[str] = []
    try:
        for opcode, arg, _pos in pickletools.genops(blob):
            if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                strings.append(str(arg))
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append(strings[-2])
            elif opcode.name in ("GLOBAL", "INST") and isinstance(arg, str):
                found.append(arg.split(" ", 1)[0])
    except Exception:  # a truncated or odd pickle: what was found so far
        pass
    tops = dict.fromkeys(name.partition(".")[0] for name in found)
    skip = set(sys.stdlib_module_names) | {"builtins", "__main__", "cloudpickle"}
    return [top for top in tops if top and top not in skip]


def versions(modules: list[str]) -> dict[str, list[str]]:
    """``{module: [distribution, version]}`` as installed here (``""`` when unknown)."""
    import sys
    from importlib import metadata

    out: dict[str, list[str]] = {}
    mapping: Mapping[str, list[str]] | None = None
    for top in modules:
        dist, version = top, ""
        try:
            version = metadata.version(top)
        except Exception:
            if mapping is None:
                try:
                    mapping = metadata.packages_distributions()
                except Exception:
                    mapping = {}
            names = mapping.get(top) or []
            if names:
                dist = names[0]
                try:
                    version = metadata.version(dist)
                except Exception:
                    version = ""
        if not version:
            version = str(getattr(sys.modules.get(top), "__version__", "") or "")
        out[top] = [dist, version]
    return out


def _outputs(namespace: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The bundle of the names asked for (``_cell_values.dump``: pickled together), with
    the versions of the packages each one's pickle names (``modules``)."""
    bundle = dump({name: namespace[name] for name in names})
    bundle["modules"] = {
        name: versions(_modules_in(segment(bundle, name))) for name in bundle["names"]
    }
    return bundle


def export_namespace(key: str, path: str) -> dict[str, Any]:
    """The last call of a namespace's worker when its env's local code changed: its names
    into ``path`` (``_cell_handover.export``); ``missing`` when this worker does not hold
    it."""
    space = _registry().get(key)
    if space is None:
        return {"missing": True, "carried": [], "lost": {}}
    names = space["ns"].items()
    return export({n: v for n, v in names if n not in _OWN and not n.startswith("__")}, path)


def run_cell(request: dict[str, Any]) -> dict[str, Any]:
    """Run one cell (see the module docstring). ``request`` holds ``source``, ``filename``,
    ``inputs`` (a ``_cell_values`` bundle), ``outputs`` (names), ``namespace`` (``key``,
    ``expected``: what the kernel knows of it), ``nonce``, ``figures``, ``quiet`` and
    ``changes`` (the names the cell changes in place, as the kernel reads its code).

    Returns ``error`` (or None), ``value`` (the last expression's bundle, or None),
    ``outputs`` (the bundle of those names, with ``modules``), ``missing``, ``changed``
    (names the cell bound or rebound, and the others bound to what it changed), ``style``
    (the matplotlib settings it changed, pickled, or None) and ``namespace`` (pid, whether
    it was created now, cells run, names held).
    """
    import ast
    import builtins
    import linecache
    import os
    import sys

    spaces = _registry()
    key = request["namespace"]["key"]
    created = key not in spaces
    if created and request["namespace"].get("expected"):
        # The worker that held it is gone (the kernel could not know yet): run nothing,
        # the kernel sends the cell again with every name it reads.
        return {"lost": True, "namespace": {"pid": os.getpid(), "created": True}}
    if created:
        spaces[key] = {"ns": {"__name__": "__main__", "__builtins__": builtins}, "cells": 0}
    space = spaces[key]
    namespace: dict[str, Any] = space["ns"]
    space["cells"] += 1
    source, filename = request["source"], request["filename"]
    result: dict[str, Any] = {
        "error": None,
        "value": None,
        "outputs": {},
        "missing": [],
        "changed": [],
        "namespace": {"pid": os.getpid(), "created": created, "cells": space["cells"]},
    }
    shell = RemoteShell(
        namespace, filename, 0, request.get("colors", "neutral"), request.get("aliases")
    )
    namespace["get_ipython"] = lambda: shell
    # Before the inputs: unpickling one may import matplotlib.pyplot, which picks its
    # backend then.
    begin_cell(request["nonce"], request["figures"])
    if request.get("printers"):  # the kernel's own display printers (_remote_printers)
        add_printers(request["printers"])
    if created and request.get("seed"):  # the names of the namespace this one replaces
        try:
            not_loaded = seed(namespace, request["seed"])
        except Exception as broken:
            not_loaded = [f"all of them ({broken!r})"]
        if not_loaded:
            print(
                "%%remote: these names of the old namespace could not be loaded here: "
                + "; ".join(not_loaded),
                file=sys.stderr,
            )
    inputs = request["inputs"]
    values, failed = load(inputs)
    for name, exc in failed.items():  # the first that did not load
        result["error"] = {
            **_error(exc, 1),
            "input": name,
            "modules": versions(_modules_in(segment(inputs, name))),
        }
        if not request["namespace"].get("keep", True):
            del spaces[key]
        return result
    namespace.update(values)
    del values, inputs
    before = {name: id(value) for name, value in namespace.items()}
    shown = request.get("lines") or source  # tracebacks show the cell as written
    lines = shown.splitlines(keepends=True)
    linecache.cache[filename] = (len(shown), None, lines, filename)
    value = None
    try:
        try:
            tree = ast.parse(source, filename)
            last: ast.Expression | None = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body[-1].value)
                del tree.body[-1]
            with shell.in_builtins():
                exec(compile(tree, filename, "exec"), namespace)
                if last is not None:
                    value = eval(compile(last, filename, "eval"), namespace)
        except BaseException as exc:
            result["error"] = _error(exc, 1)
        else:
            if value is not None and not request.get("quiet"):
                namespace["_"] = value
                try:
                    data, metadata = format_object(value)
                except Exception as exc:  # a broken _repr_*_ shows as IPython shows it
                    result["error"] = _error(exc, 1)
                else:
                    result["value"] = {"data": data, "metadata": metadata}
    finally:
        try:
            result["style"] = end_cell()
        except Exception as exc:  # drawing a figure failed: the cell's error, if none
            if result["error"] is None:
                result["error"] = _error(exc, 1)
    result["changed"] = [
        name for name, obj in namespace.items() if name not in _OWN and before.get(name) != id(obj)
    ]
    # Names bound to what the cell changed in place (``y`` of ``y = x``, ``x.append(4)``).
    result["changed"] += aliases(namespace, list(request.get("changes") or ()))
    result["namespace"]["names"] = sorted(
        name for name in namespace if name not in _OWN and not name.startswith("__")
    )
    if not request["namespace"].get("keep", True):
        del spaces[key]  # an executor that keeps no worker for a namespace
    if result["error"] is not None:
        return result
    result["missing"] = [name for name in request["outputs"] if name not in namespace]
    result["outputs"] = _outputs(
        namespace, [name for name in request["outputs"] if name in namespace]
    )
    return result
