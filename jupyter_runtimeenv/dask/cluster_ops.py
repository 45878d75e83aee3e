"""What the notebook and the sidebar ask of a ``DaskExecutor``'s cluster, beyond tasks.

Who calls it: ``DaskExecutor`` (its ``ClusterExecutor`` methods): ``prestart`` (the
``%runtime_env`` magic), ``locate`` (per-node progress), ``cluster_report`` (the kernel's
report to the sidebar), ``stop_worker`` and ``gc`` (the sidebar's Stop and GC, through the
kernel), ``states_on_nodes`` (``%runtime_env --list``). All block on ``Client.run``: call
them from threads that may wait (never the client's own loop).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ..errors import WorkerError
from ..spec import RuntimeEnvSpec
from ..workers.cluster import ClusterFuture

if TYPE_CHECKING:
    from .executor import DaskExecutor

log = logging.getLogger(__name__)


def prestart(executor: DaskExecutor, spec: RuntimeEnvSpec) -> None:
    """Once ``spec`` is staged, start one environment worker of it on every node that has
    it, in a staging thread (the caller does not wait)."""
    from .node_ops import node_prestart

    env = executor.staging.env_for(spec)

    def start(_done: Any) -> None:
        token = env.token
        if token is None or executor.client.status != "running":
            return
        with executor.staging.lock:
            nodes = sorted(env.staged)
        try:
            executor.client.run(node_prestart, executor.id, token, workers=nodes, on_error="return")
        except Exception as exc:  # the cluster went away: the first task says so
            log.debug("jupyter-runtimeenv: prestart on the nodes failed: %s", exc)

    env.prepared.add_done_callback(lambda done: _in_thread(executor, start, done))


def _in_thread(executor: DaskExecutor, call: Any, arg: Any) -> None:
    with contextlib.suppress(RuntimeError):  # shut down meanwhile
        executor.staging.submit(call, arg)


def locate(
    executor: DaskExecutor, futures: Sequence[Future[Any]], by_key: dict[str, Any]
) -> dict[int, str]:
    """``id(future)`` -> node for this executor's futures: where each ran, or runs now
    (asked of the scheduler, one round trip, only when some of them run)."""
    out: dict[int, str] = {}
    running: dict[int, ClusterFuture] = {}
    for future in futures:
        if not isinstance(future, ClusterFuture) or future.executor is not executor:
            continue
        if future.node is not None:
            out[id(future)] = future.node
        elif future.running():
            running[id(future)] = future
    if not running:
        return out
    try:
        processing = executor.client.processing()
    except Exception:  # the scheduler is unreachable now: counted unplaced
        return out
    where = {str(key): str(node) for node, keys in processing.items() for key in keys}
    for key, pending in list(by_key.items()):
        future = pending.future
        if id(future) in running and key in where:
            out[id(future)] = where[key]
    return out


def cluster_report(executor: DaskExecutor) -> dict[str, Any]:
    """The cluster as the kernel reports it (``server/openapi.yaml``, ``Cluster``): the
    scheduler, its dashboard, and per node its cache and, per env of this executor staged
    there, the env's state and size and this executor's workers on it."""
    from .node_ops import node_snapshot

    client = executor.client
    info = client.scheduler_info(n_workers=-1)
    envs = executor.staging.by_token()
    tokens = sorted(envs)
    answers = client.run(node_snapshot, executor.id, tokens, on_error="return")
    nodes = []
    for address, worker in sorted(info.get("workers", {}).items()):
        answer = answers.get(address)
        node: dict[str, Any] = {
            "address": address,
            "name": str(worker.get("name", "")),
            "state": "up",
            "cache_bytes": 0,
            "max_bytes": executor.node_max_bytes,
            "envs": [],
        }
        if isinstance(answer, dict):
            node["cache_bytes"] = int(answer.get("cache_bytes", 0))
            node["max_bytes"] = int(answer.get("max_bytes", executor.node_max_bytes))
            for env in answer.get("envs", []):
                staged = envs.get(str(env.get("token")))
                node["envs"].append(
                    {
                        "env_id": str(env.get("env_id") or ""),
                        "driver_env_id": staged.spec.env_id if staged is not None else "",
                        "state": str(env.get("state", "")),
                        "bytes": int(env.get("bytes", 0)),
                        "workers": list(env.get("workers", [])),
                    }
                )
        else:
            node["state"] = "unreachable"
            node["error"] = f"{type(answer).__name__}: {answer}"[:300]
        nodes.append(node)
    return {
        "scheduler": str(client.scheduler.address),
        "dashboard": _dashboard(client),
        "updated": time.time(),
        "nodes": nodes,
    }


def _dashboard(client: Any) -> str | None:
    try:
        services = client.scheduler_info().get("services", {})
        if "dashboard" not in services:
            return None
        return str(client.dashboard_link)
    except Exception:  # no dashboard, or none Dask can tell
        return None


def stop_worker(executor: DaskExecutor, node: str, pid: int) -> None:
    """Kill environment worker ``pid`` on ``node``, one of this executor's workers there;
    ``LookupError`` otherwise."""
    from .node_ops import node_stop_worker

    answers = executor.client.run(
        node_stop_worker, executor.id, pid, workers=[node], on_error="return"
    )
    if node not in answers:
        raise LookupError(f"no Dask worker {node} in this kernel's cluster")
    if answers[node] is not True:
        raise LookupError(f"no environment worker {pid} of this kernel on {node}")


def gc(executor: DaskExecutor, max_bytes: int | None = None) -> dict[str, int]:
    """Collect every node's cache to ``max_bytes`` (default: each node's budget); node ->
    bytes freed (measured on its disk). ``WorkerError`` naming the nodes that could not."""
    from .node_ops import node_gc

    executor.staging.register_plugin()
    answers = executor.client.run(node_gc, max_bytes, on_error="return")
    freed: dict[str, int] = {}
    failed: dict[str, str] = {}
    for node, answer in sorted(answers.items()):
        if isinstance(answer, dict):
            freed[node] = int(answer.get("freed_bytes", 0))
        else:
            failed[node] = f"{type(answer).__name__}: {answer}"
    if failed:
        problems = "; ".join(f"{node}: {why}" for node, why in failed.items())
        raise WorkerError(f"GC failed on Dask workers: {problems}")
    return freed


def states_on_nodes(executor: DaskExecutor, spec: RuntimeEnvSpec) -> dict[str, str] | None:
    """Node -> the env's state there, for an env this executor staged (``None``: it never
    did, so no node has it from this kernel)."""
    from .node_ops import node_states

    env = executor.staging.known(spec)
    token = env.token if env is not None else None
    if token is None:
        return None
    answers = executor.client.run(node_states, [token], on_error="return")
    return {
        node: (answer.get(token, "?") if isinstance(answer, dict) else "unreachable")
        for node, answer in sorted(answers.items())
    }
