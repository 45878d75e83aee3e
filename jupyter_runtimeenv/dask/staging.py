"""Environments as one ``DaskExecutor`` stages them on the nodes of its cluster.

Who calls it: ``DaskExecutor`` (and, through it, ``cluster_build`` and ``cluster_ops``).
Per environment (resolved like ``LocalExecutor`` does, with the driver's ``sys.path``) a
staging thread builds the manifest (``manifest.py``: local content hashed and put in the
driver's blob store) and stages it on every current node (``transfer.py``: each blob leaves
the driver once, nodes copy the rest from each other). ``StagedEnv.prepared`` is done when
that round is; until then tasks wait in the executor. A node that joins later is staged on
its first task (``restage``), from its peers.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import WorkerError
from ..spec import RuntimeEnvSpec, refresh
from ..workers.executor import resolve_driver_sys_path, resolve_for_driver
from .manifest import Manifest, build_manifest

EnvKey = tuple[str, tuple[str, ...] | None]


@dataclass(eq=False)
class StagedEnv:
    """One resolved environment as this executor stages it."""

    spec: RuntimeEnvSpec
    prepared: concurrent.futures.Future[Manifest] = field(default_factory=concurrent.futures.Future)
    #: Nodes that have its manifest and blobs, nodes known to have built it, and why the
    #: nodes that could not take it could not.
    staged: set[str] = field(default_factory=set)
    ready: set[str] = field(default_factory=set)
    errors: dict[str, str] = field(default_factory=dict)
    inflight: int = 0
    restaging: dict[str, concurrent.futures.Future[None]] = field(default_factory=dict)

    @property
    def token(self) -> str | None:
        """The manifest's token, once prepared (``None`` before, or if it failed)."""
        if not self.prepared.done() or self.prepared.exception() is not None:
            return None
        return self.prepared.result().token


