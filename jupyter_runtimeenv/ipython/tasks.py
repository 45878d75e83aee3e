"""Task progress: ``jupyter_runtimeenv.progress(futures)`` and ``wait(..., progress=True)``.

Who calls it: users, and ``api.wait`` when asked for progress. ``TaskProgress``
counts a list of futures (done, failed, running, queued; elapsed; rate) and shows them as a
``TaskProgressWidget`` (a bar and a line, in a kernel) or one text line rewritten in place
with ``\\r`` (a terminal), or just the final line (output that is not a terminal). It is
updated by the waiting thread between its waits, every ``REFRESH_SECONDS`` at most: the
wait itself is ``concurrent.futures.wait``, as in the plain ``wait``, so the kernel's event
loop is blocked no more than by ``wait`` (the cell runs on it either way).

An interrupt (``KeyboardInterrupt``) cancels the futures not yet done, which kills the
workers running them, and raises ``RemoteInterrupt`` (``workers.interrupt``), as ``wait``.

Futures of a cluster (``ClusterFuture``: a Dask executor's) are also counted per node: their
executor says where each runs or ran (``locate``: one scheduler round trip per refresh,
only while some run), and the widget shows a row per node under the bar (the text form a
line per node after the total).
"""

from __future__ import annotations

import concurrent.futures
import html
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from ..workers.cluster import ClusterFuture
from ..workers.interrupt import interrupted

__all__ = ["Counts", "NodeCounts", "TaskProgress", "progress"]

#: The least time between two refreshes of the view.
REFRESH_SECONDS = 0.2

_SEGMENTS = (
    ("done", "var(--jp-success-color1, #4caf50)"),
    ("failed", "var(--jp-error-color1, #e53935)"),
    ("running", "var(--jp-warn-color1, #fb8c00)"),
    ("queued", "var(--jp-layout-color3, #bdbdbd)"),
)


@dataclass(frozen=True)
class NodeCounts:
    """The futures that ran or run on one node."""

    node: str
    done: int = 0
    failed: int = 0
    running: int = 0

    def line(self) -> str:
        host = self.node.split("://", 1)[-1]
        return f"  {host}: {self.done} done, {self.failed} failed, {self.running} running"


@dataclass(frozen=True)
class Counts:
    total: int
    done: int
    failed: int
    running: int
    queued: int
    elapsed: float
    #: Per node, for futures of a cluster (empty otherwise), by node address.
    nodes: tuple[NodeCounts, ...] = ()

    @property
    def finished(self) -> int:
        return self.done + self.failed

    @property
    def rate(self) -> float:
        return self.finished / self.elapsed if self.elapsed > 0 else 0.0

    def line(self) -> str:
        return (
            f"tasks: {self.finished}/{self.total} finished ({self.done} done,"
            f" {self.failed} failed, {self.running} running, {self.queued} queued)"
            f" in {self.elapsed:.1f} s, {self.rate:.1f}/s"
        )


def count(
    futures: Sequence[concurrent.futures.Future[Any]],
    started: float,
    placed: dict[int, str] | None = None,
) -> Counts:
    """The counts of ``futures``; ``placed`` (``id(future)`` -> node) adds per-node counts."""
    done = failed = running = 0
    nodes: dict[str, list[int]] = {}
    for future in futures:
        slot = 3
        if future.done():
            if future.cancelled() or future.exception() is not None:
                failed += 1
                slot = 1
            else:
                done += 1
                slot = 0
        elif future.running():
            running += 1
            slot = 2
        node = placed.get(id(future)) if placed else None
        if node is not None and slot < 3:
            nodes.setdefault(node, [0, 0, 0])[slot] += 1
    queued = len(futures) - done - failed - running
    per_node = tuple(NodeCounts(node, *nodes[node]) for node in sorted(nodes))
    return Counts(len(futures), done, failed, running, queued, time.monotonic() - started, per_node)


class TaskProgressWidget:
    """A stacked bar (done, failed, running, queued) and the counts' line, as ipywidgets."""

    def __init__(self) -> None:
        import ipywidgets

        self.html = ipywidgets.HTML()
        self.counts: Counts | None = None

    def show(self, counts: Counts) -> None:
        self.counts = counts
        total = max(1, counts.total)
        bars = "".join(
            f'<div title="{name}: {getattr(counts, name)}" style="width:'
            f'{100 * getattr(counts, name) / total:.2f}%;background:{color}"></div>'
            for name, color in _SEGMENTS
            if getattr(counts, name)
        )
        value = (
            '<div style="display:flex;height:10px;width:100%;max-width:40em;border-radius:2px;'
            f'overflow:hidden;background:var(--jp-layout-color2, #eee)">{bars}</div>'
            '<div style="font-family:var(--jp-code-font-family, monospace);font-size:12px">'
            f"{html.escape(counts.line())}</div>"
            f"{_node_table(counts.nodes)}"
        )
        if self.html.value != value:
            self.html.value = value

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle: dict[str, Any] = dict(self.html._repr_mimebundle_(**kwargs))
        bundle["text/plain"] = text_of(self.counts) if self.counts else "tasks: starting"
        return bundle

    def close(self) -> None:
        self.html.close()


