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
import contextlib
import itertools
import logging
import os
import sys
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

from distributed import WorkerPlugin
from distributed.worker import Worker

from ..agent import DEFAULT_MAX_CACHE_BYTES, RuntimeEnvAgent
from ..agent.cache import default_cache_dir
from ..client import LoopThread
from ..context import EnvContext
from ..errors import BuildError, SpecError, WorkerError
from ..spec import RuntimeEnvSpec
from ..workers.pool import Pool
from . import node_blobs, node_store
from .manifest import Manifest, missing
from .relay import Relay

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
        self._staged: dict[str, dict[str, Any]] = {}  # token -> spec with node paths
        self._uris: dict[str, list[str]] = {}  # token -> the resources it laid out
        self._parsed: dict[str, RuntimeEnvSpec] = {}  # token -> that spec, parsed once
        self._pending: dict[str, Manifest] = {}
        #: Builds and stagings under way; the blob sweep waits for none and blocks new ones.
        self._busy = 0
        self._sweeping = False
        self._quiet = threading.Condition(self.lock)
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
        thread, self.thread = self.thread, None
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
        """Store blobs; the blobs ``token`` still needs (none: it is staged). ``ValueError``
        when one is not what its name says."""
        refused = await asyncio.to_thread(node_blobs.store_blobs, self.cache_root, blobs)
        if refused:
            raise ValueError(f"blobs that are not what their names say: {refused[:3]}")
        manifest = self._pending.get(token)
        if manifest is None:
            return [] if token in self._staged else ["?manifest"]
        lacking = await asyncio.to_thread(missing, manifest, self.cache_root)
        if not lacking:
            await self._stage(manifest)
        return lacking

    async def fetch(self, token: str, holders: dict[str, list[str]]) -> dict[str, Any]:
        """Fetch the blobs ``token`` still needs from the peers ``holders`` names (blob ->
        addresses). ``{"lacking": [...], "peer_bytes": n}``: no lacking blob means staged."""
        manifest = self._pending.get(token)
        if manifest is None:
            lacking = [] if token in self._staged else ["?manifest"]
            return {"lacking": lacking, "peer_bytes": 0}
        lacking = await asyncio.to_thread(missing, manifest, self.cache_root)
        sizes = manifest.blobs()
        got = await node_blobs.fetch(
            self.worker.rpc,
            self.cache_root,
            {name: sizes[name] for name in lacking if name in holders},
            holders,
            self.address,
        )
        lacking = await asyncio.to_thread(missing, manifest, self.cache_root)
        if not lacking:
            await self._stage(manifest)
        return {"lacking": lacking, "peer_bytes": got.peer_bytes}

    async def _stage(self, manifest: Manifest) -> None:
        spec, uris = await asyncio.to_thread(self._place, manifest)
        with self.lock:
            self._staged[manifest.token] = spec
            self._uris[manifest.token] = uris
            self._parsed.pop(manifest.token, None)
            self._pending.pop(manifest.token, None)

    def _place(self, manifest: Manifest) -> tuple[dict[str, Any], list[str]]:
        with self.busy():
            spec, uris = node_store.place(manifest, self.agent.cache)
        python = spec.get("driver_python")
        if isinstance(python, str) and not os.path.exists(python):
            spec["driver_python"] = sys.executable  # the driver's is not on this node
        return spec, uris

    def unstage(self, token: str) -> None:
        """Forget a staged env (its files were collected): the next task restages it."""
        with self.lock:
            self._staged.pop(token, None)
            self._uris.pop(token, None)
            self._parsed.pop(token, None)

    def pending_blobs(self) -> set[str]:
        """The blobs transfers under way wait for (never swept)."""
        with self.lock:
            manifests = list(self._pending.values())
        return {name for manifest in manifests for name in manifest.blobs()}

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Around work that stores or links blobs (blocking: waits while a sweep runs)."""
        self.enter_busy()
        try:
            yield
        finally:
            self.leave_busy()

    def enter_busy(self) -> None:
        with self._quiet:
            while self._sweeping:
                self._quiet.wait()
            self._busy += 1

    def leave_busy(self) -> None:
        with self._quiet:
            self._busy -= 1
            self._quiet.notify_all()

    @contextlib.contextmanager
    def sweeping(self) -> Iterator[bool]:
        """Around the blob sweep: yields False (do not sweep) while anything is busy."""
        with self._quiet:
            if self._busy or self._sweeping:
                yield False
                return
            self._sweeping = True
        try:
            yield True
        finally:
            with self._quiet:
                self._sweeping = False
                self._quiet.notify_all()

    async def trim(self, max_bytes: int | None = None) -> list[str]:
        """Collect this node's cache down to ``max_bytes`` (default: its budget), least
        recently used first:
        resources nobody holds (venvs, copies, laid-out trees: the agent's LRU GC), then blobs
        nothing links any more. Staged envs whose trees went are unstaged (their next task
        stages them again, from peers). Returns the evicted resources' URIs."""
        thread = self.thread
        if thread is None:
            return []
        limit = self.max_bytes if max_bytes is None else max_bytes
        evicted = await thread.run_async(self.agent.gc(limit))
        await asyncio.to_thread(self._unstage_collected)
        await asyncio.to_thread(self._sweep, limit)
        return [str(item["uri"]) for item in evicted]

    def _unstage_collected(self) -> None:
        with self.lock:
            uris = dict(self._uris)
        for token, needs in uris.items():
            if not node_store.present(self.agent.cache, needs):
                self.unstage(token)

    def _sweep(self, limit: int) -> int:
        with self.sweeping() as clear:
            if not clear:
                return 0  # a build or transfer is linking blobs now: the next trim sweeps
            return node_store.sweep_blobs(self.agent.cache, self.pending_blobs(), limit)

    def linked(self, token: str, env_id: str) -> None:
        """The env ``env_id`` was built from ``token``'s trees: tie them to it (kept while
        it is held, collected with it) and mark them used now. Blocking."""
        with self.lock:
            uris = list(self._uris.get(token, ()))
        if uris:
            cache = self.agent.cache
            cache.link_resources(env_id, uris)
            cache.touch(uris)

    def staged(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            return dict(self._staged)

    def parsed(self, token: str) -> RuntimeEnvSpec:
        """The staged env of ``token``, parsed once (its local trees hashed once); blocking.
        ``NotStaged`` when it is not staged here, or its files are gone (collected)."""
        with self.lock:
            spec, parsed = self._staged.get(token), self._parsed.get(token)
            uris = list(self._uris.get(token, ()))
        if spec is None or self.stopped:
            raise NotStaged(self.address, token)
        if not node_store.present(self.agent.cache, uris):  # collected: stage it again
            self.unstage(token)
            raise NotStaged(self.address, token)
        if parsed is not None:
            return parsed
        try:
            parsed = self.agent.parse(spec)
        except SpecError:  # a path of the staged spec was collected meanwhile
            self.unstage(token)
            raise NotStaged(self.address, token) from None
        with self.lock:
            if token in self._staged:
                self._parsed[token] = parsed
        return parsed

    def env_id_of(self, token: str) -> str | None:
        """The env id of a staged env on this node, if it was parsed (no work done)."""
        with self.lock:
            parsed = self._parsed.get(token)
        return parsed.env_id if parsed is not None else None

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
            await asyncio.to_thread(self.enter_busy)  # never blocks the Dask worker's loop
            try:
                ctx = await thread.run_async(self.agent.get_or_create(spec, holder))
            finally:
                self.leave_busy()
            await asyncio.to_thread(self.linked, token, ctx.env_id)
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
            if pool is not None and not pool.closed and token in self._staged:
                return pool
        spec = self.parsed(token)  # blocking, outside the lock: a first parse hashes trees
        with self.lock:
            thread = self.thread
            if thread is None or self.stopped or token not in self._staged:
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
            with self.busy():
                ctx = thread.run(agent.get_or_create(spec, holder))
            self.linked(token, ctx.env_id)
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
        with self.lock:
            spec = self._staged.get(token)
        return None if spec is None else dict(spec)

    def info(self) -> dict[str, Any]:
        with self.lock:
            pids = [pid for pool in self.pools.values() for pid in pool.pids]
        return {"cache_root": str(self.cache_root), "staged": sorted(self._staged), "pids": pids}


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