class Staging:
    """The staged environments of one executor, its node list and its transfer counters."""

    def __init__(self, client: Any, plugin: Any, store_root: Path) -> None:
        self.client = client
        self.plugin = plugin
        self.store_root = store_root
        self.lock = threading.Lock()
        self.envs: dict[EnvKey, StagedEnv] = {}
        #: Node address -> its Dask worker's threads, from the last look at the scheduler.
        self.threads: dict[str, int] = {}
        self.bytes_sent = 0
        self.blobs_sent = 0
        self.peer_bytes = 0
        #: Seconds spent so far in each phase of staging (manifest, offer, seed, share,
        #: fallback), summed over the envs and rounds.
        self.phases: dict[str, float] = {}
        self.shut = False
        self._pool = concurrent.futures.ThreadPoolExecutor(
            4, thread_name_prefix="jupyter-runtimeenv-dask-stage"
        )
        self._plugin_lock = threading.Lock()
        self._plugin_registered = False

    def submit(self, call: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        return self._pool.submit(call, *args)

    def shutdown(self) -> None:
        with self.lock:
            self.shut = True
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- environments ---------------------------------------------------------------------

    def key_of(self, spec: RuntimeEnvSpec) -> EnvKey:
        # The driver's sys.path as resolve_for_driver sends it (Dask's scratch space left
        # out), so the env's id is the one the notebook and the sidebar know; memoised.
        paths = resolve_driver_sys_path() if spec.driver_sys_path is True else None
        return (spec.env_id, paths)

    def env_for(self, declared: RuntimeEnvSpec) -> StagedEnv:
        """The staged env of ``spec``; the first ask starts staging it on every node."""
        # Local code as it is now: an edit to the working_dir gives a new env for this call
        # (its manifest stores and ships only the changed files).
        spec = refresh(declared)
        key = self.key_of(spec)
        with self.lock:
            if self.shut:
                raise RuntimeError("this executor was shut down")
            env = self.envs.get(key)
            if env is not None and not (env.prepared.done() and env.prepared.exception()):
                return env
            env = self.envs[key] = StagedEnv(resolve_for_driver(spec, key[1]))
        self._pool.submit(self._prepare, env)
        return env

    def env_id_of(self, declared: RuntimeEnvSpec) -> str:
        """The id ``declared`` is staged under (what its builds print), staged or not."""
        known = self.known(declared)
        if known is not None:
            return known.spec.env_id
        spec = refresh(declared)
        return resolve_for_driver(spec, self.key_of(spec)[1]).env_id

    def known(self, spec: RuntimeEnvSpec) -> StagedEnv | None:
        """The staged env of ``spec`` if it was asked for already (nothing is started)."""
        key = self.key_of(refresh(spec))
        with self.lock:
            return self.envs.get(key)

    def by_token(self) -> dict[str, StagedEnv]:
        """Manifest token -> env, for the envs prepared so far."""
        with self.lock:
            envs = list(self.envs.values())
        return {env.token: env for env in envs if env.token is not None}

    def _prepare(self, env: StagedEnv) -> None:
        try:
            self.register_plugin()
            started = time.perf_counter()
            manifest = build_manifest(env.spec, self.store_root)
            with self.lock:
                self.phases["manifest"] = (
                    self.phases.get("manifest", 0.0) + time.perf_counter() - started
                )
            self.stage_nodes(env, manifest, self.nodes())
            if not env.staged:
                address = self.client.scheduler.address
                raise WorkerError(f"no Dask worker of {address} is up")
        except BaseException as exc:
            env.prepared.set_exception(exc)
        else:
            env.prepared.set_result(manifest)

    def register_plugin(self) -> None:
        with self._plugin_lock:
            if not self._plugin_registered:
                self.client.register_plugin(self.plugin)
                self._plugin_registered = True

    def nodes(self) -> list[str]:
        """The cluster's current nodes (Dask worker addresses), sorted; blocking."""
        workers = self.client.scheduler_info(n_workers=-1)["workers"]
        with self.lock:
            for address, info in workers.items():
                self.threads[address] = int(info.get("nthreads", 1))
        return sorted(workers)

    def preferred(self, env: StagedEnv) -> list[str] | None:
        """Nodes where the env is READY while they have threads free for it; else every
        node that has it staged (more nodes build it rather than tasks queue)."""
        with self.lock:
            env.inflight += 1
            capacity = sum(self.threads.get(node, 1) for node in env.ready)
            if env.ready and env.inflight <= capacity:
                return sorted(env.ready)
            return sorted(env.staged) or None

    def stage_nodes(self, env: StagedEnv, manifest: Manifest, nodes: list[str]) -> None:
        """Stage ``env`` on ``nodes`` (peers that have it already share their blobs);
        ``WorkerError`` naming each node's problem when none could take it."""
        from .transfer import stage

        with self.lock:
            peers = sorted(env.staged - set(nodes))
        staged = stage(self.client, manifest, nodes, self.store_root, peers)
        with self.lock:
            self.bytes_sent += staged.bytes_sent
            self.blobs_sent += staged.blobs_sent
            self.peer_bytes += staged.peer_bytes
            for phase, seconds in staged.phases.items():
                self.phases[phase] = self.phases.get(phase, 0.0) + seconds
            env.staged |= staged.nodes
            for node in staged.nodes:
                env.errors.pop(node, None)
            env.errors.update(staged.errors)
        if not staged.nodes and staged.errors:
            problems = "; ".join(f"{node}: {why}" for node, why in sorted(staged.errors.items()))
            raise WorkerError(f"could not stage the environment on the Dask workers: {problems}")

    def restage(self, env: StagedEnv, node: str, then: Callable[[], None]) -> None:
        """``node`` lacks the env (it joined after staging, or its copy was collected): stage
        it there once, however many tasks found it missing, then call ``then``."""
        with self.lock:
            env.staged.discard(node)
            env.ready.discard(node)
            job = env.restaging.get(node)
            if job is None or job.done():
                job = env.restaging[node] = self._pool.submit(
                    self.stage_nodes, env, env.prepared.result(), [node]
                )
        job.add_done_callback(lambda _j: then())
