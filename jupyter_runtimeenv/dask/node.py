"""The node agent: one per Dask worker, installed by ``NodeAgentPlugin``.

Who calls it: Dask. ``DaskExecutor`` registers the plugin (``Client.register_plugin``,
idempotent by name, so every executor on a cluster shares it) and Dask runs ``setup`` on
each worker, now and when workers join. The node agent is the same ``RuntimeEnvAgent`` and
cache as on a laptop, with the node's own cache root and byte budget, on its own loop
thread: the Dask worker's event loop only ever awaits it. Tasks run in our worker ``Pool``s
on that node, one pool per (executor, environment); the Dask worker process sees pickled
bytes only (the call goes in as bytes, the outcome comes back as bytes, unpickled by the
driver), so it never imports a task's packages.

The driver reaches it through ``node_ops`` (``Client.run`` coroutines on the Dask worker's
loop, blocking work in threads, and the ``run_task`` Dask task); peers fetch its blobs
through the ``jre_blobs`` comm handler (``node_blobs``). Its report, GC and worker stop
are in ``node_report``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from distributed import WorkerPlugin
from distributed.worker import Worker

from ..agent import DEFAULT_MAX_CACHE_BYTES, RuntimeEnvAgent
from ..agent.cache import default_cache_dir
from ..client import LoopThread
from ..context import EnvContext
from ..errors import BuildError, WorkerError
from ..spec import RuntimeEnvSpec
from ..workers import files
from ..workers.pool import Pool
from . import node_blobs
from .node_staging import NodeStaging
from .node_staging import NotStaged as NotStaged  # where the driver and node_kernels look
from .relay import Relay

log = logging.getLogger(__name__)

PLUGIN_NAME = "jupyter-runtimeenv-node"
T = TypeVar("T")
_holders = itertools.count(1)


class NodeAgentPlugin(WorkerPlugin):
    """Starts a ``NodeAgent`` on each Dask worker; stops it (and its workers) on teardown.

    ``cache_dir`` is the node's cache root, formatted with the worker's ``name`` and
    ``id`` (``"/scratch/jre-{name}"``); default: the node's ``$JUPYTER_RUNTIMEENV_CACHE``
    or user cache dir. ``max_bytes`` is the node cache's budget (LRU GC past it).
    """

    idempotent = True
    name = PLUGIN_NAME

    def __init__(
        self,
        cache_dir: str | None = None,
        idle_timeout: float = 60.0,
        max_bytes: int = DEFAULT_MAX_CACHE_BYTES,
    ) -> None:
        self.cache_dir = cache_dir
        self.idle_timeout = idle_timeout
        self.max_bytes = max_bytes
        self.node: NodeAgent | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "cache_dir": self.cache_dir,
            "idle_timeout": self.idle_timeout,
            "max_bytes": self.max_bytes,
            "node": None,
        }

    async def setup(self, worker: Worker) -> None:
        root = await asyncio.to_thread(self._root, worker)
        node = NodeAgent(root, worker, self.idle_timeout, self.max_bytes)
        await node.start()
        self.node = node
        # Peers fetch this node's blobs through Dask's worker-to-worker comms.
        worker.handlers[node_blobs.HANDLER] = self._serve_blobs

    async def _serve_blobs(self, names: list[str] | tuple[str, ...]) -> dict[str, bytes]:
        node = self.node
        if node is None or not isinstance(names, list | tuple):  # msgpack gives tuples
            return {}
        return await asyncio.to_thread(node_blobs.read_blobs, node.cache_root, list(names[:10_000]))

    def _root(self, worker: Worker) -> Path:
        if self.cache_dir:
            return Path(self.cache_dir.format(name=worker.name, id=worker.id)).expanduser()
        return default_cache_dir()

    async def teardown(self, worker: Worker) -> None:
        node, self.node = self.node, None
        worker.handlers.pop(node_blobs.HANDLER, None)
        if node is not None:
            await node.stop()


class NodeAgent:
    """The agent, the staged environments and the worker pools of one Dask worker."""

    def __init__(
        self,
        cache_root: Path,
        worker: Worker,
        idle_timeout: float,
        max_bytes: int = DEFAULT_MAX_CACHE_BYTES,
    ) -> None:
        self.cache_root = cache_root
        self.address = str(worker.address)
        self.worker = worker
        self.idle_timeout = idle_timeout
        self.max_bytes = max_bytes
        self.max_workers = max(1, int(worker.state.nthreads))
        self.agent = RuntimeEnvAgent(cache_root, max_cache_bytes=max_bytes)
        self.thread: LoopThread | None = None
        self.lock = threading.Lock()
        agent = self.agent
        self.staging = NodeStaging(self.address, lambda: agent.cache, agent.parse, worker.rpc)
        self.pools: dict[tuple[str, str], Pool] = {}  # (executor id, token)
        self.stopped = False

    async def start(self) -> None:
        self.thread = LoopThread(f"jupyter-runtimeenv-node-{os.getpid()}")
        await self.thread.run_async(self.agent.start())

    async def stop(self) -> None:
        with self.lock:
            pools, self.pools = list(self.pools.values()), {}
        await asyncio.to_thread(_close, pools)
        self.stopped = True
        self.staging.closed = True
        thread, self.thread = self.thread, None
        if thread is not None:
            await thread.run_async(self.agent.stop())
            await asyncio.to_thread(thread.stop)

    # -- staging (``NodeStaging``; what the driver and peers call) ---------------------------

    async def offer(self, data: dict[str, Any]) -> list[str]:
        """Take a manifest; the blobs still needed (none: it is staged)."""
        return await self.staging.offer(data)

    async def put(self, token: str, blobs: dict[str, bytes]) -> list[str]:
        return await self.staging.put(token, blobs)

    async def fetch(self, token: str, holders: dict[str, list[str]]) -> dict[str, Any]:
        return await self.staging.fetch(token, holders)

    def staged(self) -> dict[str, dict[str, Any]]:
        return self.staging.staged()

    def parsed(self, token: str) -> RuntimeEnvSpec:
        return self.staging.parsed(token)

    def env_id_of(self, token: str) -> str | None:
        return self.staging.env_id_of(token)

    # The blob sweep's guard and the trees' ties to their env, for builds made elsewhere
    # (``node_kernels``) as for the node's own.

    def enter_busy(self) -> None:
        self.staging.enter_busy()

    def leave_busy(self) -> None:
        self.staging.leave_busy()

    def linked(self, token: str, env_id: str) -> None:
        self.staging.linked(token, env_id)

    async def trim(self, max_bytes: int | None = None) -> list[str]:
        """Collect this node's cache down to ``max_bytes`` (default: its budget), least
        recently used first: resources nobody holds (venvs, copies, laid-out trees: the
        agent's LRU GC), then blobs nothing links any more. Staged envs whose trees went are
        unstaged (their next task stages them again, from peers). The evicted URIs."""
        thread = self.thread
        if thread is None:
            return []
        limit = self.max_bytes if max_bytes is None else max_bytes
        evicted = await thread.run_async(self.agent.gc(limit))
        await asyncio.to_thread(self.staging.unstage_collected)
        await asyncio.to_thread(self.staging.sweep, limit)
        return [str(item["uri"]) for item in evicted]

    # -- building ---------------------------------------------------------------------------

    async def build(
        self, token: str, build: str | None = None, topic: str | None = None
    ) -> dict[str, Any]:
        """Build a staged env (and drop the reference taken to do so): ``{"env_id", "batches"}``
        (its env id here; how many event batches went to ``topic`` for ``build``). A failed
        build raises its ``BuildError`` (naming this node), or with ``build`` answers
        ``{"error": BuildError, "batches"}``."""
        thread = self.thread
        if thread is None:
            raise NotStaged(self.address, token)
        spec = await asyncio.to_thread(self.parsed, token)
        holder = f"dask-prepare:{next(_holders)}"
        relay = None
        remove = None
        flusher = None
        if build is not None and topic is not None:
            relay = Relay(self.worker, topic, build, self.address, spec.env_id)
            remove = self.agent.add_listener(relay.take)
            flusher = asyncio.create_task(relay.run())
        try:
            await asyncio.to_thread(self.staging.enter_busy)  # never blocks the worker's loop
            try:
                ctx = await thread.run_async(self.agent.get_or_create(spec, holder))
            finally:
                self.staging.leave_busy()
            await asyncio.to_thread(self.staging.linked, token, ctx.env_id)
        except BuildError as exc:
            error = on_node(exc, self.address)
            if relay is None:
                raise error from None
            # Its last events first, then the error and how many batches there were (an
            # answer, not a raise: Dask drops an exception's attributes on the way back).
            if remove is not None:
                remove()
            if flusher is not None:
                flusher.cancel()
            relay.flush()
            return {"error": error, "batches": relay.sent}
        finally:
            if remove is not None:
                remove()
            if flusher is not None:
                flusher.cancel()
            if relay is not None:
                relay.flush()
        try:
            await self.trim()  # within the budget, the env just built still held
        except Exception:  # collecting must never fail a build that succeeded
            log.warning("jupyter-runtimeenv: node GC failed on %s", self.address, exc_info=True)
        finally:
            await thread.run_async(self.agent.release(ctx.env_id, holder))
        return {"env_id": ctx.env_id, "batches": relay.sent if relay is not None else 0}

    # -- pools (Dask's executor threads) -----------------------------------------------------

    def pool_for(self, owner: str, token: str) -> Pool:
        with self.lock:
            pool = self.pools.get((owner, token))
        if pool is not None and not pool.closed and self.staging.spec_of(token) is not None:
            return pool
        spec = self.parsed(token)  # blocking, outside the lock: a first parse hashes trees
        with self.lock:
            thread = self.thread
            if thread is None or self.stopped or self.staging.spec_of(token) is None:
                raise NotStaged(self.address, token)
            pool = self.pools.get((owner, token))
            if pool is None or pool.closed:
                holder = f"dask:{owner[:12]}:{next(_holders)}"
                pool = self._new_pool(thread, token, spec, holder)
                self.pools[(owner, token)] = pool
            return pool

    def _new_pool(self, thread: LoopThread, token: str, spec: RuntimeEnvSpec, holder: str) -> Pool:
        agent = self.agent

        def acquire() -> EnvContext:
            with self.staging.busy():
                ctx = thread.run(agent.get_or_create(spec, holder))
            self.staging.linked(token, ctx.env_id)
            files.arm(ctx)  # what its tasks write in their working directory can be told
            return ctx

        def release(ctx: EnvContext) -> None:
            if not self.stopped:
                thread.run(agent.release(ctx.env_id, holder), timeout=30)

        return Pool(
            acquire,
            release,
            max_workers=self.max_workers,
            idle_timeout=self.idle_timeout,
            close_when_idle=True,
            name=f"node-pool-{holder}",
        )

    async def prestart(self, owner: str, token: str) -> bool:
        """Start one environment worker of ``owner``'s pool for ``token`` now (the first
        task then skips the interpreter start); False when the env is not staged here."""
        try:
            pool = await asyncio.to_thread(self.pool_for, owner, token)
        except NotStaged:
            return False
        await asyncio.to_thread(pool.prestart)
        return True

    async def forget(self, owner: str) -> None:
        """Close the pools of executor ``owner`` (it shut down), releasing their envs."""
        with self.lock:
            mine = [key for key in self.pools if key[0] == owner]
            pools = [self.pools.pop(key) for key in mine]
        await asyncio.to_thread(_close, pools)

    async def on_agent_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the agent's loop thread (the agent's own loop). Called by
        ``node_kernels``."""
        thread = self.thread
        if thread is None or self.stopped:
            coro.close()
            raise WorkerError(f"the node agent of Dask worker {self.address} is stopped")
        return await thread.run_async(coro)

    def spec_of(self, token: str) -> dict[str, Any] | None:
        """The staged spec of ``token`` (node paths), or ``None`` when it is not staged.
        Called by ``node_kernels`` to build a kernel's env with the kernel as holder."""
        return self.staging.spec_of(token)

    def info(self) -> dict[str, Any]:
        with self.lock:
            pids = [pid for pool in self.pools.values() for pid in pool.pids]
        staged = sorted(self.staging.staged())
        return {"cache_root": str(self.cache_root), "staged": staged, "pids": pids}


def on_node(error: BuildError, node: str) -> BuildError:
    """The same build error, its message naming the node it happened on."""
    return type(error)(
        f"on Dask worker {node}: {error.message}",
        env_id=error.env_id,
        step=error.step,
        output_tail=error.output_tail,
        log_path=error.log_path,
    )


def _close(pools: list[Pool]) -> None:
    for pool in pools:
        pool.close()
