"""``DaskExecutor``: remote calls on a Dask cluster, in the same environments, built on nodes.

Who calls it: ``RemoteFunction.remote`` (through ``init(executor=client)``) and users who
make one directly. The driver side of the design (the node side is ``node.py``):

- Per environment (resolved like ``LocalExecutor`` does, with the driver's ``sys.path``)
  the executor builds a manifest in a staging thread (``manifest.py``: local content hashed
  and put in the driver's blob store) and stages it on every current node (``transfer.py``:
  each node gets the blobs it lacks, once). Until then tasks wait in the executor.
- A task is one Dask task (``node.run_task``) carrying the pickled call as bytes, with a
  loose preference for nodes where the env was staged and is known READY. A node that has
  not got the env (it joined later) answers ``NotStaged``: it is staged and the task sent
  again.
- Outcomes come back as bytes and are unpickled here, into the same values and
  ``RemoteTaskError``s as locally; output lines arrive as Dask events on the executor's
  topic and are written, in the submitting cell's context, before the result is handed out.
- A node lost while running a task: ``BrokenWorker`` naming it (Dask's own rescheduling is
  cut short), unless the call was made with ``retries``, which Dask then spends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..agent.cache import default_cache_dir
from ..errors import BrokenWorker, RuntimeEnvError, WorkerError
from ..spec import RuntimeEnvSpec
from ..workers.executor import Executor, resolve_driver_sys_path, resolve_for_driver
from ..workers.future import RemoteFuture
from ..workers.output import OutputTarget
from ..workers.serialize import dump_call, load_outcome
from ..workers.tracebacks import code_files
from .manifest import Manifest, build_manifest

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
class _Env:
    """One resolved environment as this executor stages it."""

    spec: RuntimeEnvSpec
    prepared: concurrent.futures.Future[Manifest] = field(default_factory=concurrent.futures.Future)
    staged: set[str] = field(default_factory=set)
    ready: set[str] = field(default_factory=set)
    inflight: int = 0
    restaging: dict[str, concurrent.futures.Future[None]] = field(default_factory=dict)


@dataclass(eq=False)
class _Pending:
    """One submitted call until its future is settled."""

    future: RemoteFuture[Any]
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


class DaskExecutor(Executor):
    """Runs ``remote`` calls on the Dask cluster of ``client`` (a ``distributed.Client``
    or a scheduler address, for which a client is made and closed with the executor).

    ``node_cache_dir``: each node's cache root, formatted with the Dask worker's ``name``
    and ``id`` (default: the node's own default). ``driver_cache_dir``: where the driver
    keeps the blobs it ships (default: the local cache root). ``idle_timeout``: seconds
    before an idle environment worker on a node stops.
    """

    def __init__(
        self,
        client: Any,
        *,
        node_cache_dir: str | None = None,
        driver_cache_dir: str | Path | None = None,
        idle_timeout: float = 60.0,
    ) -> None:
        distributed = require_distributed()
        from .node import NodeAgentPlugin

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
        self.bytes_sent = 0
        self.blobs_sent = 0
        self._plugin = NodeAgentPlugin(node_cache_dir, idle_timeout)
        self._plugin_lock = threading.Lock()
        self._plugin_registered = False
        self._lock = threading.Lock()
        self._envs: dict[tuple[str, tuple[str, ...] | None], _Env] = {}
        self._pending: dict[int, _Pending] = {}
        self._by_key: dict[str, _Pending] = {}
        self._threads: dict[str, int] = {}
        self._paths_memo: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._staging = concurrent.futures.ThreadPoolExecutor(
            4, thread_name_prefix="jupyter-runtimeenv-dask-stage"
        )
        self._shut = False
        client.subscribe_topic(self.topic, self._on_output)
        _watch_workers(client, self)

    def __repr__(self) -> str:
        return f"<DaskExecutor {self.client.scheduler.address} envs={len(self._envs)}>"

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
    ) -> RemoteFuture[Any]:
        future: RemoteFuture[Any] = RemoteFuture(name)
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
        )
        env = self._env_for(runtime_env)
        self._pending[task_id] = pending
        future.set_cancel_hook(lambda _f: self._cancel(pending))
        env.prepared.add_done_callback(lambda _f: self._send(env, pending))
        return future

    def shutdown(self) -> None:
        with self._lock:
            if self._shut:
                return
            self._shut = True
            pending = list(self._pending.values())
        for each in pending:
            each.future.cancel()
        self._staging.shutdown(wait=False, cancel_futures=True)
        _unwatch_workers(self.client, self)
        if self.client.status == "running":
            from .node import node_forget

            try:
                self.client.run(node_forget, self.id, on_error="ignore")
                self.client.unsubscribe_topic(self.topic)
            except Exception:  # the cluster is going away; its workers end with it
                pass
        if self._owns_client:
            self.client.close()

    # -- eager preparation ------------------------------------------------------------------

    def prepare(
        self, runtime_env: RuntimeEnvSpec | Mapping[str, Any] | None = None
    ) -> dict[str, str]:
        """Stage ``runtime_env`` (default: the session's) on every node and build it there.

        Returns node address -> env id on that node. Raises the first node's ``BuildError``
        (naming the node). After this the driver's local directories may go away.
        """
        from ..session import default_runtime_env
        from ..spec import merge, parse
        from .node import node_build

        if runtime_env is None:
            spec = default_runtime_env() or parse({})
        elif isinstance(runtime_env, RuntimeEnvSpec):
            spec = runtime_env
        else:
            spec = merge(default_runtime_env(), parse(dict(runtime_env)))
        env = self._env_for(spec)
        manifest = env.prepared.result()
        nodes = self._nodes()
        with self._lock:
            missing = [n for n in nodes if n not in env.staged]
        if missing:
            self._stage_nodes(env, manifest, missing)
        answers = self.client.run(
            node_build, manifest.token, workers=sorted(env.staged), on_error="return"
        )
        built: dict[str, str] = {}
        for node, answer in sorted(answers.items()):
            if isinstance(answer, BaseException):
                raise answer
            built[node] = answer
            env.ready.add(node)
        return built

    # -- staging (threads of ``_staging``) --------------------------------------------------

    def _env_for(self, spec: RuntimeEnvSpec) -> _Env:
        paths = None
        if spec.driver_sys_path is True:
            raw = resolve_driver_sys_path()  # memoised: the common case is one compare
            memo = self._paths_memo
            if memo is None or memo[0] is not raw:
                memo = self._paths_memo = (raw, tuple(p for p in raw if not _in_dask_scratch(p)))
            paths = memo[1]
        key = (spec.env_id, paths)
        with self._lock:
            if self._shut:
                raise RuntimeError("this executor was shut down")
            env = self._envs.get(key)
            if env is not None and not (env.prepared.done() and env.prepared.exception()):
                return env
            env = self._envs[key] = _Env(resolve_for_driver(spec, paths))
        self._staging.submit(self._prepare, env)
        return env

    def _prepare(self, env: _Env) -> None:
        try:
            self._register_plugin()
            manifest = build_manifest(env.spec, self.store_root)
            self._stage_nodes(env, manifest, self._nodes())
            if not env.staged:
                raise WorkerError(f"no Dask worker of {self.client.scheduler.address} is up")
        except BaseException as exc:
            env.prepared.set_exception(exc)
        else:
            env.prepared.set_result(manifest)

    def _register_plugin(self) -> None:
        with self._plugin_lock:
            if not self._plugin_registered:
                self.client.register_plugin(self._plugin)
                self._plugin_registered = True

    def _nodes(self) -> list[str]:
        workers = self.client.scheduler_info(n_workers=-1)["workers"]
        with self._lock:
            for address, info in workers.items():
                self._threads[address] = int(info.get("nthreads", 1))
        return sorted(workers)

    def _preferred(self, env: _Env) -> list[str] | None:
        """Nodes where the env is READY while they have threads free for it; else every
        node that has it staged (more nodes build it rather than tasks queue)."""
        with self._lock:
            env.inflight += 1
            capacity = sum(self._threads.get(node, 1) for node in env.ready)
            if env.ready and env.inflight <= capacity:
                return sorted(env.ready)
            return sorted(env.staged) or None

    def _stage_nodes(self, env: _Env, manifest: Manifest, nodes: list[str]) -> None:
        from .transfer import stage

        staged = stage(self.client, manifest, nodes, self.store_root)
        with self._lock:
            self.bytes_sent += staged.bytes_sent
            self.blobs_sent += staged.blobs_sent
            env.staged |= staged.nodes
        if not staged.nodes and staged.errors:
            problems = "; ".join(f"{node}: {why}" for node, why in sorted(staged.errors.items()))
            raise WorkerError(f"could not stage the environment on the Dask workers: {problems}")

    def _restage(self, env: _Env, pending: _Pending, node: str) -> None:
        """A node had not got the env (it joined after staging): stage it, send again."""
        with self._lock:
            job = env.restaging.get(node)
            if job is None or (job.done() and job.exception() is not None):
                job = env.restaging[node] = self._staging.submit(
                    self._stage_nodes, env, env.prepared.result(), [node]
                )
        job.add_done_callback(lambda _j: self._send(env, pending))

    # -- sending and collecting -------------------------------------------------------------

    def _send(self, env: _Env, pending: _Pending) -> None:
        """Submit the Dask task (any thread). Settles the future if the env cannot be had."""
        if pending.future.done():
            return
        error = env.prepared.exception()
        if error is not None:
            self._fail(pending, error)
            return
        from .node import run_task

        manifest = env.prepared.result()
        preferred = self._preferred(env)
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
                key=pending.key,
                pure=False,
                workers=preferred,
                allow_other_workers=True,
                retries=pending.retries or None,
            )
        except Exception as exc:
            with self._lock:
                env.inflight -= 1
            self._fail(pending, WorkerError(f"{pending.name}: cannot submit to Dask: {exc}"))
            return
        pending.dask = dask_future
        self._by_key[pending.key] = pending
        pending.future.mark_started()
        loop = self.client.loop.asyncio_loop
        asyncio.run_coroutine_threadsafe(self._collect(env, pending, dask_future), loop)

    async def _collect(self, env: _Env, pending: _Pending, dask_future: Any) -> None:
        """On the client's loop: wait for the Dask task, then settle (or resend)."""
        from distributed import KilledWorker

        from .node import NotStaged

        answer = await dask_future._result(raiseit=False)
        with self._lock:
            env.inflight -= 1
        status = dask_future.status
        self._by_key.pop(pending.key, None)
        pending.dask = None
        dask_future.release()
        if status == "finished":
            kind, data, count, node = answer
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
            env.staged.discard(error.node)
            self._staging.submit(self._restage, env, pending, error.node)
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

    def _settle(self, pending: _Pending) -> None:
        if pending.settled or pending.outcome is None:
            return
        pending.settled = True
        self._pending.pop(pending.task_id, None)
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

    def _on_output(self, event: tuple[float, dict[str, Any]]) -> None:
        """On the client's loop: output lines of a task, from its node."""
        message = event[1]
        pending = self._pending.get(message.get("task", -1))
        if pending is None:
            return
        pending.target.write(int(message["stream"]), str(message["text"]))
        pending.received += 1
        if pending.outcome is not None and pending.received >= pending.expected:
            self._settle(pending)

    def _lost(self, node: str, keys: set[str]) -> None:
        """On the client's loop: ``node`` left the cluster while running ``keys``. Calls
        without retries fail now, naming it (Dask would run them again elsewhere)."""
        for key in keys:
            pending = self._by_key.get(key)
            if pending is None or pending.retries:
                continue
            self._by_key.pop(key, None)
            dask_future, pending.dask = pending.dask, None
            self._fail(
                pending,
                BrokenWorker(f"{pending.name}: Dask worker {node} was lost while running it"),
            )
            if dask_future is not None:
                loop = asyncio.get_running_loop()
                loop.run_in_executor(None, dask_future.cancel)


def _in_dask_scratch(path: str) -> bool:
    """Whether ``path`` is Dask's own scratch space (an in-process scheduler or worker puts
    its directory on ``sys.path`` for uploaded files): never shipped."""
    import tempfile

    import dask.config

    root = dask.config.get("temporary-directory", None) or tempfile.gettempdir()
    scratch = os.path.join(os.path.abspath(root), "dask-scratch-space")
    return path == scratch or path.startswith(scratch + os.sep)


# -- worker removals, shared by the executors of one client ---------------------------------

_watchers: dict[str, list[DaskExecutor]] = {}
_watchers_lock = threading.Lock()


def _watch_workers(client: Any, executor: DaskExecutor) -> None:
    """Subscribe once per client to the scheduler's ``all`` topic (one handler per topic
    and client), and fan removals out to its executors."""
    with _watchers_lock:
        executors = _watchers.setdefault(client.id, [])
        first = not executors
        executors.append(executor)
    if first:
        client.subscribe_topic("all", lambda event: _on_scheduler_event(client.id, event))


def _unwatch_workers(client: Any, executor: DaskExecutor) -> None:
    with _watchers_lock:
        executors = _watchers.get(client.id, [])
        if executor in executors:
            executors.remove(executor)
        last = not executors
        if last:
            _watchers.pop(client.id, None)
    if last and client.status == "running":
        with contextlib.suppress(Exception):  # the client is closing
            client.unsubscribe_topic("all")


def _on_scheduler_event(client_id: str, event: tuple[float, Any]) -> None:
    message = event[1]
    if not isinstance(message, dict) or message.get("action") != "remove-worker":
        return
    if message.get("expected"):
        return  # a graceful retirement: Dask moves its tasks, nothing was lost
    keys = {str(k) for k in message.get("processing-tasks", ())}
    node = str(message.get("worker", "?"))
    with _watchers_lock:
        executors = list(_watchers.get(client_id, []))
    for executor in executors:
        executor._lost(node, keys)


__all__ = ["INSTALL_HINT", "DaskExecutor", "require_distributed"]
