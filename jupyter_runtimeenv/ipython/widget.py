"""``BuildStatusWidget``: an environment build shown live in the cell that asked for it.

Who calls it: ``%runtime_env`` (``magics.py``) when the kernel's frontend can show widgets;
``progress.build_now`` feeds it. With the embedded agent it gets the agent's events
(``handle``), drained on the thread that runs the cell; with the server's agent it gets
polled snapshots of ``GET envs/{id}`` and the build log (``apply_status``). Either way
``refresh`` pushes the new state to the frontend at most every ``REFRESH_SECONDS``, so an
installer printing thousands of lines costs a handful of comm messages.

The text/plain form (``text()``) is what a text-only frontend shows, e.g. the headless
quickstart: the header, the steps with their final status, and the installer output's tail,
written like the text progress of ``--no-widget``.

Rendering: steps by their label (what they install or hold); state marks are plain text
glyphs every text font has (no emoji); the output box is hidden while empty and, being a
``column-reverse`` flex box, stays scrolled to its end with CSS alone; colours are the
theme's CSS variables, so dark themes read too.
"""

from __future__ import annotations

import html
import json
import re
import time
from collections import deque
from typing import Any

import ipywidgets

from ..agent.events import Event
from .progress import INTERRUPTED, format_event, step_label

__all__ = ["BuildStatusWidget", "widgets_available"]

#: Lines of installer output the widget keeps (and shows).
TAIL_LINES = 200
#: The least time between two pushes of the output text to the frontend.
REFRESH_SECONDS = 0.1

#: status -> (mark, colour): text glyphs (U+2713, U+2717, U+25CF) found in every text font.
_MARKS = {
    "running": ("&#9679;", "var(--jp-warn-color0, #b60)"),
    "done": ("&#10003;", "var(--jp-success-color0, green)"),
    "cached": ("&#10003;", "var(--jp-ui-font-color2, gray)"),
    "failed": ("&#10007;", "var(--jp-error-color0, #c00)"),
    "cancelled": ("&#8211;", "var(--jp-ui-font-color2, gray)"),
}
_COLORS = {
    "READY": "var(--jp-success-color0, green)",
    "FAILED": "var(--jp-error-color0, #c00)",
    "BUILDING": "var(--jp-warn-color0, #b60)",
    "PENDING": "var(--jp-ui-font-color2, gray)",
    INTERRUPTED: "var(--jp-ui-font-color2, gray)",
}
#: What an interrupted build's widget says under its steps (their marks are as last seen).
_LEFT = "the cell stopped waiting here; the build goes on in the background"
#: The output box: at most 12 lines high, scrolled to its end by ``column-reverse``.
_LOG_STYLE = (
    "max-height:14em;overflow:auto;display:flex;flex-direction:column-reverse;"
    "border:1px solid var(--jp-border-color2, #ddd);border-radius:2px;"
    "background:var(--jp-layout-color2, #f5f5f5);padding:2px 6px;margin-top:4px;"
    "box-sizing:border-box"
)
_PRE_STYLE = (
    # flex:none: JupyterLab gives pre overflow:auto, which would let it shrink into a
    # scroller of its own, scrolled to its top.
    "margin:0;flex:none;overflow:visible;"
    "font-family:var(--jp-code-font-family, monospace);font-size:12px;"
    "line-height:1.35;white-space:pre-wrap;word-break:break-all;"
    "color:var(--jp-content-font-color1, inherit);background:none"
)


def widgets_available(shell: Any) -> bool:
    """True in an ipykernel kernel (a frontend that may show widgets) with ipywidgets."""
    if type(shell).__name__ != "ZMQInteractiveShell" or getattr(shell, "kernel", None) is None:
        return False
    try:
        import comm

        return callable(comm.create_comm)
    except ImportError:  # pragma: no cover - ipykernel depends on comm
        return False


