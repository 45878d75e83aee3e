"""A kernel's build on a Dask node, as its provisioner sees it: the node agent's events of
the kernel's env (its state, each step's start and end, installer lines in batches) sent as
Dask events on the kernel's topic, and a failed build in one line.

Who calls it: ``node_kernels.NodeKernels.build`` (on the node agent's loop); the server relays
what arrives (``kernels/cluster.KernelEvents.relay``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from distributed.worker import Worker

from ..agent.events import Event
from ..errors import BuildError
from .node import NodeAgent

#: How often installer lines are sent to the provisioner (one Dask event per batch).
LOG_BATCH_SECONDS = 0.25


class Forwarder:
    """An agent listener (on the agent's loop) that sends one env's events to the
    provisioner as Dask events; installer lines in batches."""

    def __init__(self, worker: Worker, topic: str, env_id: str) -> None:
        self.worker = worker
        self.topic = topic
        self.env_id = env_id
        self._lines: dict[str, list[str]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self, event: Event) -> None:
        if event.env_id != self.env_id:
            return
        data = dict(event.data)
        if event.kind == "log":
            self._lines.setdefault(str(data.get("step", "")), []).append(str(data.get("line", "")))
            if self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(LOG_BATCH_SECONDS, self.flush)
            return
        self.flush()
        message: dict[str, Any] = {"kind": event.kind, "env_id": self.env_id}
        if event.kind == "state":
            message["state"] = str(data.get("state", ""))
            if isinstance(data.get("error"), dict):
                message["message"] = str(data["error"].get("message", ""))[:500]
        else:
            message["step"] = str(data.get("step", ""))
            message["status"] = str(data.get("status", ""))
            if isinstance(data.get("label"), str):
                message["label"] = data["label"]
        self._send(message)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        lines, self._lines = self._lines, {}
        for step, batch in lines.items():
            self._send({"kind": "log", "env_id": self.env_id, "step": step, "lines": batch[-200:]})

    def _send(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # progress is best effort; the build is not
            self.worker.log_event(self.topic, message)


async def listen(node: NodeAgent, forwarder: Forwarder) -> Callable[[], None]:
    return node.agent.add_listener(forwarder)


async def unlisten(unlisten: Callable[[], None], forwarder: Forwarder) -> None:
    unlisten()
    forwarder.flush()


#: The longest failure line (the installer's whole tail goes to the server's log).
MAX_LINE = 400


def one_line(error: BuildError) -> str:
    text = f"{error.step}: {error.message}" if error.step else error.message
    last = next((line.strip() for line in reversed(error.output_tail) if line.strip()), "")
    text = " ".join(text.split())
    if last and last not in text:
        text = f"{text} (last output: {last})"
    return text if len(text) <= MAX_LINE else text[: MAX_LINE - 1] + "…"
