"""What a ``%%remote`` cell runs in its worker: ``run_cell``.

Shipped by value (``cloudpickle.register_pickle_by_value`` on this module, in
``remote_cell.py``), so an environment that cannot import ``jupyter_runtimeenv`` runs it
too; it uses the standard library, and cloudpickle (every worker has it), only.

The body runs like an IPython cell: top-level statements, then the last expression's value
is the cell's value. ``display(obj)`` collects ``obj``. Values travel back pickled one by
one, each with its ``repr`` for when it cannot be pickled here or unpickled in the driver.
Errors come back as data, not raised: the traceback without this module's frame, so the
driver can show it as the cell's own.
"""

from __future__ import annotations

from typing import Any

from .._exc_state import describe, safe_str


def _item(value: Any) -> dict[str, Any]:
    import cloudpickle

    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not lose the rest
        text = f"<{type(value).__name__} object (repr failed: {exc!r})>"
    try:
        blob: bytes | None = cloudpickle.dumps(value, protocol=5)
    except Exception:
        blob = None
    return {"pickle": blob, "repr": text}


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


def run_cell(
    source: str, filename: str, inputs: dict[str, bytes], outputs: list[str]
) -> dict[str, Any]:
    """Run ``source`` (line numbers as in the notebook cell) with ``inputs`` defined.

    Returns ``{"displays", "value", "outputs", "error", "missing"}``: ``error`` is set when
    the cell raised (then nothing else is), ``missing`` lists ``outputs`` the cell did not
    define, ``outputs`` maps the others to items, each ``{"pickle", "repr"}``.
    """
    import ast
    import builtins
    import linecache
    import pickle

    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    displays: list[dict[str, Any]] = []

    def display(*objects: Any, **_options: Any) -> None:
        displays.extend(_item(obj) for obj in objects)

    namespace["display"] = display
    result: dict[str, Any] = {
        "displays": displays,
        "value": None,
        "outputs": {},
        "error": None,
        "missing": [],
    }
    for name, blob in inputs.items():
        try:
            namespace[name] = pickle.loads(blob)
        except BaseException as exc:
            result["error"] = {**_error(exc, 1), "input": name}
            return result
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    try:
        tree = ast.parse(source, filename)
        last: ast.Expression | None = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body[-1].value)
            del tree.body[-1]
        exec(compile(tree, filename, "exec"), namespace)
        value = eval(compile(last, filename, "eval"), namespace) if last is not None else None
    except BaseException as exc:
        result["error"] = _error(exc, 1)
        return result
    if value is not None:
        result["value"] = _item(value)
    for name in outputs:
        if name in namespace:
            result["outputs"][name] = _item(namespace[name])
        else:
            result["missing"].append(name)
    return result
