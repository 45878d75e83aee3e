"""The node agent: one per Dask worker, installed by ``NodeAgentPlugin``.

Who calls it: Dask. ``DaskExecutor`` registers the plugin (``Client.register_plugin``,
idempotent by name, so every executor on a cluster shares it) and Dask runs ``setup`` on
each worker, now and when workers join. The node agent is the same ``RuntimeEnvAgent`` and
cache as on a laptop, with the node's own cache root, on its own loop thread: the Dask
worker's event loop only ever awaits it. Tasks run in our worker ``Pool``s on that node,
one pool per (executor, environment); the Dask worker process sees pickled bytes only
(the call goes in as bytes, the outcome comes back as bytes, unpickled by the driver), so
it never imports a task's packages.

The driver talks to it with ``Client.run`` (out of band, coroutines on the Dask worker's
loop, blocking work in threads): ``node_offer`` (a manifest; returns the blobs the node
lacks), ``node_put`` (blobs), ``node_forget`` (an executor's pools), ``node_info``. Tasks
are ``run_task``, submitted as ordinary Dask tasks; their output lines go back to the
driver as Dask events on the executor's topic, tagged with the task.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import itertools
import logging
import os
import sys
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from distributed import WorkerPlugin, get_worker
from distributed.worker import Worker

from ..agent import RuntimeEnvAgent
from ..agent.cache import default_cache_dir
from ..client import LoopThread
from ..context import EnvContext
from ..errors import BuildError, WorkerError
from ..workers.future import RemoteFuture, Task
from ..workers.output import OutputTarget
from ..workers.pool import Pool
from .manifest import Manifest, materialize_manifest, missing, put_blob

log = logging.getLogger(__name__)

PLUGIN_NAME = "jupyter-runtimeenv-node"
T = TypeVar("T")
_holders = itertools.count(1)


class NotStaged(Exception):
    """This node lacks the environment's manifest or blobs: the driver stages it and
    submits the task again. Never reaches the user."""

    def __init__(self, node: str, token: str) -> None:
        super().__init__(node, token)
        self.node = node
        self.token = token


class NodeAgentPlugin(WorkerPlugin):
    """Starts a ``NodeAgent`` on each Dask worker; stops it (and its workers) on teardown.

    ``cache_dir`` is the node's cache root, formatted with the worker's ``name`` and
    ``id`` (``"/scratch/jre-{name}"``); default: the node's ``$JUPYTER_RUNTIMEENV_CACHE``
    or user cache dir.
    """

    idempotent = True
    name = PLUGIN_NAME

    def __init__(self, cache_dir: str | None = None, idle_timeout: float = 60.0) -> None:
        self.cache_dir = cache_dir
        self.idle_timeout = idle_timeout
        self.node: NodeAgent | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"cache_dir": self.cache_dir, "idle_timeout": self.idle_timeout, "node": None}

    async def setup(self, worker: Worker) -> None:
        root = await asyncio.to_thread(self._root, worker)
        node = NodeAgent(root, worker, self.idle_timeout)
        await node.start()
        self.node = node

    def _root(self, worker: Worker) -> Path:
        if self.cache_dir:
            return Path(self.cache_dir.format(name=worker.name, id=worker.id)).expanduser()
        return default_cache_dir()

    async def teardown(self, worker: Worker) -> None:
        node, self.node = self.node, None
        if node is not None:
            await node.stop()


class NodeAgent:
    """The agent, the staged environments and the worker pools of one Dask worker."""

    def __init__(self, cache_root: Path, worker: Worker, idle_timeout: float) -> None:
        self.cache_root = cache_root
        self.address = str(worker.address)
        self.idle_timeout = idle_timeout
        self.max_workers = max(1, int(worker.state.nthreads))
        self.agent = RuntimeEnvAgent(cache_root)
        self._thread: LoopThread | None = None
        self._lock = threading.Lock()
        self._staged: dict[str, dict[str, Any]] = {}  # token -> spec with node paths
        self._pending: dict[str, Manifest] = {}
        self._pools: dict[tuple[str, str], Pool] = {}  # (executor id, token)
        self._stopped = False

    async def start(self) -> None:
        self._thread = LoopThread(f"jupyter-runtimeenv-node-{os.getpid()}")
        await self._thread.run_async(self.agent.start())

    async def stop(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        await asyncio.to_thread(_close, pools)
        self._stopped = True
        thread, self._thread = self._thread, None
        if thread is not None:
            await thread.run_async(self.agent.stop())
            await asyncio.to_thread(thread.stop)

    # -- staging (coroutines on the Dask worker's loop) ------------------------------------

    async def offer(self, data: dict[str, Any]) -> list[str]:
        """Take a manifest; the blobs still needed (none: it is staged)."""
        manifest = Manifest.from_json(data)
        if manifest.token in self._staged:
            return []
        lacking = await asyncio.to_thread(missing, manifest, self.cache_root)
        if lacking:
            self._pending[manifest.token] = manifest
            return lacking
        await self._stage(manifest)
        return []

    async def put(self, token: str, blobs: dict[str, bytes]) -> list[str]:
        """Store blobs; the blobs ``token`` still needs (none: it is staged)."""
        await asyncio.to_thread(_put_all, self.cache_root, blobs)
        manifest = self._pending.get(token)
        if manifest is None:
            return [] if token in self._staged else ["?manifest"]
        lacking = await asyncio.to_thread(missing, manifest, self.cache_root)
        if not lacking:
            await self._stage(manifest)
        return lacking

    async def _stage(self, manifest: Manifest) -> None:
        spec = await asyncio.to_thread(_node_spec, manifest, self.cache_root)
        with self._lock:
            self._staged[manifest.token] = spec
            self._pending.pop(manifest.token, None)

    async def build(self, token: str) -> str:
        """Build a staged env (and drop the reference taken to do so); its env id here."""
        spec, thread = self._staged.get(token), self._thread
        if spec is None or thread is None:
            raise NotStaged(self.address, token)
        holder = f"dask-prepare:{next(_holders)}"
        try:
            ctx = await thread.run_async(self.agent.get_or_create(spec, holder))
        except BuildError as exc:
            raise _on_node(exc, self.address) from None
        await thread.run_async(self.agent.release(ctx.env_id, holder))
        return ctx.env_id

    async def forget(self, owner: str) -> None:
        """Close the pools of executor ``owner`` (it shut down), releasing their envs."""
        with self._lock:
            mine = [key for key in self._pools if key[0] == owner]
            pools = [self._pools.pop(key) for key in mine]
        await asyncio.to_thread(_close, pools)

    async def on_agent_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the agent's loop thread (the agent's own loop). Called by
        ``node_kernels``."""
        thread = self._thread
        if thread is None or self._stopped:
            coro.close()
            raise WorkerError(f"the node agent of Dask worker {self.address} is stopped")
        return await thread.run_async(coro)

    def spec_of(self, token: str) -> dict[str, Any] | None:
        """The staged spec of ``token`` (node paths), or ``None`` when it is not staged.
        Called by ``node_kernels`` to build a kernel's env with the kernel as holder."""
        with self._lock:
            spec = self._staged.get(token)
        return None if spec is None else dict(spec)

    def info(self) -> dict[str, Any]:
        with self._lock:
            pids = [pid for pool in self._pools.values() for pid in pool.pids]
        return {"cache_root": str(self.cache_root), "staged": sorted(self._staged), "pids": pids}

    # -- tasks (Dask's executor threads) ---------------------------------------------------

    def pool_for(self, owner: str, token: str) -> Pool:
        with self._lock:
            spec = self._staged.get(token)
            thread = self._thread
            if spec is None or thread is None or self._stopped:
                raise NotStaged(self.address, token)
            pool = self._pools.get((owner, token))
            if pool is None or pool.closed:
                pool = self._new_pool(thread, spec, f"dask:{owner[:12]}:{next(_holders)}")
                self._pools[(owner, token)] = pool
            return pool

    def _new_pool(self, thread: LoopThread, spec: dict[str, Any], holder: str) -> Pool:
        agent = self.agent

        def acquire() -> EnvContext:
            return thread.run(agent.get_or_create(spec, holder))

        def release(ctx: EnvContext) -> None:
            if not self._stopped:
                thread.run(agent.release(ctx.env_id, holder), timeout=30)

        return Pool(
            acquire,
            release,
            max_workers=self.max_workers,
            idle_timeout=self.idle_timeout,
            close_when_idle=True,
            name=f"node-pool-{holder}",
        )


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
    owner: str, token: str, payload: bytes, name: str, topic: str, task_id: int
) -> tuple[int, bytes, int, str]:
    """A Dask task: run one call in a worker of this node's pool for ``token``.

    Returns ``(frame kind, outcome bytes, output events sent, this node)``; the driver unpickles the
    outcome. ``BuildError``/``WorkerError`` name this node.
    """
    worker = get_worker()
    node = _node_of(worker, token)
    host = worker.address.split("://", 1)[-1]
    output = NodeOutput(f"{name} node={host}", worker, topic, task_id)
    future: RemoteFuture[tuple[int, bytes]] = RemoteFuture(name)
    task = Task(payload, future, output, raw=True)
    key = worker.get_current_task()
    try:
        while not node.pool_for(owner, token).submit(task):
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
        raise _on_node(exc, str(worker.address)) from None
    except WorkerError as exc:
        raise type(exc)(f"on Dask worker {worker.address}: {exc}") from None
    return kind, data, output.count, str(worker.address)


