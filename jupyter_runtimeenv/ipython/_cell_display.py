"""Displays and figures of a ``%%remote`` cell, in its worker, as IPython shows them.

Shipped by value with the cell runner (``remote_cell.py`` registers it): the standard
library only at import; IPython and matplotlib are used when the env has them.

What a cell shows travels as display messages written in order into the worker's stdout,
each one line: ``MARK`` + the cell's nonce + ``;`` + JSON + ``END`` (``remote_cell`` takes
them out of the stream and publishes them in the kernel), so prints, displays and figures
arrive interleaved as they happened, while the cell runs, as plain JSON mime bundles: the
kernel needs neither the objects' classes nor matplotlib to show them.

- ``display()`` (the cell's, the builtin one, and ``IPython.display.display`` once IPython is
  imported, which is patched) follows IPython's rules: ``_ipython_display_``,
  ``_repr_mimebundle_``, ``_repr_*_`` and IPython's own formatters (pretty text) when the
  env has IPython, else the ``_repr_*_`` methods and ``repr``; ``display_id``/``update``,
  ``clear=``, ``raw=``; widget views are dropped (their model would be in the worker).
- matplotlib draws with ``_cell_figures``' backend, as matplotlib-inline does; the figures a
  cell leaves open are shown after its result (``post`` messages) and closed.

State that lives as long as the worker (the formatter, what to emit with) is kept by
``_cell_figures.state()``: this file arrives by value with each cell.
"""

from __future__ import annotations

import base64
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types
from typing import Any

from ._cell_figures import (
    apply_style,
    choose_backend,
    figure_bundle,
    flush_figures,
    is_figure,
    rc_snapshot,
    register_figure_formatters,
    state,
    style_changes,
)

MARK = "\x1bPjupyter-runtimeenv;"
END = "\x1b\\"
_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
#: The _repr_*_ methods IPython's formatters call, in its order, for an env without IPython.
_REPR_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("application/pdf", "_repr_pdf_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
    ("application/javascript", "_repr_javascript_"),
)


def begin_cell(nonce: str, figures: dict[str, Any]) -> None:
    """Before a cell runs: its display channel, the kernel's figure settings, the backend
    chosen for a matplotlib not imported yet, ``display`` in builtins, IPython patched."""
    current = state()
    current["emit"] = _emitter(nonce)
    current["figures"] = figures
    current["post"] = False
    current["display"] = display
    choose_backend()
    if figures.get("style") is not None:
        apply_style(figures["style"])
    current["rc_before"] = rc_snapshot()
    import builtins

    builtins.display = display  # type: ignore[attr-defined]  # as IPython puts it there
    _patch_ipython()


def end_cell() -> bytes | None:
    """After a cell (also one that raised): the figures it left open, shown after its
    result as the inline backend's post-execute hook shows them, then closed. Returns the
    style settings the cell changed, for the kernel (``style_changes``)."""
    current = state()
    current["post"] = True
    try:
        flush_figures()
    finally:
        current["post"] = False
    return style_changes(current.pop("rc_before", None))


def _emitter(nonce: str) -> Any:
    def emit(message: dict[str, Any]) -> None:
        message["post"] = state().get("post", False)
        line = MARK + nonce + ";" + json.dumps(message, default=_json_default) + END + "\n"
        for stream in (sys.stdout, sys.stderr):  # what was printed before comes first
            try:  # noqa: SIM105 - the worker imports as little as it can
                stream.flush()
            except Exception:
                pass
        out = sys.__stdout__
        if out is not None:
            out.write(line)
            out.flush()

    return emit


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)


def _emit(message: dict[str, Any]) -> None:
    emit = state()["emit"]
    if emit is not None:
        emit(message)


# -- display(), as IPython's ---------------------------------------------------------------


def _merge(d1: Any, d2: Any) -> Any:
    if not isinstance(d2, dict) or not isinstance(d1, dict):
        return d2
    for key, value in d2.items():
        d1[key] = _merge(d1.get(key), value)
    return d1


def display(
    *objs: Any,
    include: Any = None,
    exclude: Any = None,
    metadata: dict[str, Any] | None = None,
    transient: dict[str, Any] | None = None,
    display_id: Any = None,
    raw: bool = False,
    clear: bool = False,
    **kwargs: Any,
) -> Any:
    """``IPython.display.display``, publishing through the cell's display channel."""
    transient = dict(transient or {})
    metadata = metadata or {}
    if display_id:
        if display_id is True:
            display_id = os.urandom(16).hex()
        transient["display_id"] = display_id
    if kwargs.get("update") and "display_id" not in transient:
        raise TypeError("display_id required for update_display")
    if not objs and display_id:
        objs, raw = ({},), True
    if clear:
        clear_output(wait=True)
    for obj in objs:
        if raw:
            data, md = dict(obj), dict(metadata)
        else:
            data, md = format_object(obj, include, exclude)
            if not data:
                continue  # _ipython_display_ took over
            if metadata:
                _merge(md, metadata)
        publish_display_data(data, md, transient=transient, **kwargs)
    if display_id:
        return DisplayHandle(display_id)
    return None


