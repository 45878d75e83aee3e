"""``%runtime_env`` on a cluster: the env built on every node at once, one row per node.

Who calls it: the ``%runtime_env`` magic (``magics.py``) when the session's executor is a
``ClusterExecutor`` (a Dask executor). The executor stages and builds on every current node
(``build_on_nodes``, in a thread of ours) and feeds a ``NodeRows`` from its own threads; the
cell's thread drains it every ``REFRESH_SECONDS`` and shows it:

- in a ``ClusterBuildWidget`` (a kernel whose frontend shows widgets): a header, one row
  per node (address, state, current step and its time, the node's time) and, for a node
  that failed, its step, message and installer tail;
- as text lines otherwise (``--no-widget``, headless): each node's steps and installer
  lines as they come, prefixed with the node, then one line per node naming its address,
  then the summary ``runtime env <id> ready on N/N nodes (<seconds> s)``.

A failure on any node is one ``UsageError`` line naming the node and the step; the caller
leaves the default unchanged. An interrupt stops the waiting, not the nodes' builds (as a
local build, which the agent finishes for whoever asks next).
"""

from __future__ import annotations

import concurrent.futures
import html
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, TextIO

from IPython.core.error import UsageError

from ..agent.events import Event
from ..spec import RuntimeEnvSpec
from ..workers.cluster import ClusterBuild, ClusterExecutor, NodeBuild
from .progress import format_event

__all__ = ["ClusterBuildWidget", "NodeRows", "build_on_cluster", "cluster_states"]

#: How often the cell's thread shows what the nodes did.
REFRESH_SECONDS = 0.1
#: Events kept between two refreshes (a flood of installer lines keeps its tail).
MAX_QUEUED = 5000

_COLORS = {
    "READY": "var(--jp-success-color0, green)",
    "FAILED": "var(--jp-error-color0, #c00)",
    "BUILDING": "var(--jp-warn-color0, #b60)",
    "STAGING": "var(--jp-ui-font-color2, gray)",
    "PENDING": "var(--jp-ui-font-color2, gray)",
}
_MARKS = {"READY": "&#10003;", "FAILED": "&#10007;", "BUILDING": "&#9679;"}
# text-align: a finished widget's static copy sits in JupyterLab's rendered HTML, whose table
# cells align right.
_CELL = "padding:1px 8px 1px 0;line-height:1.3;white-space:nowrap;text-align:left"
_LOG_STYLE = (
    "max-height:10em;overflow:auto;display:flex;flex-direction:column-reverse;"
    "border:1px solid var(--jp-border-color2, #ddd);border-radius:2px;"
    "background:var(--jp-layout-color2, #f5f5f5);padding:2px 6px;margin:2px 0 6px 0"
)
_PRE_STYLE = (
    "margin:0;flex:none;overflow:visible;font-family:var(--jp-code-font-family, monospace);"
    "font-size:12px;line-height:1.35;white-space:pre-wrap;word-break:break-all;background:none"
)


class NodeRows:
    """The ``NodeView`` handed to the executor: records what it says, from any thread;
    ``drain`` hands it to the thread that shows it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.env_id = ""
        self.rows: list[NodeBuild] = []
        self._events: deque[tuple[str, dict[str, Any] | None]] = deque(maxlen=MAX_QUEUED)

    def nodes(self, env_id: str, rows: Sequence[NodeBuild]) -> None:
        with self._lock:
            self.env_id = env_id
            self.rows = list(rows)

    def update(self, row: NodeBuild, event: dict[str, Any] | None) -> None:
        with self._lock:
            self._events.append((row.address, event))

    def drain(self) -> list[tuple[str, dict[str, Any] | None]]:
        with self._lock:
            out = list(self._events)
            self._events.clear()
        return out


def host_of(address: str) -> str:
    return address.split("://", 1)[-1]


def node_line(row: NodeBuild) -> str:
    """One node's outcome as the text form says it: its address first."""
    seconds = f"({row.elapsed:.2f} s)"
    if row.state == "READY":
        return f"{row.address}  READY  env {row.env_id[:12]} {seconds}"
    if row.state == "FAILED":
        error = row.error or {}
        step = f" at step {row.step}" if row.step else ""
        message = _first_line(str(error.get("message", "")))
        return f"{row.address}  FAILED{step}: {message} {seconds}"
    return f"{row.address}  {row.state}{f' ({row.step})' if row.step else ''} {seconds}"


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


