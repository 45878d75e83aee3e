"""The events websocket (``/api/events/subscribe``) with a bound on what it buffers for each
subscriber.

jupyter_server's ``SubscribeWebsocket`` writes every event to every subscriber, and tornado
buffers whatever a subscriber does not read, without limit: a socket that never reads, plus
large events (worker reports, installer output), grew the server by megabytes per event.
This extension serves the same route with a subclass (an extension's routes are matched
before the server's own), identical but for one rule: once ``events_buffer_bytes`` are
waiting to be sent to one subscriber, its connection is dropped and its listener removed,
the way a slow consumer of a bounded queue is dropped. A client that
reconnects starts from the events that come next (the sidebar then reloads its state
over REST).

Who uses it: ``RuntimeEnvExtension.initialize_handlers``; the bound is its traitlet.
"""

from __future__ import annotations

import contextlib
from typing import Any

from jupyter_server.services.events.handlers import SubscribeWebsocket
from tornado.iostream import StreamBufferFullError

#: Bytes that may wait to be sent to one subscriber before it is disconnected.
DEFAULT_BUFFER_BYTES = 4 * 2**20
SETTINGS_KEY = "jupyter_runtimeenv_events_buffer_bytes"

__all__ = ["DEFAULT_BUFFER_BYTES", "SETTINGS_KEY", "BoundedSubscribeWebsocket"]


class BoundedSubscribeWebsocket(SubscribeWebsocket):
    """``SubscribeWebsocket`` that drops a subscriber whose unsent bytes pass the bound."""

    def open(self, *args: Any, **kwargs: Any) -> None:
        limit = int(self.settings.get(SETTINGS_KEY, DEFAULT_BUFFER_BYTES))
        connection = self.ws_connection
        stream = getattr(connection, "stream", None)
        if stream is not None:
            # Tornado refuses (raises) a write that would take the buffer past this.
            stream.max_write_buffer_size = limit
        super().open(*args, **kwargs)

    async def event_listener(self, logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        try:
            await super().event_listener(logger, schema_id, data)
        except StreamBufferFullError:
            self._drop()

    def _drop(self) -> None:
        self.log.warning(
            "jupyter_runtimeenv: an events subscriber did not read what the server sent"
            " (%s bytes waiting): disconnected",
            self.settings.get(SETTINGS_KEY, DEFAULT_BUFFER_BYTES),
        )
        with contextlib.suppress(ValueError, KeyError):
            self.event_logger.remove_listener(listener=self.event_listener)
        stream = getattr(self.ws_connection, "stream", None)
        # No close frame: it could not be sent past a full buffer either. The TCP
        # connection goes, with what was buffered; tornado's read loop then sees the stream
        # closed and runs on_close.
        if stream is not None:
            stream.close()
