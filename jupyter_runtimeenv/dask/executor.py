"""``DaskExecutor``: remote calls on a Dask cluster, in the same environments, built on nodes.

Who calls it: ``RemoteFunction.remote`` (through ``init(executor=client)``), the
``%runtime_env`` magic (``build_on_nodes``, ``prestart``), the kernel's report, and users
who make one directly. The driver side of the design, by concern:

- ``staging.py``: each environment's manifest, staged on every node (``transfer.py``);
- this module: tasks. A task is one Dask task (``node_ops.run_task``) carrying the pickled
  call as bytes, with a loose preference for nodes where the env is known READY. A node
  that lacks the env (it joined later) answers ``NotStaged``: it is staged there and the
  task sent again. Outcomes come back as bytes and are unpickled here, into the same values
  and ``RemoteTaskError``s as locally; output lines arrive as Dask events on the executor's
  topic and are written, in the submitting cell's context, before the result is handed out.
  A node lost while running a task: ``BrokenWorker`` naming it (Dask's own rescheduling is
  cut short), unless the call was made with ``retries``, which Dask then spends;
- ``cluster_build.py``: ``build_on_nodes``, the eager build on every node with a row each;
- ``cluster_ops.py``: what the kernel's report, the sidebar and ``progress`` ask of the
  cluster (report, GC, stopping a worker, prestart, where futures run);
- ``watch.py``: worker removals from the scheduler, fanned out to executors.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..agent.cache import default_cache_dir
from ..agent.core import DEFAULT_MAX_CACHE_BYTES
from ..errors import BrokenWorker, RuntimeEnvError, WorkerError
from ..spec import RuntimeEnvSpec
from ..workers import files
from ..workers.cluster import ClusterBuild, ClusterExecutor, ClusterFuture, NodeView
from ..workers.output import OutputTarget
from ..workers.serialize import dump_call, load_outcome
from ..workers.tracebacks import code_files
from . import watch
from .staging import StagedEnv, Staging

INSTALL_HINT = "pip install 'jupyter-runtimeenv[dask]'"
#: How long a finished task's result waits for output lines still in flight.
OUTPUT_GRACE = 2.0
#: How often one task may land on nodes that lack its environment before it fails.
MAX_RESTAGES = 3

_task_ids = itertools.count(1)


def require_distributed() -> Any:
    """The ``distributed`` module, or an ``ImportError`` that says what to install."""
    try:
        import distributed
    except ImportError as exc:
        raise ImportError(
            f"running remote functions on Dask needs the 'distributed' package: {INSTALL_HINT}"
        ) from exc
    return distributed


@dataclass(eq=False)
class _Pending:
    """One submitted call until its future is settled."""

    future: ClusterFuture
    target: OutputTarget
    name: str
    task_id: int
    payload: bytes
    sources: dict[str, str]
    retries: int
    dask: Any = None
    key: str = ""
    outcome: tuple[int, bytes] | None = None
    expected: int = 0
    received: int = 0
    settled: bool = False
    restaged: int = 0
    #: ``files_out`` patterns, where they go (the submitter's working directory), and what
    #: the call wrote (``FilesWritten``) once it is known.
    files_out: tuple[str, ...] = ()
    here: str = ""
    files: Any = None


class DaskExecutor(ClusterExecutor):
    """Runs ``remote`` calls on the Dask cluster of ``client`` (a ``distributed.Client``
    or a scheduler address, for which a client is made and closed with the executor).

    ``node_cache_dir``: each node's cache root, formatted with the Dask worker's ``name``
    and ``id`` (default: the node's own default). ``node_max_bytes``: each node's cache
    budget, collected least recently used first past it (default: as the local cache's).
    ``driver_cache_dir``: where the driver keeps the blobs it ships (default: the local
    cache root). ``idle_timeout``: seconds before an idle environment worker on a node
    stops. The node settings are the cluster's: the first executor to register the node
    agent on a cluster sets them.
    """

    def __init__(
        self,
        client: Any,
        *,
        node_cache_dir: str | None = None,
        node_max_bytes: int = DEFAULT_MAX_CACHE_BYTES,
        driver_cache_dir: str | Path | None = None,
        idle_timeout: float = 60.0,
    ) -> None:
        distributed = require_distributed()
        from .node import NodeAgentPlugin

        if not isinstance(node_max_bytes, int) or isinstance(node_max_bytes, bool):
            raise TypeError(f"node_max_bytes: expected a byte count, got {node_max_bytes!r}")
        if node_max_bytes < 0:
            raise ValueError(f"node_max_bytes: expected a byte count >= 0, got {node_max_bytes}")
        self._owns_client = isinstance(client, str)
        if self._owns_client:
            client = distributed.Client(client, set_as_default=False)
        elif not isinstance(client, distributed.Client):
            raise TypeError(
                f"DaskExecutor expects a distributed.Client or a scheduler address,"
                f" got {type(client).__name__}"
            )
        self.client = client
        self.id = uuid.uuid4().hex
        self.topic = f"jupyter-runtimeenv-output-{self.id}"
        self.store_root = Path(driver_cache_dir) if driver_cache_dir else default_cache_dir()
        self.node_max_bytes = node_max_bytes
        plugin = NodeAgentPlugin(node_cache_dir, idle_timeout, node_max_bytes)
        self._staging = Staging(client, plugin, self.store_root)
        self._pending: dict[int, _Pending] = {}
        self._by_key: dict[str, _Pending] = {}
        #: Build id -> what receives that cluster build's node events (``cluster_build``).
        self.builds: dict[str, Callable[[dict[str, Any]], None]] = {}
        self._shut = False
        client.subscribe_topic(self.topic, self._on_event)
        watch.watch(client, self)

    def __repr__(self) -> str:
        envs = len(self._staging.envs)
        return f"<DaskExecutor {self.client.scheduler.address} envs={envs}>"

    @property
    def bytes_sent(self) -> int:
        """Blob bytes the driver sent to nodes since this executor was made."""
        return self._staging.bytes_sent

    @property
    def blobs_sent(self) -> int:
        return self._staging.blobs_sent

    @property
    def peer_bytes(self) -> int:
        """Blob bytes nodes copied from each other (instead of from the driver)."""
        return self._staging.peer_bytes

    @property
    def staging(self) -> Staging:
        return self._staging

    def env_id_of(self, runtime_env: RuntimeEnvSpec) -> str:
        return self._staging.env_id_of(runtime_env)

    # -- the Executor contract -----------------------------------------------------------

    def submit(
        self,
        function: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        *,
        runtime_env: RuntimeEnvSpec,
        name: str,
        retries: int = 0,
        files_out: Sequence[str] = (),
    ) -> ClusterFuture:
        future = ClusterFuture(name, self)
        task_id = next(_task_ids)
        payload = dump_call(task_id, function, args, kwargs, name)  # may raise at once
        pending = _Pending(
            future,
            OutputTarget.capture(name),
            name,
            task_id,
            payload,
            code_files(function),
            retries,
            files_out=tuple(files_out),
            here=os.getcwd(),  # beside the notebook: where files_out go
        )
        env = self._staging.env_for(runtime_env)
        self._pending[task_id] = pending
        future.set_cancel_hook(lambda _f: self._cancel(pending))
        future.add_done_callback(lambda _f: self.changed())
        env.prepared.add_done_callback(lambda _f: self._send(env, pending))
        self.changed()
        return future

    def shutdown(self) -> None:
        if self._shut:
            return
        self._shut = True
        for each in list(self._pending.values()):
            each.future.cancel()
        self._staging.shutdown()
        watch.unwatch(self.client, self)
        if self.client.status == "running":
            from .node_ops import node_forget

            try:
                self.client.run(node_forget, self.id, on_error="ignore")
                self.client.unsubscribe_topic(self.topic)
            except Exception:  # the cluster is going away; its workers end with it
                pass
        if self._owns_client:
            self.client.close()

    def prestart(self, runtime_env: RuntimeEnvSpec) -> None:
        """Start one environment worker on every node that has ``runtime_env`` staged, in
        the background (``%runtime_env`` calls it after the build)."""
        from .cluster_ops import prestart

        if not self._shut:
            prestart(self, runtime_env)

    # -- the ClusterExecutor contract -----------------------------------------------------

    def build_on_nodes(
        self, runtime_env: RuntimeEnvSpec, view: NodeView | None = None
    ) -> ClusterBuild:
        from .cluster_build import build_on_nodes

        return build_on_nodes(self, runtime_env, view)

    def locate(self, futures: Sequence[Future[Any]]) -> dict[int, str]:
        from .cluster_ops import locate

        return locate(self, futures, self._by_key)

    def cluster_report(self) -> dict[str, Any]:
        from .cluster_ops import cluster_report

        return cluster_report(self)

    def stop_worker(self, node: str, pid: int) -> None:
        from .cluster_ops import stop_worker

        stop_worker(self, node, pid)

    def gc(self, max_bytes: int | None = None) -> dict[str, int]:
        from .cluster_ops import gc

        if max_bytes is not None and (
            not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0
        ):
            raise ValueError(f"max_bytes: expected a byte count >= 0, got {max_bytes!r}")
        return gc(self, max_bytes)

    def states_on_nodes(self, runtime_env: RuntimeEnvSpec) -> dict[str, str] | None:
        """Node -> the env's state there, for an env this executor staged; ``None`` for one
        it never saw (``%runtime_env --list``)."""
        from .cluster_ops import states_on_nodes

        return states_on_nodes(self, runtime_env)

    # -- eager preparation ------------------------------------------------------------------

    def prepare(
        self, runtime_env: RuntimeEnvSpec | Mapping[str, Any] | None = None
    ) -> dict[str, str]:
        """Stage ``runtime_env`` (default: the session's) on every node and build it there.

        Returns node address -> env id on that node. Raises the first node's ``BuildError``
        (naming the node). After this the driver's local directories may go away.
        """
        built = self.build_on_nodes(self._spec_of(runtime_env))
        for row in built.rows:
            if row.state != "READY":
                raise built.errors.get(row.address) or WorkerError(
                    f"on Dask worker {row.address}: {(row.error or {}).get('message')}"
                )
        return {row.address: row.env_id for row in built.rows}

    def stage(self, runtime_env: RuntimeEnvSpec | Mapping[str, Any]) -> list[str]:
        """Stage ``runtime_env`` on every current node without building it: its local
        content is hashed here and each blob sent once to the cluster (the nodes share it).
        Returns the nodes that have it. Raises the staging error (naming the nodes)."""
        env = self._staging.env_for(self._spec_of(runtime_env))
        env.prepared.result()
        with self._staging.lock:
            return sorted(env.staged)

    def _spec_of(self, runtime_env: RuntimeEnvSpec | Mapping[str, Any] | None) -> RuntimeEnvSpec:
        from ..session import default_runtime_env
        from ..spec import merge, parse

        if runtime_env is None:
            return default_runtime_env() or parse({})
        if isinstance(runtime_env, RuntimeEnvSpec):
            return runtime_env
        return merge(default_runtime_env(), parse(dict(runtime_env)))

    # -- sending and collecting -------------------------------------------------------------

    def _send(self, env: StagedEnv, pending: _Pending) -> None:
        """Submit the Dask task (any thread). Settles the future if the env cannot be had."""
        if pending.future.done():
            return
        error = env.prepared.exception()
        if error is not None:
            self._fail(pending, error)
            return
        from .node_ops import run_task

        manifest = env.prepared.result()
        preferred = self._staging.preferred(env)
        pending.key = f"{pending.name}-{uuid.uuid4().hex}"
        try:
            dask_future = self.client.submit(
                run_task,
                self.id,
                manifest.token,
                pending.payload,
                pending.name,
                self.topic,
                pending.task_id,
                list(pending.files_out) or None,
                key=pending.key,
                pure=False,
                workers=preferred,
                allow_other_workers=True,
                retries=pending.retries or None,
            )
        except Exception as exc:
            with self._staging.lock:
                env.inflight -= 1
            self._fail(pending, WorkerError(f"{pending.name}: cannot submit to Dask: {exc}"))
            return
        pending.dask = dask_future
        self._by_key[pending.key] = pending
        pending.future.mark_started()
        loop = self.client.loop.asyncio_loop
        asyncio.run_coroutine_threadsafe(self._collect(env, pending, dask_future), loop)

    async def _collect(self, env: StagedEnv, pending: _Pending, dask_future: Any) -> None:
        """On the client's loop: wait for the Dask task, then settle (or resend)."""
        from distributed import KilledWorker

        from .node import NotStaged

        answer = await dask_future._result(raiseit=False)
        with self._staging.lock:
            env.inflight -= 1
        status = dask_future.status
        self._by_key.pop(pending.key, None)
        pending.dask = None
        dask_future.release()
        if status == "finished":
            kind, data, count, node, written = answer
            pending.future.node = node
            if written is not None:  # copy back what files_out selects, before settling
                pending.files = await asyncio.to_thread(self._files_back, pending, node, written)
            with self._staging.lock:
                env.ready.add(node)
            pending.outcome, pending.expected = (kind, data), count
            if pending.received >= count:
                self._settle(pending)
            else:  # its last lines are still on their way (events travel apart)
                asyncio.get_running_loop().call_later(OUTPUT_GRACE, self._settle, pending)
            return
        error = answer[1] if status == "error" else None
        if isinstance(error, NotStaged) and pending.restaged < MAX_RESTAGES:
            pending.restaged += 1
            self._staging.restage(env, error.node, lambda: self._send(env, pending))
        elif isinstance(error, NotStaged):
            self._fail(
                pending,
                WorkerError(
                    f"{pending.name}: Dask worker {error.node} could not"
                    " get the environment (see the worker's log)"
                ),
            )
        elif isinstance(error, KilledWorker):
            where = getattr(error.last_worker, "address", "a Dask worker")
            self._fail(pending, BrokenWorker(f"{pending.name}: Dask worker {where} died: {error}"))
        elif isinstance(error, RuntimeEnvError):
            self._fail(pending, error)
        elif error is not None:
            self._fail(
                pending,
                WorkerError(f"{pending.name} failed on Dask: {type(error).__name__}: {error}"),
            )
        elif not pending.future.done():
            self._fail(pending, BrokenWorker(f"{pending.name}: Dask cancelled the task"))

    def _files_back(self, pending: _Pending, node: str, report: dict[str, Any]) -> Any:
        """What the call wrote on ``node``; the files ``files_out`` selected fetched by content
        (the blobs this driver's store lacks, from that node, sha256-checked) and copied
        beside the notebook. Blocking (a thread); a failure is told in the task's line."""
        from .node_blobs import store_blobs
        from .node_ops import node_blobs_of

        written = files.FilesWritten.from_json(report)
        listing = report.get("listing") or []
        if not listing:
            return written
        store = self._staging.store_root
        try:
            lacking = files.lacking(listing, store)
            if lacking:
                got = self.client.run(node_blobs_of, lacking, workers=[node]).get(node, {})
                refused = set(store_blobs(store, got))
                missing = [n for n in lacking if n not in got or n in refused]
                if missing:
                    raise WorkerError(f"{len(missing)} file(s) did not arrive intact from {node}")
            copied = files.place(listing, store, pending.here)
        except Exception as exc:
            return files.with_copies(written, (), pending.here, error=str(exc))
        return files.with_copies(written, copied, pending.here)

    def _settle(self, pending: _Pending) -> None:
        if pending.settled or pending.outcome is None:
            return
        pending.settled = True
        self._pending.pop(pending.task_id, None)
        if pending.files is not None:
            pending.future.files = pending.files
            if pending.files:
                pending.target.write(1, f"({pending.name}) {pending.files.line()}\n")
        kind, data = pending.outcome
        try:
            value = load_outcome(kind, data, pending.task_id, pending.name, pending.sources)
        except Exception as exc:
            pending.future.settle_exception(exc)
        else:
            pending.future.settle_result(value)

    def _fail(self, pending: _Pending, error: BaseException) -> None:
        pending.settled = True
        self._pending.pop(pending.task_id, None)
        pending.future.settle_exception(error)

    def _cancel(self, pending: _Pending) -> None:
        """The cancel hook of a task's future: cancel its Dask task (its node kills the
        worker process running it)."""
        self._pending.pop(pending.task_id, None)
        dask_future = pending.dask
        if dask_future is not None:
            dask_future.cancel()

    def _on_event(self, event: tuple[float, dict[str, Any]]) -> None:
        """On the client's loop: a task's output lines, or a cluster build's node events."""
        message = event[1]
        if "build" in message:
            receive = self.builds.get(str(message["build"]))
            if receive is not None:
                receive(message)
            return
        pending = self._pending.get(message.get("task", -1))
        if pending is None:
            return
        pending.target.write(int(message["stream"]), str(message["text"]))
        pending.received += 1
        if pending.outcome is not None and pending.received >= pending.expected:
            self._settle(pending)

    def on_lost(self, node: str, keys: set[str]) -> None:
        """On the client's loop: ``node`` left the cluster while running ``keys``. Calls
        without retries fail now, naming it (Dask would run them again elsewhere)."""
        for key in keys:
            pending = self._by_key.get(key)
            if pending is None or pending.retries:
                continue
            self._by_key.pop(key, None)
            dask_future, pending.dask = pending.dask, None
            pending.future.node = node
            self._fail(
                pending,
                BrokenWorker(f"{pending.name}: Dask worker {node} was lost while running it"),
            )
            if dask_future is not None:
                loop = asyncio.get_running_loop()
                loop.run_in_executor(None, dask_future.cancel)


__all__ = ["INSTALL_HINT", "DaskExecutor", "require_distributed"]
