"""A Jupyter server extension for ``bench_kernels_tail.py``: what the server's event loop did.

Loaded into the benchmark's server only (``start_server(..., watch=True)`` puts this
directory on its ``PYTHONPATH`` and enables it). It records, in memory:

- the loop's lateness: a callback due every ``PERIOD`` seconds notes how late it ran (a
  loop busy with another callback, or a loop thread that waits for a CPU or the GIL);
- each request's own time in the server, tornado's: from its headers parsed to its finish
  (epoch seconds, comparable with the client's ``time.time()``);
- the loop thread's id (``/proc/<pid>/task/<tid>/schedstat`` tells its run-queue wait).

``GET /loopwatch`` answers all of it as JSON (no authentication: a benchmark's server on
127.0.0.1 only).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import threading
import time
from typing import Any

from tornado import web

PERIOD = 0.002
LATE: collections.deque[tuple[float, float]] = collections.deque(maxlen=400_000)
REQUESTS: collections.deque[tuple[float, float, str]] = collections.deque(maxlen=200_000)
INFO: dict[str, int] = {}


class Dump(web.RequestHandler):
    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"info": INFO, "late": list(LATE), "requests": list(REQUESTS)}))


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "_loopwatch"}]


def _load_jupyter_server_extension(app: Any) -> None:
    loop = asyncio.get_event_loop()
    INFO["pid"] = os.getpid()

    def tick(due: float) -> None:
        now = loop.time()
        LATE.append((time.time(), now - due))
        loop.call_at(now + PERIOD, tick, now + PERIOD)

    def first() -> None:
        INFO["loop_tid"] = threading.get_native_id()
        tick(loop.time())

    loop.call_soon(first)
    settings = app.web_app.settings
    logged = settings.get("log_function")

    def log_function(handler: web.RequestHandler) -> None:
        request = handler.request
        REQUESTS.append((request._start_time, time.time(), request.path))
        if logged is not None:
            logged(handler)

    settings["log_function"] = log_function
    app.web_app.add_handlers(".*$", [(r"/loopwatch", Dump)])