def text_of(counts: Counts) -> str:
    """The total's line, then a line per node (for futures of a cluster)."""
    return "\n".join([counts.line(), *(node.line() for node in counts.nodes)])


def _node_table(nodes: tuple[NodeCounts, ...]) -> str:
    """A row per node: its address, a small bar of its done/failed/running, the numbers."""
    if not nodes:
        return ""
    cell = "padding:0 8px 0 0;white-space:nowrap"
    most = max(1, max(n.done + n.failed + n.running for n in nodes))
    rows = []
    for node in nodes:
        bars = "".join(
            f'<div title="{name}: {getattr(node, name)}" style="width:'
            f'{100 * getattr(node, name) / most:.2f}%;background:{color}"></div>'
            for name, color in _SEGMENTS
            if name != "queued" and getattr(node, name)
        )
        bar = (
            '<div style="display:flex;height:6px;width:12em;border-radius:2px;overflow:hidden;'
            f'background:var(--jp-layout-color2, #eee)">{bars}</div>'
        )
        rows.append(
            f'<tr><td style="{cell}"><code>{html.escape(node.node)}</code></td>'
            f'<td style="{cell}">{bar}</td>'
            f'<td style="{cell}">{node.done} done, {node.failed} failed,'
            f" {node.running} running</td></tr>"
        )
    return (
        '<table style="border-collapse:collapse;margin-top:2px;'
        'font-family:var(--jp-code-font-family, monospace);font-size:12px">'
        f"{''.join(rows)}</table>"
    )


class TaskProgress:
    """Counts ``futures`` and shows them; ``update`` refreshes, ``close`` shows the end."""

    def __init__(
        self,
        futures: Iterable[concurrent.futures.Future[Any]],
        *,
        widget: bool | None = None,
        out: TextIO | None = None,
    ) -> None:
        self.futures = list(futures)
        self.started = time.monotonic()
        #: The executors of the futures that run on nodes (each asked where they run).
        self._clusters = list(
            {
                id(f.executor): f.executor for f in self.futures if isinstance(f, ClusterFuture)
            }.values()
        )
        self._out = out or sys.stdout
        self._shown = 0.0
        self._widget: TaskProgressWidget | None = None
        self._handle: Any = None
        if widget is None:
            widget = _in_widget_kernel()
        if widget:
            import IPython.display

            self._widget = TaskProgressWidget()
            self._widget.show(self.counts())
            display: Any = IPython.display.display  # untyped
            self._handle = display(self._widget, display_id=True)
        self._live = self._widget is None and _isatty(self._out)

    def counts(self) -> Counts:
        placed: dict[int, str] = {}
        for executor in self._clusters:
            try:
                placed.update(executor.locate(self.futures))
            except Exception:  # the cluster cannot be asked now: counted in total only
                continue
        return count(self.futures, self.started, placed)

    def update(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._shown < REFRESH_SECONDS:
            return
        self._shown = now
        counts = self.counts()
        if self._widget is not None:
            self._widget.show(counts)
        elif self._live:
            self._out.write(f"\r{counts.line()}")
            self._out.flush()

    def close(self) -> None:
        """Show the final counts (and end the text line)."""
        counts = self.counts()
        if self._widget is not None:
            self._widget.show(counts)
            from .static import finalize

            # The bar stays readable without the kernel (saved notebooks): static HTML + text.
            finalize(self._handle, self._widget.html, text_of(counts))
        else:
            text = text_of(counts)
            self._out.write(f"\r{text}\n" if self._live else f"{text}\n")
            self._out.flush()

    def wait(self, until: int, timeout: float | None = None) -> None:
        """Wait until ``until`` futures are done or ``timeout`` passes, refreshing the view;
        an interrupt cancels the futures not done and is raised again."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while sum(f.done() for f in self.futures) < until:
                step = REFRESH_SECONDS
                if deadline is not None:
                    step = min(step, deadline - time.monotonic())
                    if step <= 0:
                        break
                pending = [f for f in self.futures if not f.done()]
                concurrent.futures.wait(
                    pending, step, return_when=concurrent.futures.FIRST_COMPLETED
                )
                self.update()
        except KeyboardInterrupt as caught:
            # Cancelled like ``wait`` does: a running task's worker is killed.
            raise interrupted(self.futures, caught) from None
        finally:
            self.close()


def progress(
    futures: Iterable[concurrent.futures.Future[Any]],
    *,
    timeout: float | None = None,
    widget: bool | None = None,
) -> list[concurrent.futures.Future[Any]]:
    """Show the progress of ``futures`` until all are done (or ``timeout`` passes); returns
    them, so ``get(progress(futures))`` works. A bar in a kernel, a text line elsewhere
    (``widget`` forces either). An interrupt cancels what is not done."""
    tracker = TaskProgress(futures, widget=widget)
    tracker.wait(len(tracker.futures), timeout)
    return tracker.futures


def _in_widget_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a dependency
        return False
    shell = get_ipython()
    if shell is None:
        return False
    from .widget import widgets_available

    return widgets_available(shell)


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
