"""The server's side of kernels on a Dask cluster: one client per scheduler, and the events.

Who calls it: ``DaskKernelProvisioner`` (``remote.py``). Everything here that talks to Dask
blocks (a synchronous ``distributed.Client``, whose own loop runs in a thread of its own),
so the provisioner calls it through ``asyncio.to_thread``: the server's loop never waits.

``ClusterLink`` is shared by the kernels of one scheduler address (reference-counted;
the client closes with the last kernel). It registers the node plugins once, tells
kernels when their node leaves the cluster (the scheduler's ``remove-worker`` events) and
routes each kernel's own topic (build progress, the kernel's exit) to it.

``KernelEvents`` publishes what a kernel's start is doing on the server's event bus
(jupyter_events schema ``KERNEL_SCHEMA_ID``, ``/api/events/subscribe``) and in the server's
log, always naming the node; never the connection info.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from ..errors import KernelStartError
from ..server.events import KERNEL_SCHEMA_ID, KERNEL_SCHEMA_PATH

CLIENT_NAME = "jupyter-runtimeenv-kernels"
#: How often the kernels' leases are renewed on their nodes at most (see
#: ``ClusterLink.lease``); a third of the shortest lease when that is less.
RENEW_SECONDS = 10.0

NodeWatcher = Callable[[str, bool], None]
TopicHandler = Callable[[dict[str, Any]], None]

_links: dict[str, ClusterLink] = {}
_links_lock = threading.Lock()


class ClusterLink:
    """A ``distributed.Client`` to one scheduler, shared by this process's kernels on it."""

    def __init__(self, address: str, client: Any) -> None:
        self.address = address
        self.client = client
        self.refs = 0
        self._lock = threading.Lock()
        self._plugins = False
        self._watchers: dict[str, list[NodeWatcher]] = {}
        self._topics: dict[str, TopicHandler] = {}
        self._leases: dict[str, dict[str, float]] = {}  # node -> kernel id -> lease
        self._closed = threading.Event()
        self._renewer: threading.Thread | None = None
        client.subscribe_topic("all", self._on_scheduler_event)

    # -- sharing (blocking: call in a thread) ----------------------------------------------

    @classmethod
    def acquire(cls, address: str, timeout: float) -> ClusterLink:
        """The link to ``address`` (connecting if none); ``KernelStartError`` if the
        scheduler cannot be reached within ``timeout`` seconds. Blocking."""
        with _links_lock:
            link = _links.get(address)
            if link is not None and link.client.status == "running":
                link.refs += 1
                return link
            try:
                import distributed
            except ImportError:
                raise KernelStartError(
                    "kernels on a Dask cluster need the 'distributed' package:"
                    " pip install 'jupyter-runtimeenv[dask]'"
                ) from None
            try:
                client = distributed.Client(  # type: ignore[no-untyped-call]
                    address, timeout=timeout, set_as_default=False, name=CLIENT_NAME
                )
            except Exception as exc:
                raise KernelStartError(
                    f"cannot reach the Dask scheduler {address} within {timeout:g} s:"
                    f" {_first_line(exc)}"
                ) from None
            link = _links[address] = cls(address, client)
            link.refs = 1
            return link

    def release(self) -> None:
        """Drop one kernel's use; the last one closes the client. Blocking."""
        with _links_lock:
            self.refs -= 1
            if self.refs > 0:
                return
            if _links.get(self.address) is self:
                del _links[self.address]
        self._closed.set()
        with contextlib.suppress(Exception):  # the scheduler may be gone already
            self.client.close(timeout=10)

    # -- the cluster (blocking) --------------------------------------------------------------

    def ensure_plugins(self, node_cache_dir: str | None) -> None:
        """Register the node agent and kernel plugins (once per link; Dask keeps the first
        registration of each name, so a ``DaskExecutor`` may have set the cache dir)."""
        from ..dask.node import NodeAgentPlugin
        from ..dask.node_kernels import NodeKernelsPlugin

        with self._lock:
            if self._plugins:
                return
            self.client.register_plugin(NodeAgentPlugin(node_cache_dir))
            self.client.register_plugin(NodeKernelsPlugin())
            self._plugins = True

    def connected(self) -> bool | None:
        """Whether the client talks to the scheduler: ``True``; ``None`` while it tries to
        reconnect (a scheduler that went away, for up to the client's timeout); ``False``
        once it gave up (the scheduler is gone, and Dask workers close when they lose their
        scheduler: the kernels on them went too)."""
        status = str(self.client.status)
        if status == "running":
            return True
        return None if status in ("connecting", "newly-created") else False

    def nodes(self) -> list[str]:
        """The addresses of the cluster's workers now."""
        info = self.client.scheduler_info(n_workers=-1)
        return sorted(info.get("workers", {}))

    def run(self, function: Callable[..., Any], *args: Any, node: str) -> Any:
        """``function(*args)`` on ``node``'s worker loop; its answer, or its exception raised."""
        answers = self.client.run(function, *args, workers=[node], on_error="return")
        if node not in answers:
            raise KernelStartError(f"Dask worker {node} did not answer", node=node)
        answer = answers[node]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def run_all(self, function: Callable[..., Any], *args: Any, nodes: list[str]) -> dict[str, Any]:
        """``function(*args)`` on each of ``nodes``; node -> answer or exception."""
        return dict(self.client.run(function, *args, workers=nodes, on_error="return"))

    # -- leases: kernels live on their nodes while this process does ------------------------

    def lease(self, node: str, kernel_id: str, seconds: float) -> None:
        """Renew the lease of ``kernel_id`` on ``node`` (``seconds`` long) from now on, from
        a thread of this link, several times per lease: if this process dies, the node stops
        the kernel once its lease runs out (``node_kernels``)."""
        with self._lock:
            self._leases.setdefault(node, {})[kernel_id] = seconds
            if self._renewer is None:
                self._renewer = threading.Thread(
                    target=self._renew, name="jupyter-runtimeenv-kernel-leases", daemon=True
                )
                self._renewer.start()

    def unlease(self, node: str, kernel_id: str) -> None:
        with self._lock:
            kernels = self._leases.get(node, {})
            kernels.pop(kernel_id, None)
            if not kernels:
                self._leases.pop(node, None)

    def _period(self) -> float:
        with self._lock:
            shortest = min((s for k in self._leases.values() for s in k.values()), default=0.0)
        return max(0.5, min(RENEW_SECONDS, shortest / 3 if shortest else RENEW_SECONDS))

    def _renew(self) -> None:
        from ..dask.node_kernels import node_kernel_renew

        while not self._closed.wait(self._period()):
            with self._lock:
                leases = {node: sorted(ids) for node, ids in self._leases.items() if ids}
            for node, ids in leases.items():
                # A node that does not answer now may later: the lease has slack.
                with contextlib.suppress(Exception):
                    self.client.run(node_kernel_renew, ids, workers=[node], on_error="ignore")

    # -- notifications (the client's loop thread) -------------------------------------------

    def watch(self, node: str, watcher: NodeWatcher) -> Callable[[], None]:
        """Call ``watcher(node, retired)`` when ``node`` leaves the cluster."""
        with self._lock:
            self._watchers.setdefault(node, []).append(watcher)

        def remove() -> None:
            with self._lock:
                watchers = self._watchers.get(node, [])
                if watcher in watchers:
                    watchers.remove(watcher)
                if not watchers:
                    self._watchers.pop(node, None)

        return remove

    def subscribe(self, topic: str, handler: TopicHandler) -> None:
        """Route the Dask events of ``topic`` (a kernel's own) to ``handler``."""
        with self._lock:
            self._topics[topic] = handler
        self.client.subscribe_topic(topic, self._on_topic_event(topic))

    def unsubscribe(self, topic: str) -> None:
        with self._lock:
            known = self._topics.pop(topic, None) is not None
        if known and self.client.status == "running":
            with contextlib.suppress(Exception):  # closing
                self.client.unsubscribe_topic(topic)

    def _on_topic_event(self, topic: str) -> Callable[[tuple[float, Any]], None]:
        def handle(event: tuple[float, Any]) -> None:
            handler = self._topics.get(topic)
            if handler is not None and isinstance(event[1], dict):
                try:
                    handler(event[1])
                except Exception:  # one kernel's handler must not break the client's loop
                    logging.getLogger(__name__).exception("kernel event handler failed")

        return handle

    def _on_scheduler_event(self, event: tuple[float, Any]) -> None:
        message = event[1]
        if not isinstance(message, dict) or message.get("action") != "remove-worker":
            return
        node = str(message.get("worker", ""))
        with self._lock:
            watchers = list(self._watchers.get(node, []))
        for watcher in watchers:
            try:
                watcher(node, bool(message.get("expected")))
            except Exception:
                logging.getLogger(__name__).exception("kernel node watcher failed")