class TextRows:
    """The text form: each node's steps and lines as they come, prefixed with the node."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def show(self, rows: NodeRows, events: list[tuple[str, dict[str, Any] | None]]) -> None:
        for address, event in events:
            if event is None:
                continue
            data = {k: v for k, v in event.items() if k not in ("kind", "env_id", "time")}
            kind = event.get("kind")
            if kind not in ("state", "step", "log"):
                continue
            line = format_event(Event(kind, str(event.get("env_id", "")), data))
            if line is not None:
                print(f"[{host_of(address)}] {line}", file=self.out, flush=True)

    def finish(self, rows: NodeRows, result: ClusterBuild | None) -> None:
        for row in rows.rows:
            print(node_line(row), file=self.out, flush=True)


class ClusterBuildWidget:
    """Header, one row per node, and each failed node's error and installer tail, as
    ipywidgets (composition: display the object, or put ``.box`` into a layout)."""

    def __init__(self) -> None:
        import ipywidgets

        self.env_id = ""
        self.rows: list[NodeBuild] = []
        self.state = "STAGING"
        self._started = time.monotonic()
        self._seconds: float | None = None
        self.header = ipywidgets.HTML()
        self.table = ipywidgets.HTML()
        self.failures = ipywidgets.HTML()
        self.box = ipywidgets.VBox([self.header, self.table, self.failures])
        self.refresh()

    @property
    def seconds(self) -> float:
        return self._seconds if self._seconds is not None else time.monotonic() - self._started

    def show(self, rows: NodeRows, events: list[tuple[str, dict[str, Any] | None]]) -> None:
        self.env_id = rows.env_id
        self.rows = list(rows.rows)
        if self.rows and self.state == "STAGING":
            self.state = "BUILDING"
        self.refresh()

    def finish(self, rows: NodeRows, result: ClusterBuild | None) -> None:
        self.env_id = rows.env_id or self.env_id
        self.rows = list(rows.rows)
        self._seconds = result.seconds if result is not None else self.seconds
        failed = [r for r in self.rows if r.state != "READY"]
        self.state = "FAILED" if failed or result is None else "READY"
        self.refresh()

    def summary(self) -> str:
        ready = sum(1 for r in self.rows if r.state == "READY")
        if self.state == "READY":
            return f"READY on {ready}/{len(self.rows)} nodes"
        if self.state == "FAILED":
            return f"FAILED on {len(self.rows) - ready} of {len(self.rows)} nodes"
        return f"{self.state} on {len(self.rows)} nodes" if self.rows else self.state

    def refresh(self) -> None:
        color = _COLORS.get(self.state, "inherit")
        header = (
            f"<b>runtime env <code>{html.escape(self.env_id[:12])}</code></b> &mdash; "
            f'<b style="color:{color}">{html.escape(self.summary())}</b>'
            f" ({self.seconds:.1f} s)"
        )
        if self.header.value != header:
            self.header.value = header
        table = self._table()
        if self.table.value != table:
            self.table.value = table
        failures = self._failures()
        if self.failures.value != failures:
            self.failures.value = failures

    def _table(self) -> str:
        out = []
        now = time.time()
        for row in self.rows:
            color = _COLORS.get(row.state, "inherit")
            mark = _MARKS.get(row.state, "&#8211;")
            step_time = ""
            if row.step_started is not None and row.state == "BUILDING":
                step_time = f"{max(0.0, now - row.step_started):.1f} s"
            step = html.escape(row.step)
            out.append(
                "<tr>"
                f'<td style="{_CELL};color:{color};font-weight:bold">{mark}</td>'
                f'<td style="{_CELL}"><code>{html.escape(row.address)}</code></td>'
                f'<td style="{_CELL};color:{color}">{html.escape(row.state)}</td>'
                f'<td style="{_CELL}"><code>{step}</code></td>'
                f'<td style="{_CELL}">{step_time}</td>'
                f'<td style="{_CELL}">{row.elapsed:.1f} s</td>'
                "</tr>"
            )
        return f'<table style="border-collapse:collapse">{"".join(out)}</table>' if out else ""

    def _failures(self) -> str:
        out = []
        for row in self.rows:
            if row.state != "FAILED":
                continue
            error = row.error or {}
            where = f" at step <code>{html.escape(row.step)}</code>" if row.step else ""
            message = html.escape(_first_line(str(error.get("message", ""))))
            out.append(
                f'<div style="color:var(--jp-error-color0, #c00)">'
                f"<code>{html.escape(row.address)}</code> failed{where}: {message}</div>"
            )
            if row.lines:
                tail = html.escape("\n".join(row.lines))
                out.append(
                    f'<div style="{_LOG_STYLE}"><pre style="{_PRE_STYLE}">{tail}</pre></div>'
                )
        return "".join(out)

    def text(self) -> str:
        """The text/plain form: one line per node, then the summary."""
        lines = [node_line(row) for row in self.rows]
        lines.append(f"runtime env {self.env_id[:12]} — {self.summary()} ({self.seconds:.1f} s)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle: dict[str, Any] = dict(self.box._repr_mimebundle_(**kwargs))
        bundle["text/plain"] = self.text()
        return bundle

    def close(self) -> None:
        self.box.close()
        for child in (self.header, self.table, self.failures):
            child.close()


def build_on_cluster(
    executor: ClusterExecutor,
    spec: RuntimeEnvSpec,
    name: str | None,
    *,
    widget: bool,
    background: bool = False,
    out: TextIO | None = None,
) -> ClusterBuild | None:
    """Build ``spec`` on every node of ``executor``'s cluster, showing each node; the result
    (``None`` with ``background``: the build goes on, shown live in the widget if any).
    ``UsageError`` (one line naming the node and step) when a node fails."""
    stream = out or sys.stdout
    rows = NodeRows()
    shown: Any
    handle: Any = None
    if widget:
        import IPython.display

        shown = ClusterBuildWidget()
        display: Any = IPython.display.display  # untyped
        handle = display(shown, display_id=True)
    else:
        shown = TextRows(stream)
    future: concurrent.futures.Future[ClusterBuild] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(executor.build_on_nodes(spec, rows))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name="runtime-env-cluster-build", daemon=True).start()

    def follow() -> ClusterBuild | None:
        result: ClusterBuild | None = None
        try:
            while True:
                try:
                    result = future.result(timeout=REFRESH_SECONDS)
                    break
                except concurrent.futures.TimeoutError:
                    shown.show(rows, rows.drain())
        finally:
            if future.done():  # not on an interrupt: the build goes on without us
                shown.show(rows, rows.drain())
                shown.finish(rows, result)
                if handle is not None:
                    from .static import finalize

                    # Readable without the kernel (saved notebooks): static HTML + text.
                    finalize(handle, shown.box, shown.text())
        return result

    if background:
        if widget:
            threading.Thread(target=_quietly, args=(follow,), daemon=True).start()
        print(
            f"building runtime env {spec.env_id[:12]} on the cluster's nodes in the background;"
            " the first task in it waits for it",
            file=stream,
        )
        return None
    result = follow()
    if result is None:
        return None
    failed = result.failed
    if failed:
        raise UsageError(_failed_line(failed, name, len(result.rows)))
    print(result.line(), file=stream, flush=True)
    return result


def _quietly(call: Any) -> None:
    try:
        call()
    except BaseException:  # shown in the widget; the first task raises it too
        return


def _failed_line(failed: list[NodeBuild], name: str | None, total: int) -> str:
    """One line: the first failed node, its step and message, how many more failed."""
    from .progress import kept

    row = failed[0]
    error = row.error or {}
    step = f" at step {row.step}" if row.step else ""
    message = _first_line(str(error.get("message", "")))
    # The node's own message repeats its address ("on Dask worker tcp://..."): say it once.
    message = message.replace(f"on Dask worker {row.address}: ", "")
    more = f"; {len(failed) - 1} more of {total} nodes failed" if len(failed) > 1 else ""
    log = ""
    if error.get("log_path"):  # a command, not a path JupyterLab would link to this machine
        env_id = str(error.get("env_id") or "")
        log = (
            f"; its log: jupyter runtimeenv logs {env_id[:12]} on that node"
            if env_id
            else f"; the log on that node: {error['log_path']}"
        )
    return f"runtime_env: build failed on {row.address}{step}: {message} ({kept(name)}{more}{log})"


def cluster_states(executor: ClusterExecutor, spec: RuntimeEnvSpec) -> str:
    """``%runtime_env --list``'s state of an env on the cluster: ``READY on 2/2 nodes``."""
    try:
        states = executor.states_on_nodes(spec)
    except Exception as exc:  # the cluster cannot be asked now
        return f"unknown ({type(exc).__name__})"
    if not states:
        return "not built"
    counts: dict[str, int] = {}
    for state in states.values():
        counts[state] = counts.get(state, 0) + 1
    total = len(states)
    return ", ".join(f"{state} on {n}/{total} nodes" for state, n in sorted(counts.items()))
