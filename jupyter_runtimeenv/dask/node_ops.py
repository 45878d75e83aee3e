"""What the driver runs on nodes: ``Client.run`` coroutines and the ``run_task`` Dask task.

Who calls it: ``DaskExecutor`` and its helpers (``transfer``, ``cluster_build``,
``cluster_ops``). Each ``node_*`` function runs on a Dask worker's event loop (``Client.run``
passes ``dask_worker``) and awaits the node agent, which does blocking work in threads.
``run_task`` is an ordinary Dask task, run in one of the Dask worker's threads: it hands
the pickled call to an environment worker of that node and returns the pickled outcome.
A task's output lines go back to the driver as Dask events on the executor's topic,
tagged with the task.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import sys
from typing import Any

from distributed import get_worker
from distributed.worker import Worker

from ..errors import BuildError, WorkerError
from ..workers import files
from ..workers.future import RemoteFuture, Task
from ..workers.output import OutputTarget
from . import node_report
from .node import PLUGIN_NAME, NodeAgent, NotStaged, on_node


class NodeOutput(OutputTarget):
    """A task's output on a node: each batch of lines goes to the driver as a Dask event."""

    def __init__(self, name: str, worker: Worker, topic: str, task_id: int) -> None:
        super().__init__(name, sys.stdout, sys.stderr, contextvars.Context())
        self.worker = worker
        self.topic = topic
        self.task_id = task_id
        self.count = 0

    def write(self, stream: int, text: str) -> None:
        self.count += 1
        self.worker.log_event(self.topic, {"task": self.task_id, "stream": stream, "text": text})


def run_task(
    owner: str,
    token: str,
    payload: bytes,
    name: str,
    topic: str,
    task_id: int,
    files_out: list[str] | None = None,
) -> tuple[int, bytes, int, str, dict[str, Any] | None]:
    """A Dask task: run one call in a worker of this node's pool for ``token``.

    Returns ``(frame kind, outcome bytes, output events sent, this node, files)``; the
    driver unpickles the outcome. ``files`` (None without a working_dir): what the call
    wrote in its working directory (``FilesWritten.to_json``), and under ``"listing"`` the
    files ``files_out`` selects, stored in this node's blob store for the driver to fetch.
    ``BuildError``/``WorkerError`` name this node.
    """
    worker = get_worker()
    node = _node_of(worker, token)
    host = worker.address.split("://", 1)[-1]
    output = NodeOutput(f"{name} node={host}", worker, topic, task_id)
    future: RemoteFuture[tuple[int, bytes]] = RemoteFuture(name)
    task = Task(payload, future, output, raw=True)
    key = worker.get_current_task()
    try:
        while not (pool := node.pool_for(owner, token)).submit(task):
            pass  # that pool began closing just now: take the next one
        while True:
            try:
                kind, data = future.result(timeout=0.5)
                break
            except concurrent.futures.TimeoutError:
                if _abandoned(worker, key):
                    future.cancel()  # kills its worker process
                    raise
    except BuildError as exc:
        raise on_node(exc, str(worker.address)) from None
    except WorkerError as exc:
        raise type(exc)(f"on Dask worker {worker.address}: {exc}") from None
    return kind, data, output.count, str(worker.address), _files(pool, files_out, node)


def _files(pool: Any, patterns: list[str] | None, node: NodeAgent) -> dict[str, Any] | None:
    written = files.take(pool.ctx)
    if written is None:
        return None
    report = written.to_json()
    if patterns and written:
        report["listing"] = files.store_selected(written, patterns, node.cache_root)
    return report


def _node_of(worker: Worker, token: str) -> NodeAgent:
    plugin = worker.plugins.get(PLUGIN_NAME)
    node = getattr(plugin, "node", None)
    if not isinstance(node, NodeAgent):
        raise NotStaged(str(worker.address), token)
    return node


def _abandoned(worker: Worker, key: Any) -> bool:
    """Whether Dask gave up on the running task (cancelled by the driver, or released)."""
    state = worker.state.tasks.get(key) if key is not None else None
    return state is None or state.state in ("cancelled", "released", "forgotten")


def agent_of(dask_worker: Worker) -> NodeAgent:
    node = getattr(dask_worker.plugins.get(PLUGIN_NAME), "node", None)
    if not isinstance(node, NodeAgent):
        raise WorkerError(f"Dask worker {dask_worker.address} has no node agent (plugin missing)")
    return node


# -- what the driver runs with Client.run (coroutines on the worker's loop) ---------------


async def node_offer(manifest: dict[str, Any], dask_worker: Worker) -> list[str]:
    return await agent_of(dask_worker).offer(manifest)


async def node_put(token: str, blobs: dict[str, bytes], dask_worker: Worker) -> list[str]:
    return await agent_of(dask_worker).put(token, blobs)


async def node_fetch(
    token: str, holders: dict[str, list[str]], dask_worker: Worker
) -> dict[str, Any]:
    return await agent_of(dask_worker).fetch(token, holders)


async def node_forget(owner: str, dask_worker: Worker) -> None:
    node = getattr(dask_worker.plugins.get(PLUGIN_NAME), "node", None)
    if isinstance(node, NodeAgent):
        await node.forget(owner)


async def node_build(
    token: str, build: str | None, topic: str | None, dask_worker: Worker
) -> dict[str, Any]:
    """Build ``token``'s env on this node now, relaying its events to ``topic`` as ``build``
    when given: ``{"env_id", "batches"}``."""
    return await agent_of(dask_worker).build(token, build, topic)


async def node_prestart(owner: str, token: str, dask_worker: Worker) -> bool:
    return await agent_of(dask_worker).prestart(owner, token)


async def node_blobs_of(names: list[str], dask_worker: Worker) -> dict[str, bytes]:
    """This node's blobs of ``names`` (files a task wrote, for the driver's ``files_out``)."""
    from .node_blobs import read_blobs

    node = agent_of(dask_worker)
    return await asyncio.to_thread(read_blobs, node.cache_root, list(names[:10_000]))


async def node_info(dask_worker: Worker) -> dict[str, Any]:
    return agent_of(dask_worker).info()


async def node_states(tokens: list[str], dask_worker: Worker) -> dict[str, str]:
    """Token -> the env's state on this node (``not staged``, ``not built``, or the agent's)."""
    return await node_report.states(agent_of(dask_worker), tokens)


async def node_snapshot(owner: str, tokens: list[str], dask_worker: Worker) -> dict[str, Any]:
    """This node as the kernel's report shows it (``node_report.snapshot``). A node without
    the node agent yet (nothing staged since the executor started: its plugin is registered
    with the first env) is up and holds no env of this executor: it reports no envs, not an
    error."""
    node = getattr(dask_worker.plugins.get(PLUGIN_NAME), "node", None)
    if not isinstance(node, NodeAgent):
        return {"cache_bytes": 0, "envs": []}
    return await node_report.snapshot(node, owner, tokens)


async def node_gc(max_bytes: int | None, dask_worker: Worker) -> dict[str, Any]:
    """Collect this node's cache down to ``max_bytes`` (``None``: its budget):
    ``{"freed_bytes", "evicted", "cache_bytes"}``."""
    return await node_report.collect(agent_of(dask_worker), max_bytes)


async def node_stop_worker(owner: str, pid: int, dask_worker: Worker) -> bool:
    """Kill environment worker ``pid`` of ``owner``'s pools here; False if it is not one."""
    return await node_report.stop_worker(agent_of(dask_worker), owner, pid)
