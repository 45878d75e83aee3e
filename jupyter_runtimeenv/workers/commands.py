"""The kernel's side of the sidebar's Stop and GC on its cluster.

The Jupyter server cannot reach a kernel's Dask cluster (it may not see its scheduler) and
cannot call into a kernel; so a kernel whose report carries a cluster long-polls the server
for commands (``GET kernels/{id}/commands?wait=``, ``server/cluster.py``) in a daemon thread,
carries each out on its session's ``ClusterExecutor`` and answers it:

- ``stop_worker`` (``node``, ``pid``): ``executor.stop_worker`` (the node checks the pid is
  one of this kernel's workers there); an unknown one answers 404;
- ``gc``: ``executor.gc()``, answering the bytes freed per node.

Who calls it: ``report.py``, when a report first carries a cluster (``ensure_poller``).
Nothing here reaches the notebook: failures are answered to the server or logged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .cluster import ClusterExecutor

log = logging.getLogger(__name__)

#: Seconds a poll is held open by the server; the pause after a failed poll.
POLL_SECONDS = 25
RETRY_SECONDS = 2.0

_poller: CommandPoller | None = None
_lock = threading.Lock()


class CommandPoller:
    """The polling thread. ``take(wait)`` returns commands, ``answer(id, body)`` answers one
    (a ``ServerClient``'s ``commands_sync``/``answer_sync``); ``executor()`` is the session's
    cluster executor now (``None``: the kernel has none any more)."""

    def __init__(
        self,
        take: Callable[[float], list[dict[str, Any]]],
        answer: Callable[[str, dict[str, Any]], None],
        executor: Callable[[], ClusterExecutor | None],
    ) -> None:
        self._take = take
        self._answer = answer
        self._executor = executor
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="runtimeenv-commands", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                commands = self._take(POLL_SECONDS)
            except Exception as exc:  # the server is restarting, or gone: try again later
                log.debug("runtime env commands not fetched: %s", exc)
                self._stop.wait(RETRY_SECONDS)
                continue
            for command in commands:
                body = self.carry_out(command)
                try:
                    self._answer(str(command.get("id", "")), body)
                except Exception as exc:
                    log.debug("runtime env command %s not answered: %s", command.get("id"), exc)

    def carry_out(self, command: dict[str, Any]) -> dict[str, Any]:
        """One command's answer: ``{"ok": True, "result": {...}}`` or ``{"ok": False,
        "status", "type", "error"}``."""
        executor = self._executor()
        action = command.get("action")
        if executor is None:
            return _refused(404, "NoCluster", "this kernel has no cluster any more")
        try:
            if action == "stop_worker":
                node, pid = command.get("node"), command.get("pid")
                if not isinstance(node, str) or not isinstance(pid, int):
                    return _refused(400, "ValueError", "stop_worker: expected a node and a pid")
                executor.stop_worker(node, pid)
                return {"ok": True, "result": {"node": node, "pid": pid}}
            if action == "gc":
                started = time.monotonic()
                freed = executor.gc()
                seconds = round(time.monotonic() - started, 3)
                return {"ok": True, "result": {"nodes": freed, "seconds": seconds}}
        except LookupError as exc:
            return _refused(404, "WorkerNotFound", str(exc))
        except Exception as exc:  # the cluster refused: say so to the sidebar
            return _refused(502, type(exc).__name__, f"{type(exc).__name__}: {exc}")
        return _refused(400, "ValueError", f"unknown command {action!r}")


def _refused(status: int, kind: str, message: str) -> dict[str, Any]:
    return {"ok": False, "status": status, "type": kind, "error": message}


def ensure_poller(
    take: Callable[[float], list[dict[str, Any]]],
    answer: Callable[[str, dict[str, Any]], None],
    executor: Callable[[], ClusterExecutor | None],
) -> CommandPoller:
    """The kernel's poller, started on first use (one per process)."""
    global _poller
    with _lock:
        if _poller is None:
            _poller = CommandPoller(take, answer, executor)
        return _poller
