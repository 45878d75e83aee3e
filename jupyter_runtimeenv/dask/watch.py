"""Worker removals, shared by the ``DaskExecutor``s of one client.

Who calls it: ``DaskExecutor`` (``watch`` when made, ``unwatch`` at shutdown). Dask allows
one handler per topic and client, so the first executor of a client subscribes to the
scheduler's ``all`` topic and every removal is fanned out to the client's executors
(``on_lost(node, keys)``), on the client's loop.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Protocol


class Watcher(Protocol):
    def on_lost(self, node: str, keys: set[str]) -> None:
        """``node`` left the cluster (not gracefully) while running ``keys``."""


_watchers: dict[str, list[Watcher]] = {}
_lock = threading.Lock()


def watch(client: Any, watcher: Watcher) -> None:
    """Subscribe once per client to the scheduler's ``all`` topic, and fan removals out."""
    with _lock:
        watchers = _watchers.setdefault(client.id, [])
        first = not watchers
        watchers.append(watcher)
    if first:
        client.subscribe_topic("all", lambda event: _on_scheduler_event(client.id, event))


def unwatch(client: Any, watcher: Watcher) -> None:
    with _lock:
        watchers = _watchers.get(client.id, [])
        if watcher in watchers:
            watchers.remove(watcher)
        last = not watchers
        if last:
            _watchers.pop(client.id, None)
    if last and client.status == "running":
        with contextlib.suppress(Exception):  # the client is closing
            client.unsubscribe_topic("all")


def _on_scheduler_event(client_id: str, event: tuple[float, Any]) -> None:
    message = event[1]
    if not isinstance(message, dict) or message.get("action") != "remove-worker":
        return
    if message.get("expected"):
        return  # a graceful retirement: Dask moves its tasks, nothing was lost
    keys = {str(k) for k in message.get("processing-tasks", ())}
    node = str(message.get("worker", "?"))
    with _lock:
        watchers = list(_watchers.get(client_id, []))
    for watcher in watchers:
        watcher.on_lost(node, keys)
