"""Finished widgets that stay readable without a kernel: a static HTML + text rendering.

Who calls it: the build widget's owners (``magics.py``: ``%runtime_env`` in the foreground and
``--background``) and ``TaskProgress.close`` (``tasks.py``), once what they show has ended.

A widget's output in a notebook is only a reference to a model that lives in the kernel
(``application/vnd.jupyter.widget-view+json``): once the kernel is gone (a saved notebook
reopened, a restarted kernel, nbviewer, GitHub) the frontend has nothing to draw and says
"Error displaying widget: model not found". So when a build or a progress bar ends, its output
is replaced (``update_display_data`` on the widget's display id) by ``text/html`` drawn from the
widgets' final values and the ``text/plain`` form: what a saved notebook keeps.

JupyterLab applies an update only to the output area that sent the request which displayed the
output, and only while that area lives: not after the notebook was closed and reopened while a
background build went on, nor in another view of it. The update's metadata therefore names the
widget models it replaces (``{"jupyter_runtimeenv": {"replaces": [model_id, ...]}}``), the
JupyterLab extension swaps any output showing one of those models (``labextension/src/
outputs.ts``), and the kernel keeps the last ``KEEP_FINALS`` static forms by model id, which the
extension asks for (``final_bundles``, a silent ``user_expressions`` request) when it connects to
a notebook's kernel: a finished widget becomes static even if no frontend saw it finish.

The HTML is drawn from the widget tree, not from one widget class: any composition of boxes,
``HTML``/``Label`` and progress bars renders, so the per-node rows of a cluster build come out
as they were shown. The widgets' comms stay open: a frontend that did not take the update keeps
the live view.
"""

from __future__ import annotations

import html
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import ipywidgets

__all__ = ["METADATA_KEY", "StaticOutput", "final_bundles", "finalize", "widget_html"]

#: The key of the update's metadata that the JupyterLab extension reads.
METADATA_KEY = "jupyter_runtimeenv"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
#: How many finished widgets' static forms the kernel keeps for frontends that ask later.
KEEP_FINALS = 256

_finals: OrderedDict[str, dict[str, Any]] = OrderedDict()
_finals_lock = threading.Lock()  # builds finish on their own threads


class StaticOutput:
    """A display object of fixed HTML and text (what a finished widget becomes)."""

    def __init__(self, html_text: str, text: str) -> None:
        self.html = html_text
        self.text = text

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        return {"text/html": self.html, "text/plain": self.text}

    def __repr__(self) -> str:
        return self.text


def widget_html(widget: Any) -> str:
    """Static HTML of an ipywidgets tree as it is shown now (hidden parts left out)."""
    layout = getattr(widget, "layout", None)
    if layout is not None and getattr(layout, "display", None) == "none":
        return ""
    if isinstance(widget, ipywidgets.Box):
        parts = "".join(widget_html(child) for child in widget.children)
        if isinstance(widget, ipywidgets.HBox):
            return f'<div style="display:flex;flex-direction:row;gap:4px">{parts}</div>'
        return f"<div>{parts}</div>"
    if isinstance(widget, (ipywidgets.HTML, ipywidgets.HTMLMath)):
        return f"<div>{widget.value}</div>"
    if isinstance(widget, (ipywidgets.IntProgress, ipywidgets.FloatProgress)):
        span = (widget.max - widget.min) or 1
        share = max(0.0, min(1.0, (widget.value - widget.min) / span))
        label = html.escape(str(widget.description or ""))
        return (
            f'<div style="display:flex;align-items:center;gap:6px">{label}'
            '<div style="width:12em;height:8px;background:var(--jp-layout-color3, #ccc)">'
            f'<div style="width:{100 * share:.1f}%;height:100%;'
            'background:var(--jp-brand-color1, #1976d2)"></div></div></div>'
        )
    value = getattr(widget, "value", None)
    if isinstance(value, str):  # Label, Text and friends: their text
        return f"<div>{html.escape(value)}</div>"
    return ""


def model_ids(widget: Any) -> list[str]:
    """The model id a frontend displays ``widget`` by (its mime bundle's), if any."""
    try:
        bundle = widget._repr_mimebundle_()
    except Exception:  # not a widget, or closed: nothing to replace
        return []
    found = bundle.get(WIDGET_MIME, {}).get("model_id") if isinstance(bundle, dict) else None
    return [found] if isinstance(found, str) and found else []


def finalize(handle: Any, widget: Any, text: str) -> StaticOutput:
    """Replace the output ``handle`` displayed (``widget``) by its static form; returns it.

    ``widget`` is the displayed ipywidgets tree, ``text`` the text/plain form.
    """
    static = StaticOutput(widget_html(widget), text)
    replaces = model_ids(widget)
    metadata = {METADATA_KEY: {"replaces": replaces}}
    with _finals_lock:
        for model_id in replaces:
            _finals[model_id] = {"data": static._repr_mimebundle_(), "metadata": metadata}
            _finals.move_to_end(model_id)
        while len(_finals) > KEEP_FINALS:
            _finals.popitem(last=False)
    if handle is not None:
        handle.update(static, metadata=metadata)
    return static


class FinalBundles:
    """``{model_id: {"data", "metadata"}}`` as ``application/json`` (a ``user_expressions``
    answer carries the display formatter's output)."""

    def __init__(self, found: dict[str, dict[str, Any]]) -> None:
        self.found = found

    def _repr_json_(self) -> dict[str, dict[str, Any]]:
        return self.found

    def __repr__(self) -> str:
        return f"<{len(self.found)} finished widget outputs>"


def final_bundles(model_ids: Iterable[str]) -> FinalBundles:
    """The static forms of those of ``model_ids`` that finished in this kernel. Who calls it:
    the JupyterLab extension, when it connects to a notebook's kernel."""
    with _finals_lock:
        return FinalBundles({m: _finals[m] for m in model_ids if m in _finals})
