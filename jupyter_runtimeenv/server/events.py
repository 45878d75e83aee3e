"""Forwarding the agent's events to the Jupyter server's event logger (jupyter_events).

A browser follows a build through ``/api/events/subscribe``. Installer output can be hundreds of
lines a second, and each ``emit`` validates against the schema, so log lines are batched: one
event per step per ``interval`` (and before any state or step event of the same env, so that a
subscriber sees the lines before the step that wrote them ends).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ..agent.events import Event

SCHEMA_ID = "https://events.jupyter.org/jupyter_runtimeenv/env/v1"
SCHEMA_PATH = Path(__file__).parent / "event_schemas" / "env" / "v1.yaml"
#: Kernels on a Dask cluster (emitted by ``kernels/remote.py``'s provisioner): registered
#: with the others at the server's start, so that subscribers see them from the first one.
KERNEL_SCHEMA_ID = "https://events.jupyter.org/jupyter_runtimeenv/kernel/v1"
KERNEL_SCHEMA_PATH = Path(__file__).parent / "event_schemas" / "kernel" / "v1.yaml"

_STEP_STATUSES = {"running", "done", "cached", "failed", "cancelled"}
#: An installer's line longer than this is cut in its event (the log file keeps it whole):
#: every event goes to every subscriber.
MAX_LINE_CHARS = 8192


class EventForwarder:
    """An agent listener that emits ``SCHEMA_ID`` events on ``event_logger``.

    Created and closed by ``RuntimeEnvExtension``; called by the agent's event bus on the
    server's loop, so it never blocks (emitting is a validation and a fan-out to listeners).
    """

    def __init__(self, event_logger: Any, *, interval: float = 0.1, max_lines: int = 200) -> None:
        self.event_logger = event_logger
        self.interval = interval
        self.max_lines = max_lines
        self._pending: dict[tuple[str, str], list[str]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self, event: Event) -> None:
        if event.kind == "log":
            step = str(event.data.get("step", ""))
            lines = self._pending.setdefault((event.env_id, step), [])
            line = str(event.data.get("line", ""))
            if len(line) > MAX_LINE_CHARS:
                line = (
                    line[:MAX_LINE_CHARS] + f" [... {len(line) - MAX_LINE_CHARS} more characters]"
                )
            lines.append(line)
            if len(lines) >= self.max_lines:
                self._flush_one(event.env_id, step)
            elif self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(self.interval, self.flush)
            return
        # Keep the order a subscriber sees: this env's pending lines first.
        for env_id, step in [k for k in self._pending if k[0] == event.env_id]:
            self._flush_one(env_id, step)
        self._emit(self._payload(event))

    def flush(self) -> None:
        """Emit every pending batch of lines (the timer, and ``close``)."""
        self._timer = None
        for env_id, step in list(self._pending):
            self._flush_one(env_id, step)

    def close(self) -> None:
        """Flush and stop. Called by the extension when the server stops."""
        if self._timer is not None:
            self._timer.cancel()
        self.flush()

    def _flush_one(self, env_id: str, step: str) -> None:
        lines = self._pending.pop((env_id, step), None)
        if lines:
            self._emit({"kind": "log", "env_id": env_id, "step": step, "lines": lines})

    def _emit(self, data: dict[str, Any]) -> None:
        self.event_logger.emit(schema_id=SCHEMA_ID, data=data)

    @staticmethod
    def _payload(event: Event) -> dict[str, Any]:
        data = dict(event.data)
        out: dict[str, Any] = {"kind": event.kind, "env_id": event.env_id}
        if event.kind == "state":
            out["state"] = data.pop("state")
            out["old"] = data.pop("old", None)
            if data.get("removed"):
                out["removed"] = True
            if isinstance(data.get("error"), dict):
                out["error"] = data["error"]
        else:
            out["step"] = str(data.pop("step", ""))
            status = data.pop("status", None)
            if status in _STEP_STATUSES:
                out["status"] = status
            out["info"] = {k: v for k, v in data.items() if isinstance(v, (str, int, float))}
        return out