class KernelEvents:
    """What one kernel's start and life look like to the server: events and log lines.

    ``logger`` is the server's ``EventLogger`` (``None`` outside a server: log lines only);
    ``loop`` the loop that owns it (events from the client's thread hop over to it).
    """

    def __init__(
        self,
        kernel_id: str,
        scheduler: str,
        log: logging.Logger | logging.LoggerAdapter[Any],
        logger: Any = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.kernel_id = kernel_id
        self.scheduler = scheduler
        self.log = log
        self.logger = logger if logger is not None and _registered(logger) else None
        self.loop = loop
        self.node = ""

    def emit(self, kind: str, message: str = "", **data: Any) -> None:
        """Publish one event (any thread). ``message`` is a line for people: it goes to the
        server's log too (info; failures and deaths as errors)."""
        payload = {
            "kind": kind,
            "kernel_id": self.kernel_id,
            "node": self.node,
            "scheduler": self.scheduler,
            **{k: v for k, v in data.items() if v is not None},
        }
        if message:
            payload["message"] = message
            level = logging.ERROR if kind in ("failed", "lost", "exited") else logging.INFO
            self.log.log(level, "jupyter_runtimeenv: kernel %s: %s", self.kernel_id, message)
        if self.logger is None or self.loop is None or self.loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self._emit(payload)
        else:
            with contextlib.suppress(RuntimeError):  # the server's loop closed
                self.loop.call_soon_threadsafe(self._emit, payload)

    def relay(self, message: dict[str, Any]) -> None:
        """Publish a build event the node sent (``dask/kernel_build.Forwarder``): the env's state,
        a step's start and end, installer lines. Anything else is dropped."""
        kind = str(message.get("kind", ""))
        extra: dict[str, Any] = {
            k: message.get(k) for k in ("env_id", "state", "step", "status", "label")
        }
        if kind == "log":
            lines = [str(line) for line in message.get("lines", [])][-200:]
            self.emit("log", lines=lines, step=extra["step"], env_id=extra["env_id"])
        elif kind == "step":
            label = extra["label"] or extra["step"]
            self.emit("step", f"on Dask worker {self.node}: {label}: {extra['status']}", **extra)
        elif kind == "state" and extra["state"] in ("PENDING", "BUILDING", "READY", "FAILED"):
            self.emit("state", **extra)

    def _emit(self, payload: dict[str, Any]) -> None:
        if self.logger is None:
            return
        try:
            self.logger.emit(schema_id=KERNEL_SCHEMA_ID, data=payload)
        except Exception:  # progress must never break a kernel's start
            self.log.debug("jupyter_runtimeenv: a kernel event was refused", exc_info=True)


def _registered(logger: Any) -> bool:
    """Register the kernel schema on the server's event logger (once); whether it is."""
    try:
        if KERNEL_SCHEMA_ID in getattr(logger, "schemas", {}):
            return True
        logger.register_event_schema(KERNEL_SCHEMA_PATH)
        return True
    except Exception as exc:
        if "already" in str(exc).lower():
            return True
        logging.getLogger(__name__).warning("cannot register the kernel event schema: %s", exc)
        return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
