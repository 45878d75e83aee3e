"""Build an environment on every node of the cluster at once, watching each node live.

Who calls it: ``DaskExecutor.build_on_nodes`` (the ``%runtime_env`` magic on a Dask
executor, and ``DaskExecutor.prepare``), in a thread of the caller's (it blocks).

The current nodes are listed first, each with a ``NodeBuild`` row (``STAGING``). The env
is staged on all of them (``staging``: each blob leaves the driver once), then built on
all of them with one ``Client.run`` of ``node_build``: every node relays its agent's
events for that env (state, steps, installer lines) as Dask events on the executor's
topic, tagged with the build's id, and the rows follow them. A node's answer (its env id,
or its ``BuildError`` naming it) ends its row once its last event batch has arrived.

A node that fails is a ``FAILED`` row with the error, never an exception here: the caller
decides (the magic says one line naming the node and step, ``prepare`` raises it).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from ..errors import BuildError, SpecError, WorkerError
from ..spec import RuntimeEnvSpec
from ..workers.cluster import ClusterBuild, NodeBuild, NodeView

if TYPE_CHECKING:
    from .executor import DaskExecutor

#: How long a node's answer waits for its event batches still in flight.
EVENT_GRACE = 2.0
#: A node that lost the env between staging and building is staged again this often.
RESTAGES = 2


class _Quiet:
    """The view when nobody watches."""

    def nodes(self, env_id: str, rows: Any) -> None:
        pass

    def update(self, row: NodeBuild, event: dict[str, Any] | None) -> None:
        pass


def build_on_nodes(
    executor: DaskExecutor, spec: RuntimeEnvSpec, view: NodeView | None = None
) -> ClusterBuild:
    """Stage and build ``spec`` on every current node; one row per node. Raises only when
    no node can be asked (none is up) or the spec's local content is refused
    (``SpecError``, e.g. over the upload limit)."""
    from .node import NotStaged
    from .node_ops import node_build

    shown: NodeView = view if view is not None else _Quiet()
    started = time.monotonic()
    staging = executor.staging
    staging.register_plugin()
    nodes = staging.nodes()
    if not nodes:
        raise WorkerError(f"no Dask worker of {executor.client.scheduler.address} is up")
    env = staging.env_for(spec)
    rows = {node: NodeBuild(node) for node in nodes}
    lock = threading.Condition()
    shown.nodes(env.spec.env_id, [rows[n] for n in nodes])
    errors: dict[str, BaseException] = {}

    def fail(node: str, error: dict[str, Any], exc: BaseException) -> None:
        with lock:
            rows[node].finish(None, error)
            errors[node] = exc
        shown.update(rows[node], None)

    try:
        manifest = env.prepared.result()
    except SpecError:
        raise
    except Exception as exc:
        for node in nodes:
            fail(node, {"message": str(exc), "step": "staging"}, exc)
        return ClusterBuild(env.spec.env_id, list(rows.values()), _since(started), errors)
    todo = list(nodes)
    received: dict[str, int] = defaultdict(int)
    build = uuid.uuid4().hex

    def receive(message: dict[str, Any]) -> None:  # on the client's loop
        node = str(message.get("node"))
        row = rows.get(node)
        if row is None:
            return
        applied = []
        with lock:
            if row.seconds is None:
                for event in message.get("events") or ():
                    if isinstance(event, dict):
                        row.apply(event)
                        applied.append(event)
            received[node] += 1
            lock.notify_all()
        for event in applied:
            shown.update(row, event)

    executor.builds[build] = receive
    try:
        for attempt in range(RESTAGES + 1):
            _stage_missing(executor, env, manifest, todo)
            staged = []
            for node in todo:
                if node in env.staged:
                    staged.append(node)
                    with lock:
                        rows[node].state = "PENDING"
                    shown.update(rows[node], None)
                else:
                    why = env.errors.get(node, "the node could not take the environment")
                    fail(node, {"message": why, "step": "staging"}, WorkerError(why))
            if not staged:
                break
            answers = executor.client.run(
                node_build, manifest.token, build, executor.topic, workers=staged, on_error="return"
            )
            _await_batches(lock, received, answers)
            todo = []
            for node in staged:
                answer = answers.get(node, WorkerError(f"Dask worker {node} did not answer"))
                if isinstance(answer, dict) and "error" in answer:
                    answer = answer["error"]  # a failed build, after its last events
                if isinstance(answer, NotStaged) and attempt < RESTAGES:
                    with staging.lock:
                        env.staged.discard(node)
                    todo.append(node)  # it lost the env meanwhile (collected): again
                elif isinstance(answer, BaseException):
                    fail(node, _error_of(answer, node), answer)
                else:
                    with lock:
                        rows[node].finish(str(answer["env_id"]), None)
                    with staging.lock:
                        env.ready.add(node)
                    shown.update(rows[node], None)
            if not todo:
                break
    finally:
        executor.builds.pop(build, None)
    return ClusterBuild(env.spec.env_id, [rows[n] for n in nodes], _since(started), errors)


def _stage_missing(executor: DaskExecutor, env: Any, manifest: Any, nodes: list[str]) -> None:
    """Stage the env on those of ``nodes`` that lack it (joined since, or lost it)."""
    with executor.staging.lock:
        missing = [n for n in nodes if n not in env.staged]
    if missing:
        with contextlib.suppress(WorkerError):  # each node's reason is in env.errors
            executor.staging.stage_nodes(env, manifest, missing)


def _await_batches(
    lock: threading.Condition, received: dict[str, int], answers: dict[str, Any]
) -> None:
    """Wait (at most ``EVENT_GRACE``) until every answered node's event batches arrived:
    answers and events travel apart, and a row ends only after its events."""
    deadline = time.monotonic() + EVENT_GRACE
    expected = {
        node: int(answer.get("batches", 0))
        for node, answer in answers.items()
        if isinstance(answer, dict)
    }
    with lock:
        while any(received[n] < count for n, count in expected.items()):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            lock.wait(left)


def _error_of(error: BaseException, node: str) -> dict[str, Any]:
    if isinstance(error, BuildError):
        return error.to_json()
    return {"type": type(error).__name__, "message": f"on Dask worker {node}: {error}", "step": ""}


def _since(started: float) -> float:
    return time.monotonic() - started