class BuildStatusWidget:
    """Header, steps and installer output of one env's build, as ipywidgets.

    Composition rather than a ``VBox`` subclass (ipywidgets is untyped); display the object
    itself, or put ``.box`` into a layout.
    """

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id
        self.state = "PENDING"
        #: step name -> the agent's step entry (status, started, ended, ...).
        self.steps: dict[str, dict[str, Any]] = {}
        self.lines: deque[str] = deque(maxlen=TAIL_LINES)
        self.error: dict[str, Any] | None = None
        #: The build went through BUILDING here (not served from a cache).
        self.built = False
        #: Show "View log" (the JupyterLab extension's ``runtimeenv:view-log`` command): set
        #: by the owner when the env is built by the Jupyter server's agent, whose log the
        #: extension can read.
        self.view_log = False
        self._started = time.monotonic()
        self._seconds: float | None = None
        self._pushed = 0.0
        #: The text the output box shows (the ``HTML`` widget holds it escaped).
        self.log_text = ""
        self.header = ipywidgets.HTML()
        self.table = ipywidgets.HTML()
        #: The installer output's tail, as HTML (hidden while there is none).
        self.output = ipywidgets.HTML(layout=ipywidgets.Layout(width="100%", display="none"))
        self.box = ipywidgets.VBox([self.header, self.table, self.output])
        self.refresh(force=True)

    # -- input ----------------------------------------------------------------------------

    def handle(self, event: Event) -> None:
        """Take one agent event (state, step or log) of this env; others are ignored."""
        if event.env_id != self.env_id:
            return
        data = event.data
        if event.kind == "state":
            self.state = str(data["state"])
            self.built = self.built or self.state == "BUILDING"
            if data.get("error"):
                self._set_error(dict(data["error"]))
        elif event.kind == "step":
            entry = {k: v for k, v in data.items() if k != "step"}
            self.steps.setdefault(str(data["step"]), {}).update(entry)
        elif event.kind == "log":
            self.lines.append(str(data["line"]))
        self.refresh()

    def apply_status(self, env: dict[str, Any], log: str) -> None:
        """Take a snapshot: an env as ``GET envs/{id}`` answers and its build log's text."""
        self.state = str(env.get("state", self.state))
        self.built = self.built or self.state == "BUILDING" or bool(env.get("steps"))
        self.steps = {name: dict(entry) for name, entry in (env.get("steps") or {}).items()}
        self.lines = deque(log.splitlines()[-TAIL_LINES:], maxlen=TAIL_LINES)
        if env.get("error"):
            self._set_error(dict(env["error"]))
        self.refresh(force=True)  # snapshots come every 0.3 s: each one is pushed

    def finish(self, state: str, seconds: float, error: dict[str, Any] | None = None) -> None:
        """The build's outcome, as the caller saw it; pushes everything to the frontend."""
        self.state = state
        self._seconds = seconds
        if error is not None:
            self._set_error(error)
        self.refresh(force=True)

    def _set_error(self, error: dict[str, Any]) -> None:
        self.error = error
        if not self.lines:  # no output seen (e.g. a failure remembered by the agent)
            self.lines.extend(str(line) for line in error.get("output_tail") or [])

    # -- output ---------------------------------------------------------------------------

    @property
    def seconds(self) -> float:
        if self._seconds is not None:
            return self._seconds
        return time.monotonic() - self._started

    def refresh(self, *, force: bool = False) -> None:
        """Push the state to the widgets: at once if ``force``, else at most every 0.1 s."""
        now = time.monotonic()
        if not force and now - self._pushed < REFRESH_SECONDS:
            return
        self._pushed = now
        color = _COLORS.get(self.state, "inherit")
        error = self.error or {}
        step = html.escape(str(error.get("label") or error.get("step") or ""))
        where = f" at <code>{step}</code>" if step and self.state == "FAILED" else ""
        header = (
            f"<b>runtime env <code>{self.env_id[:12]}</code></b> &mdash; "
            f'<b style="color:{color}">{self.state}</b>{where} ({self.seconds:.1f} s)'
            f"{self._log_link()}"
        )
        if self.header.value != header:
            self.header.value = header
        table = self._table_html()
        if self.table.value != table:
            self.table.value = table
        text = "\n".join(self.lines)
        if self.log_text != text:
            self.log_text = text
            pre = f'<pre style="{_PRE_STYLE}">{html.escape(text)}</pre>'
            self.output.value = f'<div style="{_LOG_STYLE}">{pre}</div>'
            self.output.layout.display = None if text else "none"

    def _log_link(self) -> str:
        if not self.view_log:
            return ""
        # JupyterLab's command linker runs the command on a click anywhere in the page.
        args = html.escape(json.dumps({"env_id": self.env_id}), quote=True)
        return (
            ' &middot; <a href="#" data-commandlinker-command="runtimeenv:view-log"'
            f' data-commandlinker-args="{args}" title="Open the whole build log"'
            ' style="color:var(--jp-content-link-color, #1976d2)">View log</a>'
        )

    def _table_html(self) -> str:
        rows = []
        for name, entry in self.steps.items():
            status = str(entry.get("status", ""))
            mark, color = _MARKS.get(status, ("", "inherit"))
            seconds = _duration(entry)
            label = step_label({**entry, "step": name})
            rows.append(
                "<tr>"
                f'<td style="{_CELL};color:{color};font-weight:bold">{mark}</td>'
                f'<td style="{_CELL}" title="{html.escape(name)}">'
                f"<code>{html.escape(label)}</code></td>"
                f'<td style="{_CELL};color:{color}">{html.escape(status)}</td>'
                f'<td style="{_CELL}">{"" if seconds is None else f"{seconds:.1f} s"}</td>'
                "</tr>"
            )
        error = ""
        message = self._unshown_message()
        if message:
            error = f'<div style="color:var(--jp-error-color0, #c00)">{html.escape(message)}</div>'
        elif self.state == INTERRUPTED:
            error = f'<div style="color:{_COLORS[INTERRUPTED]}">{_LEFT}</div>'

        table = '<table style="border-collapse:collapse">'
        return f"{table}{''.join(rows)}</table>{error}" if rows or error else ""

    def _unshown_message(self) -> str:
        """The failure's message, unless the output tail already says it (an installer's
        error is its last lines): a failure is told once."""
        if not self.error:
            return ""
        message = str(self.error.get("message", ""))
        for line in self.lines:
            said = _STEP_PREFIX.sub("", line).strip()
            if len(said) > 8 and said in message:
                return ""
        return message

    def text(self) -> str:
        """The text/plain form: header, steps, error and output tail, one per line."""
        out = [f"building runtime env {self.env_id[:12]}"] if self.built else []
        for name, entry in self.steps.items():
            line = format_event(Event("step", self.env_id, {**entry, "step": name}))
            if line is not None:
                out.append(line)
        out.extend(f"    {line}" for line in self.lines)
        if self.error:
            step = self.error.get("label") or self.error.get("step")
            message = self._unshown_message()
            out.append(
                f"  failed{f' step {step}' if step else ''}{f': {message}' if message else ''}"
            )
        if self.state == INTERRUPTED:
            out.append(f"  {_LEFT}")
        out.append(f"runtime env {self.env_id[:12]} — {self.state} ({self.seconds:.1f} s)")
        return "\n".join(out)

    def __repr__(self) -> str:
        return self.text()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle: dict[str, Any] = dict(self.box._repr_mimebundle_(**kwargs))
        bundle["text/plain"] = self.text()
        return bundle

    def finalize(self, handle: Any) -> None:
        """Replace the displayed widget (``handle``) by its static HTML and text, so that the
        finished build stays readable in a saved notebook (``static.py``). Called by its
        owner once the build ended."""
        from .static import finalize

        finalize(handle, self.box, self.text())

    def close(self) -> None:
        """Close the widgets' comms (the frontend drops the view)."""
        self.box.close()
        for child in (self.header, self.table, self.output):
            child.close()


_STEP_PREFIX = re.compile(r"^\[[^\]]*\] ")
# text-align: the static copy of a finished widget sits in JupyterLab's rendered HTML, whose
# table cells align right.
_CELL = "padding:1px 6px;line-height:1.3;text-align:left"


def _duration(entry: dict[str, Any]) -> float | None:
    started, ended = entry.get("started"), entry.get("ended")
    if isinstance(started, (int, float)) and isinstance(ended, (int, float)):
        return max(0.0, float(ended) - float(started))
    return None