def _on_node(error: BuildError, node: str) -> BuildError:
    """The same build error, its message naming the node it happened on."""
    return type(error)(
        f"on Dask worker {node}: {error.message}",
        env_id=error.env_id,
        step=error.step,
        output_tail=error.output_tail,
        log_path=error.log_path,
    )


def _node_spec(manifest: Manifest, cache_root: Path) -> dict[str, Any]:
    spec = materialize_manifest(manifest, cache_root)
    python = spec.get("driver_python")
    if isinstance(python, str) and not os.path.exists(python):
        spec["driver_python"] = sys.executable  # the driver's is not on this node
    return spec


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


def _put_all(root: Path, blobs: dict[str, bytes]) -> None:
    for name, data in blobs.items():
        put_blob(root, name, data)


def _close(pools: list[Pool]) -> None:
    for pool in pools:
        pool.close()


# -- what the driver runs with Client.run (coroutines on the worker's loop) ---------------


def _agent_of(dask_worker: Worker) -> NodeAgent:
    node = getattr(dask_worker.plugins.get(PLUGIN_NAME), "node", None)
    if not isinstance(node, NodeAgent):
        raise WorkerError(f"Dask worker {dask_worker.address} has no node agent (plugin missing)")
    return node


async def node_offer(manifest: dict[str, Any], dask_worker: Worker) -> list[str]:
    return await _agent_of(dask_worker).offer(manifest)


async def node_put(token: str, blobs: dict[str, bytes], dask_worker: Worker) -> list[str]:
    return await _agent_of(dask_worker).put(token, blobs)


async def node_forget(owner: str, dask_worker: Worker) -> None:
    node = getattr(dask_worker.plugins.get(PLUGIN_NAME), "node", None)
    if isinstance(node, NodeAgent):
        await node.forget(owner)


async def node_build(token: str, dask_worker: Worker) -> str:
    """Build ``token``'s env on this node now (``DaskExecutor.prepare``); its env id here."""
    return await _agent_of(dask_worker).build(token)


async def node_info(dask_worker: Worker) -> dict[str, Any]:
    return _agent_of(dask_worker).info()
