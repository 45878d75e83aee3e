"""What an executor with nodes offers beyond ``Executor``: the cluster as close as the laptop.

``ClusterExecutor`` is the contract between an executor that runs calls on many machines
(``jupyter_runtimeenv.dask.DaskExecutor``) and the parts that show the cluster, which know
nothing of Dask:

- ``%runtime_env`` (``ipython/cluster_build.py``) calls ``build_on_nodes`` to stage and
  build an env on every current node at once, watching each node through a ``NodeView``;
- ``progress`` (``ipython/tasks.py``) asks ``locate`` where futures run, to count per node;
- the kernel's report (``report.py``) carries ``cluster_report()``; the sidebar's Stop and
  GC reach ``stop_worker`` and ``gc`` through it.

The data that travels up is plain: ``NodeBuild`` rows and JSON-compatible dicts.
"""

from __future__ import annotations

import abc
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..spec import RuntimeEnvSpec
from .executor import Executor, resolve_for_driver
from .future import RemoteFuture

__all__ = [
    "ClusterBuild",
    "ClusterExecutor",
    "ClusterFuture",
    "NodeBuild",
    "NodeView",
]

#: Installer lines kept per node while building.
NODE_TAIL = 40


@dataclass
class NodeBuild:
    """One node's part of a cluster build, as the widget's row shows it.

    ``state``: ``STAGING`` (getting the env's files), then the node agent's ``PENDING``,
    ``BUILDING``, ``READY`` or ``FAILED``. ``step`` is the current (or failing) step as users
    read it (``pip: greeting==1.0``), ``step_started`` when it began (epoch seconds).
    """

    address: str
    state: str = "STAGING"
    env_id: str = ""
    step: str = ""
    step_started: float | None = None
    started: float = field(default_factory=time.monotonic)
    seconds: float | None = None
    #: The build error of a failed node (``BuildError.to_json()``: message, step,
    #: output_tail, log_path), or ``{"message": ...}`` for a failure before the build.
    error: dict[str, Any] | None = None
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=NODE_TAIL))
    #: The build went through BUILDING (not found ready in the node's cache).
    built: bool = False

    @property
    def elapsed(self) -> float:
        return self.seconds if self.seconds is not None else time.monotonic() - self.started

    def apply(self, event: dict[str, Any]) -> None:
        """Take one agent event of this node (``Event.to_json()``: kind, env_id, ...)."""
        kind = event.get("kind")
        if event.get("env_id"):
            self.env_id = str(event["env_id"])
        if kind == "state":
            state = str(event.get("state", self.state))
            self.state = state
            self.built = self.built or state == "BUILDING"
            if isinstance(event.get("error"), dict):
                self.error = dict(event["error"])
        elif kind == "step":
            label = str(event.get("label") or event.get("step") or "")
            status = event.get("status")
            if status == "running":
                self.step = label
                started = event.get("started")
                self.step_started = float(started) if isinstance(started, int | float) else None
            elif status == "failed":
                self.step = label
        elif kind == "log" and "line" in event:
            self.lines.append(str(event["line"]))

    def finish(self, env_id: str | None, error: dict[str, Any] | None) -> None:
        """The node's answer: its env id, or its error."""
        self.seconds = time.monotonic() - self.started
        if error is not None:
            self.state = "FAILED"
            self.error = error
            if error.get("step"):
                self.step = str(error["step"])
            if not self.lines:
                self.lines.extend(str(line) for line in error.get("output_tail") or [])
        else:
            self.state = "READY"
            self.env_id = env_id or self.env_id


class NodeView(Protocol):
    """What shows a cluster build live (``ClusterBuildWidget``, or the text lines). Called
    from the executor's threads; each call is cheap and must not block."""

    def nodes(self, env_id: str, rows: Sequence[NodeBuild]) -> None:
        """The env (its id as the kernel knows it) and the nodes the build runs on, all at
        once, as it starts."""

    def update(self, row: NodeBuild, event: dict[str, Any] | None) -> None:
        """A node's row changed (``event``: the agent event that changed it, if any)."""


@dataclass
class ClusterBuild:
    """The outcome of ``build_on_nodes``: the env id the kernel knows (the resolved spec's),
    one row per node, and the seconds it took."""

    env_id: str
    rows: list[NodeBuild]
    seconds: float
    #: Node address -> the exception a failed node raised (its row has it as JSON).
    errors: dict[str, BaseException] = field(default_factory=dict)

    @property
    def failed(self) -> list[NodeBuild]:
        return [row for row in self.rows if row.state != "READY"]

    def line(self) -> str:
        ready = len(self.rows) - len(self.failed)
        return (
            f"runtime env {self.env_id[:12]} ready on {ready}/{len(self.rows)} nodes"
            f" ({self.seconds:.2f} s)"
        )


class ClusterFuture(RemoteFuture[Any]):
    """A ``RemoteFuture`` of a cluster: ``node`` is where it ran (once known), and its
    executor can ``locate`` it while it runs."""

    def __init__(self, name: str, executor: ClusterExecutor) -> None:
        super().__init__(name)
        self.executor = executor
        self.node: str | None = None


class ClusterExecutor(Executor):
    """An executor whose calls run on nodes (Dask workers).

    ``observe(callback)`` is told (cheaply, from any thread) when its tasks start or end, as
    the pools tell theirs: the kernel's report looks at the cluster again then.
    """

    _observers: list[Callable[[], None]]

    def observe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` when this executor's tasks change; returns its remover."""
        observers = self.__dict__.setdefault("_observers", [])
        observers.append(callback)
        return lambda: observers.remove(callback) if callback in observers else None

    def changed(self) -> None:
        """Tell the observers (called by the implementation; never raises)."""
        for callback in list(self.__dict__.get("_observers", ())):
            try:
                callback()
            except Exception:  # an observer's bug must not break a task
                continue

    @abc.abstractmethod
    def build_on_nodes(
        self, runtime_env: RuntimeEnvSpec, view: NodeView | None = None
    ) -> ClusterBuild:
        """Stage and build ``runtime_env`` on every current node at once; blocking. Nodes that
        fail are rows in the answer (``FAILED``, with the error), never an exception; an
        error before any node could start (no node up) is raised."""

    @abc.abstractmethod
    def locate(self, futures: Sequence[Future[Any]]) -> dict[int, str]:
        """``id(future)`` -> node address, for the futures of this executor that run (or
        ran) on a known node."""

    @abc.abstractmethod
    def cluster_report(self) -> dict[str, Any]:
        """The cluster as the kernel reports it (``server/openapi.yaml``, ``Cluster``)."""

    @abc.abstractmethod
    def stop_worker(self, node: str, pid: int) -> None:
        """Kill environment worker ``pid`` on ``node`` (one of this executor's);
        ``LookupError`` if it is not one."""

    def env_id_of(self, runtime_env: RuntimeEnvSpec) -> str:
        """The id the nodes build ``runtime_env`` under from this driver (what its builds
        print, the report's ``driver_env_id``): what the kernel shows for it."""
        return resolve_for_driver(runtime_env).env_id

    @abc.abstractmethod
    def states_on_nodes(self, runtime_env: RuntimeEnvSpec) -> dict[str, str] | None:
        """Node -> ``runtime_env``'s state there (``READY``, ``not staged`` ...), for an env
        this executor staged; ``None`` for one it never did. Nothing is started."""

    @abc.abstractmethod
    def gc(self, max_bytes: int | None = None) -> dict[str, int]:
        """Collect every node's cache down to ``max_bytes`` (default: each node's budget);
        node address -> bytes freed."""
