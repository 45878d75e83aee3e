"""Events the agent publishes: state changes, step start and end, log lines."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

EventKind = Literal["state", "step", "log"]


@dataclass(frozen=True)
class Event:
    kind: EventKind
    env_id: str
    data: dict[str, Any]
    time: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "env_id": self.env_id, "time": self.time, **self.data}


Listener = Callable[[Event], None]


class EventBus:
    """Fan-out of events to listeners (called on the loop; must not block) and queues."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._queues: set[asyncio.Queue[Event | None]] = set()

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` with every event; returns a function that removes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def publish(self, event: Event) -> None:
        for listener in list(self._listeners):
            listener(event)
        for queue in self._queues:
            queue.put_nowait(event)

    async def subscribe(self) -> AsyncIterator[Event]:
        """Every event from now on, until the bus closes."""
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self._queues.add(queue)
        try:
            while (event := await queue.get()) is not None:
                yield event
        finally:
            self._queues.discard(queue)

    def close(self) -> None:
        for queue in self._queues:
            queue.put_nowait(None)