def publish_display_data(
    data: dict[str, Any],
    metadata: dict[str, Any] | None = None,
    *,
    transient: dict[str, Any] | None = None,
    **kwargs: Any,
) -> None:
    if _WIDGET_VIEW in data:
        # Its model would live in this worker, out of the frontend's reach (no comm).
        data = {mime: value for mime, value in data.items() if mime != _WIDGET_VIEW}
        print(
            "%%remote: a widget cannot be live in a %%remote cell (its model would be in the"
            " worker): its text is shown; run this cell without %%remote to use it",
            file=sys.stderr,
        )
    _emit(
        {
            "op": "display",
            "data": data,
            "metadata": metadata or {},
            "transient": transient or {},
            "update": bool(kwargs.get("update")),
        }
    )


def update_display(obj: Any, *, display_id: Any, **kwargs: Any) -> None:
    kwargs["update"] = True
    display(obj, display_id=display_id, **kwargs)


def clear_output(wait: bool = False) -> None:
    _emit({"op": "clear", "wait": bool(wait)})


class DisplayHandle:
    """``IPython.display.DisplayHandle`` for an env without IPython."""

    def __init__(self, display_id: Any = None) -> None:
        self.display_id = display_id or os.urandom(16).hex()

    def __repr__(self) -> str:
        return f"<DisplayHandle display_id={self.display_id}>"

    def display(self, obj: Any, **kwargs: Any) -> None:
        display(obj, display_id=self.display_id, **kwargs)

    def update(self, obj: Any, **kwargs: Any) -> None:
        update_display(obj, display_id=self.display_id, **kwargs)


def format_object(
    obj: Any, include: Any = None, exclude: Any = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(data, metadata)`` of ``obj`` as the kernel's ``display_formatter`` makes them."""
    formatter = ipython_formatter()
    if formatter is not None:
        data, md = formatter.format(obj, include=include, exclude=exclude)
    else:
        data, md = _plain_format(obj)
    return dict(data), dict(md)


def add_printers(printers: list[bytes]) -> list[str]:
    """Register the kernel's printers (``_remote_printers``) on this worker's formatter;
    what could not be loaded here (its type's package, another version), as text."""
    import pickle

    formatter = ipython_formatter()
    if formatter is None:
        return []
    failed = []
    for blob in printers:
        try:
            mime, kind, printer = pickle.loads(blob)
            target = formatter.formatters[mime]
            if isinstance(kind, tuple):
                target.for_type_by_name(kind[0], kind[1], printer)
            else:
                target.for_type(kind, printer)
        except Exception as exc:
            failed.append(f"{type(exc).__name__}: {exc}"[:200])
    return failed


def ipython_formatter() -> Any:
    current = state()
    if current["formatter"] is None:
        try:
            from IPython.core.formatters import DisplayFormatter
        except Exception:
            current["formatter"] = False
        else:
            current["formatter"] = DisplayFormatter()
    formatter = current["formatter"] or None
    if formatter is not None:
        register_figure_formatters(formatter)
    return formatter


def _plain_format(obj: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    data: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    if is_figure(obj):
        return figure_bundle(obj)
    bundle = getattr(obj, "_repr_mimebundle_", None)
    if callable(bundle):
        got = bundle(include=None, exclude=None)
        if isinstance(got, tuple):
            data.update(got[0] or {})
            metadata.update(got[1] or {})
        elif got:
            data.update(got)
    for mime, name in _REPR_METHODS:
        method = getattr(obj, name, None)
        if mime in data or not callable(method):
            continue
        try:
            value = method()
        except Exception:
            continue
        if isinstance(value, tuple):
            value, md = value
            metadata[mime] = md
        if value is not None:
            data[mime] = value
    data.setdefault("text/plain", _safe_repr(obj))
    return data, metadata


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as exc:
        return f"<{type(value).__name__} object (repr failed: {exc!r})>"


# -- IPython in the worker -----------------------------------------------------------------


class _PatchFinder(importlib.abc.MetaPathFinder):
    """Patches ``IPython.core.display_functions`` as it is imported, before
    ``IPython.display`` copies its names."""

    target = "IPython.core.display_functions"

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.target:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            original(module)
            _patch_module(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _patch_ipython() -> None:
    functions = sys.modules.get(_PatchFinder.target)
    if functions is not None:
        _patch_module(functions)
        for name in ("IPython.display", "IPython.core.display", "IPython"):
            module = sys.modules.get(name)
            if module is not None:
                for attr in ("display", "update_display", "clear_output", "publish_display_data"):
                    if hasattr(module, attr):
                        setattr(module, attr, globals()[attr])
    elif not any(isinstance(f, _PatchFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchFinder())


def _patch_module(module: types.ModuleType) -> None:
    module.display = display  # type: ignore[attr-defined]
    module.update_display = update_display  # type: ignore[attr-defined]
    module.clear_output = clear_output  # type: ignore[attr-defined]
    module.publish_display_data = publish_display_data  # type: ignore[attr-defined]
