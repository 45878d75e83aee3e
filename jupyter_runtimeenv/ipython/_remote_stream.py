"""The kernel's end of a ``%%remote`` cell's output: its lines and its displays, in order.

Who calls it: ``remote_cell``, which puts a ``CellStream`` in place of ``sys.stdout`` and one
of ``sys.stderr`` while it submits the cell's task (``cell_streams``), so that the task's
output target (``OutputTarget.capture``) writes through them, from the worker's reader thread
(or the Dask executor's event handler) in the cell's context. A ``CellStream``:

- drops the task prefix of forwarded lines (``(run_cell pid=N) ``, a Dask node's
  ``(run_cell node=H:P pid=N) ``, and ``(run_cell) `` of the line telling the files the cell
  wrote: ``workers/files.py``), at line starts and after a ``\\r``;
- takes the display messages the worker writes into its stdout (``_cell_display.MARK`` ...
  ``END``, the cell's nonce checked) out of the text and publishes them where they came:
  ``display_data`` (with ``display_id``/``update``), ``clear_output``; the figures a cell
  left open are held (``post``) until the kernel has shown the cell's result, as the
  inline backend's post-execute hook shows them after ``Out[n]``.

A message may arrive in pieces (a long line is forwarded in parts): its start is held back
until its end arrives.

``figure_settings`` reads the kernel's inline-figure settings the cell's worker draws with.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from ._cell_display import END, MARK
from ._cell_figures import NOT_STYLE

__all__ = [
    "CellStream",
    "cell_streams",
    "figure_settings",
    "kernel_style",
    "publish",
    "take_style",
]


def publish(message: dict[str, Any]) -> None:
    """Show one display message of a worker in the current cell."""
    from IPython import display as ipython_display

    shown: Any = ipython_display  # untyped
    if message.get("op") == "clear":
        shown.clear_output(wait=bool(message.get("wait")))
        return
    extra: dict[str, Any] = {}
    if message.get("transient"):
        extra["transient"] = message["transient"]
    if message.get("update"):
        extra["update"] = True
    shown.publish_display_data(message.get("data") or {}, message.get("metadata") or {}, **extra)


class CellStream:
    """``sys.stdout``/``sys.stderr`` of the kernel while a cell's task is submitted (see
    the module docstring)."""

    #: Read by ``OutputTarget.capture``: the cell's last line stays open when its task ends,
    #: as a local cell's does (``print(i, end=' ')``); the next cell's output is its own.
    keeps_last_line_open = True

    def __init__(self, stream: TextIO, task_name: str, nonce: str | None = None) -> None:
        self._stream = stream
        self._nonce = nonce
        self._prefix = re.compile(
            rf"(^|\r)\({re.escape(task_name)}(?: node=\S+)?(?: pid=\d+)?\) ", re.M
        )
        self._held = ""
        #: Display messages to show after the cell's result (figures left open).
        self.post: list[dict[str, Any]] = []

    def write(self, text: str) -> int:
        text = self._prefix.sub(r"\1", text)
        if self._nonce is None:
            return self._stream.write(text)
        buffer, self._held = self._held + text, ""
        while buffer:
            start = buffer.find(MARK)
            if start < 0:
                keep = _partial_mark(buffer)
                self._out(buffer[: len(buffer) - keep])
                self._held = buffer[len(buffer) - keep :]
                break
            self._out(buffer[:start])
            end = buffer.find(END, start)
            if end < 0:
                self._held = buffer[start:]
                break
            self._message(buffer[start + len(MARK) : end])
            buffer = buffer[end + len(END) :]
            if buffer.startswith("\n"):
                buffer = buffer[1:]
        return len(text)

    def _out(self, text: str) -> None:
        if text:
            self._stream.write(text)

    def _message(self, body: str) -> None:
        nonce, _, payload = body.partition(";")
        if nonce != self._nonce:  # not ours: the cell printed something that looks like it
            self._out(MARK + body + END)
            return
        try:
            message = json.loads(payload)
        except ValueError:
            return
        if message.get("post"):
            self.post.append(message)
            return
        self._stream.flush()
        publish(message)

    def finish(self) -> None:
        """The cell is over: text held back is written, a message cut short dropped."""
        held, self._held = self._held, ""
        if held and not held.startswith(MARK):
            self._stream.write(held)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _partial_mark(text: str) -> int:
    """How many characters at the end of ``text`` may begin a message marker."""
    for size in range(min(len(MARK) - 1, len(text)), 0, -1):
        if MARK.startswith(text[-size:]):
            return size
    return 0


def figure_settings(shell: Any) -> dict[str, Any]:
    """The kernel's inline-figure settings (formats, ``print_figure_kwargs``, whether
    figures close after a cell, rc), read without importing matplotlib: the live
    ``InlineBackend`` if matplotlib-inline is loaded, else its configuration."""
    backend = sys.modules.get("matplotlib_inline.config")
    if backend is not None:
        cfg = backend.InlineBackend.instance()
        return {
            "formats": sorted(cfg.figure_formats),
            "print_kwargs": dict(cfg.print_figure_kwargs),
            "close": bool(cfg.close_figures),
            "rc": dict(cfg.rc),
        }
    config = getattr(getattr(shell, "config", None), "InlineBackend", None) or {}
    formats = config.get("figure_formats") or ["png"]
    kwargs = {"bbox_inches": "tight", **(config.get("print_figure_kwargs") or {})}
    return {
        "formats": sorted(formats),
        "print_kwargs": kwargs,
        "close": bool(config.get("close_figures", True)),
        "rc": dict(config.get("rc") or {}),
    }


def kernel_style() -> dict[str, Any] | None:
    """The notebook's own matplotlib style: the ``rcParams`` that differ from matplotlib's
    defaults (``plt.style.use``, ``rcParams[...] =``, ``sns.set()`` in a notebook cell), or
    ``None`` when the kernel has not imported matplotlib. A remote cell's worker takes it
    when it changed since that worker last took it (``_cell_figures.apply_style``)."""
    matplotlib = sys.modules.get("matplotlib")
    params = getattr(matplotlib, "rcParams", None)
    original = getattr(matplotlib, "rcParamsOrig", None)
    if params is None or original is None:
        return None
    style = {}
    for key in params:
        if key in NOT_STYLE:
            continue
        value = params[key]
        try:
            same = bool(value == original[key])
        except Exception:  # a value that does not compare: take it as changed
            same = False
        if not same:
            style[key] = value
    return style


#: Style settings remote cells changed while the kernel had no matplotlib (oldest first).
_pending_styles: list[bytes] = []


def take_style(changes: bytes | None) -> None:
    """The matplotlib settings a remote cell changed (``_cell_figures.style_changes``) are
    the newest: the kernel's own figures draw with them too, as if the cell had run here. A
    kernel that has not imported matplotlib takes them once it has (``None``: only that)."""
    if changes:
        _pending_styles.append(changes)
    params = getattr(sys.modules.get("matplotlib"), "rcParams", None)
    if params is None or not _pending_styles:
        return
    import pickle
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while _pending_styles:
            try:
                settings = pickle.loads(_pending_styles.pop(0))
            except Exception:  # made by another matplotlib: the kernel keeps its own
                continue
            for key, value in settings.items():
                try:  # noqa: SIM105 - one this matplotlib refuses is passed over
                    params[key] = value
                except (KeyError, ValueError, TypeError):
                    pass


@contextmanager
def cell_streams(nonce: str, task: str) -> Iterator[tuple[CellStream, CellStream]]:
    """While a cell's task (named ``task``) is submitted, ``sys.stdout``/``stderr`` are
    ``CellStream``s: the task's output target captures them there (``OutputTarget.capture``)."""
    saved = sys.stdout, sys.stderr
    out, err = CellStream(saved[0], task, nonce), CellStream(saved[1], task)
    sys.stdout, sys.stderr = out, err
    try:
        yield out, err
    finally:
        sys.stdout, sys.stderr = saved
