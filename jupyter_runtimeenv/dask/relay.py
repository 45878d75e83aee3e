"""A node's build events, relayed to the driver while the build runs.

Who calls it: ``NodeAgent.build`` when the driver's ``build_on_nodes`` asks for a live view.
The node agent's events (state, step, log line) of the env being built are collected as they
come (on the agent's loop thread) and sent to the driver as Dask events on the executor's
topic (``Worker.log_event``, which is thread-safe), in batches at most every
``FLUSH_SECONDS``: an installer printing thousands of lines costs a handful of messages.
Each batch carries its number, and the build's answer how many were sent, so the driver
waits for the last batch before it says the node is done (events and answers travel apart).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from ..agent.events import Event

#: The least time between two batches.
FLUSH_SECONDS = 0.2
#: Log lines kept per batch: a flood of installer output sends its tail.
MAX_LINES = 200


class Relay:
    """Collects one env's events on a node and sends them to ``topic`` as ``build``."""

    def __init__(self, worker: Any, topic: str, build: str, node: str, env_id: str) -> None:
        self.worker = worker
        self.topic = topic
        self.build = build
        self.node = node
        self.env_id = env_id
        self.sent = 0
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._lines = 0

    def take(self, event: Event) -> None:
        """An agent listener (the agent's loop thread): keep this env's events."""
        if event.env_id != self.env_id:
            return
        data = event.to_json()
        with self._lock:
            if event.kind == "log":
                self._lines += 1
                if self._lines > MAX_LINES:  # keep the tail: drop the oldest line
                    for i, kept in enumerate(self._events):
                        if kept.get("kind") == "log":
                            del self._events[i]
                            break
            self._events.append(data)

    def flush(self) -> None:
        """Send what was collected (nothing if nothing was)."""
        with self._lock:
            events, self._events, self._lines = self._events, [], 0
        if not events:
            return
        self.sent += 1
        message = {"build": self.build, "node": self.node, "seq": self.sent, "events": events}
        self.worker.log_event(self.topic, message)

    async def run(self) -> None:
        """Flush every ``FLUSH_SECONDS`` until cancelled (then the owner flushes once more)."""
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            self.flush()
