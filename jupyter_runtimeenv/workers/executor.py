"""Executors: where remote calls run. ``LocalExecutor`` runs them in worker pools here.

``Executor`` is the contract the ``remote`` API (``api.py``) programs against;
``jupyter_runtimeenv.dask.DaskExecutor`` (many machines) implements the same two methods.

Driver ``sys.path`` (the ``driver_sys_path`` field): ``True`` (the default) is resolved here,
at every submit, to the driver's current entries, minus the driver interpreter's own
standard library and site-packages (the environment already layers over those, or
deliberately does not: an isolated env, or another Python whose stdlib must not be shadowed).
The resolved list enters the spec, so a changed ``sys.path`` gives another env id and a
fresh pool: no worker ever runs with a stale path or stale imported modules. The pool it
replaces drains (its running tasks finish) and closes, releasing its agent reference.

Local code (``working_dir``, ``py_modules``) the same way: at every submit its trees are
walked (a ``stat`` per file, from the stat cache; ``spec.refresh``), so the call after an
edit runs in the env of the edited code; an unchanged tree is the same env and pool.
"""

from __future__ import annotations

import abc
import itertools
import os
import site
import sys
import sysconfig
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..context import EnvContext
from ..plugins._sources import TREES_VAR
from ..spec import RuntimeEnvSpec, merge, refresh
from ..spec.parse import has_local_content
from . import files
from .channel import driver_arena
from .future import RemoteFuture, Task
from .habits import PIPELINE_DEPTH
from .output import OutputTarget
from .pool import Pool
from .serialize import prepare_call


class Executor(abc.ABC):
    """Runs ``function(*args, **kwargs)`` in ``runtime_env``; called by ``RemoteFunction``.

    An executor with ``keeps_affinity`` also takes ``submit(..., affinity=KEY)``: calls with
    the same key run one after another in one worker kept for them (``%%remote`` keeps a
    cell namespace there), until ``release_affinity(KEY)``.
    """

    keeps_affinity = False

    @abc.abstractmethod
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
    ) -> RemoteFuture[Any]:
        """Start the call; errors of the call itself are delivered through the future.

        ``retries``: how many more times the call may run if the node running it is lost
        (an executor with nodes, like Dask's; the local one has none to lose).
        ``files_out``: gitignore-style patterns of files the call writes in its working
        directory to copy back beside the caller (its working directory) before the future
        is settled; the files it wrote are listed either way (``future.files``).
        """

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop every worker and release every environment. Idempotent."""

    def release_affinity(self, key: str) -> None:  # noqa: B027 (optional hook)
        """Stop the worker kept for ``key`` (its state goes with it). Default: nothing."""

    def affinity_pid(self, key: str) -> int | None:
        """The pid of the live worker kept for ``key``; ``None`` if there is none."""
        return None

    def label_affinity(self, key: str, label: str) -> None:  # noqa: B027 (optional hook)
        """Say what ``key``'s worker is kept for (the kernel's report shows it)."""

    def prestart(self, runtime_env: RuntimeEnvSpec) -> None:  # noqa: B027 (optional hook)
        """Start a worker for ``runtime_env`` before its first task, where the executor can.

        Who calls it: ``api.prestart`` (the ``%runtime_env`` magic, after an eager build).
        The default does nothing."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


AcquireFn = Callable[[RuntimeEnvSpec, str], EnvContext]
ReleaseFn = Callable[[str, str], None]


class LocalExecutor(Executor):
    """Worker pools in this process, one per resolved environment.

    ``acquire``/``release`` default to the process-wide agent client (``get_client()``,
    looked up at the first submit); tests and embedders may pass their own.
    ``keep_spare`` keeps one started worker in reserve per pool (see ``Pool``): a burst
    after a quiet spell does not wait for a process start, at the cost of a process.
    ``pipeline_depth`` (calls a worker holds at most; 1: no pipelining) and ``learn_imports``
    (new workers import what earlier calls imported) go to every pool (see ``Pool``).
    """

    keeps_affinity = True

    def __init__(
        self,
        *,
        max_workers: int | None = None,
        idle_timeout: float = 60.0,
        acquire: AcquireFn | None = None,
        release: ReleaseFn | None = None,
        keep_spare: bool = False,
        pipeline_depth: int = PIPELINE_DEPTH,
        learn_imports: bool = True,
    ) -> None:
        self.max_workers = max_workers
        self.keep_spare = keep_spare
        self.pipeline_depth = pipeline_depth
        self.learn_imports = learn_imports
        self.idle_timeout = idle_timeout
        self._acquire = acquire
        self._release = release
        self._lock = threading.Lock()
        self._pools: dict[tuple[str, tuple[str, ...] | None], Pool] = {}
        self._current: dict[str, tuple[str, tuple[str, ...] | None]] = {}
        self._holders = itertools.count(1)
        self._shut = False
        #: The spec, driver paths and pool of the last ``_pool_for`` (see there).
        self._recent: tuple[RuntimeEnvSpec, tuple[str, ...] | None, Pool] | None = None
        #: The last declared spec ``_pool_for`` found without local content (``refresh``
        #: gives it back as it is, always: no need to ask at every call), and whether it
        #: takes the driver's ``sys.path`` (a property that looks in its fields).
        self._static: tuple[RuntimeEnvSpec, bool] | None = None
        # Dropping the executor without shutdown() must not leave its workers behind.
        self._finalizer = weakref.finalize(self, _close_pools, self._pools)

    @property
    def pools(self) -> list[Pool]:
        with self._lock:
            return list(self._pools.values())

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
        affinity: str | None = None,
    ) -> RemoteFuture[Any]:
        future: RemoteFuture[Any] = RemoteFuture(name)
        # Pickled now (an unpicklable argument raises here); large buffers are copied into
        # shared memory now, so changing an argument after .remote() changes nothing.
        call = prepare_call(0, function, args, kwargs, name, driver_arena())
        task = Task.of(call, future, OutputTarget.capture(name), affinity)
        if files_out:
            task.files_out = files_out
            task.here = os.getcwd()  # beside the notebook: where files_out go
        try:
            while True:
                pool = self._holding(affinity) or self._pool_for(runtime_env)
                # A function, not a closure per call (see future.py); none where the env
                # has no tree of ours to look at (``_report_files`` would return at once;
                # an env not known yet may have one).
                ctx = pool.ctx
                if ctx is None or _tree(ctx) is not None:
                    task.finish = _report_files
                if pool.submit(task):
                    break  # else that pool began closing (idle, superseded): take the next
        except KeyboardInterrupt:
            future.cancel()  # queued already, perhaps, but nobody would hold its future
            raise
        return future

    def shutdown(self) -> None:
        with self._lock:
            self._shut = True
        self._finalizer()

    def _holding(self, key: str | None) -> Pool | None:
        """The open pool whose worker is kept for ``key``: a namespace's calls go there even
        once its env's local code changed (``%%remote`` then moves the namespace out)."""
        if key is None:
            return None
        for pool in self.pools:
            if not pool.closed and pool.affinity_pid(key) is not None:
                return pool
        return None

    def release_affinity(self, key: str) -> None:
        for pool in self.pools:
            if pool.release_affinity(key):
                return

    def affinity_pid(self, key: str) -> int | None:
        for pool in self.pools:
            pid = pool.affinity_pid(key)
            if pid is not None:
                return pid
        return None

    def label_affinity(self, key: str, label: str) -> None:
        for pool in self.pools:
            pool.label_affinity(key, label)

    def prestart(self, runtime_env: RuntimeEnvSpec) -> None:
        """Start the first worker of ``runtime_env``'s pool now (see ``Pool.prestart``): the
        first call then skips the interpreter start. A no-op once shut down."""
        try:
            pool = self._pool_for(runtime_env)
        except RuntimeError:
            return  # shut down
        pool.prestart()

    def _pool_for(self, declared: RuntimeEnvSpec) -> Pool:
        # The local code as it is now (a stat walk): an edit to a module of the working_dir
        # gives a new env for this call, and the pool of the code before it drains.
        static = self._static
        if static is not None and declared is static[0]:
            spec, path = static
        elif has_local_content(declared):
            spec = refresh(declared)
            path = spec.driver_sys_path is True
        else:
            path = declared.driver_sys_path is True
            spec, self._static = declared, (declared, path)
        paths = resolve_driver_sys_path() if path else None
        # The last call's pool, if this one has the very same spec and path objects (both
        # are returned unchanged when nothing changed): no key to hash, no lock to take.
        recent = self._recent
        if (
            recent is not None
            and recent[0] is spec
            and recent[1] is paths
            and not recent[2].closed
            and not self._shut
        ):
            return recent[2]
        key = (spec.env_id, paths)
        with self._lock:
            if self._shut:
                raise RuntimeError("this executor was shut down")
            pool = self._pools.get(key)
            if pool is not None and not pool.closed:
                self._recent = (spec, paths, pool)
                return pool
            superseded = self._pools.get(self._current.get(declared.env_id, key))
            if superseded is pool:
                superseded = None
            resolved = resolve_for_driver(spec, paths)
            pool = self._new_pool(resolved)
            self._pools[key] = pool
            self._recent = (spec, paths, pool)
            self._current[declared.env_id] = key
            for stale in [k for k, p in self._pools.items() if p.closed and k != key]:
                del self._pools[stale]
        if superseded is not None:
            superseded.drain()
        return pool

    def _new_pool(self, spec: RuntimeEnvSpec) -> Pool:
        holder = f"pool:{os.getpid()}:{next(self._holders)}:{spec.env_id[:12]}"
        acquire, release = self._acquire, self._release
        if acquire is None or release is None:
            from ..client import get_client

            client = get_client()
            acquire = acquire or client.acquire_sync
            release = release or client.release_sync
        get, drop = _watching_trees(acquire), release
        return Pool(
            lambda: get(spec, holder),
            lambda ctx: drop(ctx.env_id, holder),
            max_workers=self.max_workers,
            idle_timeout=self.idle_timeout,
            close_when_idle=True,
            keep_spare=self.keep_spare,
            name=f"pool-{spec.env_id[:8]}",
            pipeline_depth=self.pipeline_depth,
            learn_imports=self.learn_imports,
        )


def _watching_trees(acquire: AcquireFn) -> AcquireFn:
    """``acquire``, then the env's working directory is looked at (``files.changes_in``)
    before any of its tasks runs, so that what they write there can be told."""

    def get(spec: RuntimeEnvSpec, holder: str) -> EnvContext:
        ctx = acquire(spec, holder)
        if (tree := _tree(ctx)) is not None:
            files.changes_in(tree)
        return ctx

    return get


def _tree(ctx: EnvContext) -> str | None:
    """The env's working directory where it is a tree of ours (what its tasks write there is
    told and may be copied back), else None."""
    return ctx.cwd if ctx.cwd and TREES_VAR in ctx.env_vars else None


def _report_files(task: Task) -> None:
    """After a task (before its future settles): list what it wrote in its working
    directory in one line of its output, and copy back what ``task.files_out`` selects."""
    pool = task.pool  # the pool that took it
    ctx = pool.ctx if isinstance(pool, Pool) else None
    tree = _tree(ctx) if ctx is not None else None
    if tree is None:
        return
    written = files.changes_in(tree).take()
    if written and task.files_out:
        written = files.copy_back(written, task.files_out, task.here)
    task.future.files = written
    if written:
        task.output.write(1, f"({task.name}) {written.line()}\n")


def _close_pools(pools: dict[Any, Pool]) -> None:
    for pool in list(pools.values()):
        pool.close()
    pools.clear()


# -- the driver's sys.path and interpreter -------------------------------------------------


def resolve_for_driver(spec: RuntimeEnvSpec, paths: Sequence[str] | None = None) -> RuntimeEnvSpec:
    """``spec`` as this driver sends it to the agent: ``driver_sys_path: true`` becomes the
    driver's entries (``paths``, default: resolved now), and ``driver_python`` defaults to
    this interpreter, so a ``pip`` env layers over the driver's packages even when the agent
    runs on another interpreter (the Jupyter server's)."""
    extra: dict[str, Any] = {}
    if spec.driver_sys_path is True:
        extra["driver_sys_path"] = list(resolve_driver_sys_path() if paths is None else paths)
    if "driver_python" not in spec and "conda" not in spec:
        extra["driver_python"] = sys.executable
    return merge(spec, extra) if extra else spec


_memo: tuple[tuple[str, ...], str | None, tuple[str, ...]] | None = None
#: The directory Dask keeps its workers' and scheduler's files in, wherever its
#: ``temporary-directory`` puts it.
_DASK_SCRATCH = "dask-scratch-space"
_memo_lock = threading.Lock()


def resolve_driver_sys_path(path: Sequence[str] | None = None) -> tuple[str, ...]:
    """The driver's ``sys.path`` entries a worker should put first, in the driver's order.

    Relative entries (``""`` is the cwd) become absolute; the driver interpreter's own
    stdlib and site-packages are left out, and so is Dask's scratch space (an in-process
    scheduler or worker, as a ``LocalCluster`` has, puts its directory there for files
    uploaded to it: not the user's code, and it differs per cluster, so the env's id would
    too). Memoised: the common case costs a tuple compare.
    """
    global _memo
    snapshot = tuple(sys.path if path is None else path)
    memo = _memo
    if memo is not None and memo[0] == snapshot and (memo[1] is None or memo[1] == os.getcwd()):
        return memo[2]
    relative = any(not os.path.isabs(entry) for entry in snapshot)
    cwd = os.getcwd() if relative else None
    excluded = _interpreter_dirs()
    result: list[str] = []
    for entry in snapshot:
        absolute = os.path.normpath(os.path.join(cwd or "", entry)) if entry else (cwd or "")
        if (
            absolute
            and absolute not in excluded
            and absolute not in result
            and _DASK_SCRATCH not in absolute.split(os.sep)
        ):
            result.append(absolute)
    with _memo_lock:
        _memo = (snapshot, cwd, tuple(result))
    return tuple(result)


def _interpreter_dirs() -> frozenset[str]:
    global _interpreter_cache
    if _interpreter_cache is None:
        dirs: set[str] = set()
        bases = [{}, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}]
        for variables in bases:
            paths = sysconfig.get_paths(vars=variables)
            for name in ("stdlib", "platstdlib", "purelib", "platlib"):
                dirs.add(paths[name])
            dirs.add(os.path.join(paths["platstdlib"], "lib-dynload"))
        version = f"{sys.version_info[0]}{sys.version_info[1]}"
        for prefix in {sys.prefix, sys.base_prefix}:
            dirs.add(os.path.join(prefix, "lib", f"python{version}.zip"))
        dirs.update(site.getsitepackages())
        if site.ENABLE_USER_SITE:
            dirs.add(site.getusersitepackages())
        _interpreter_cache = frozenset(os.path.normpath(d) for d in dirs)
    return _interpreter_cache


_interpreter_cache: frozenset[str] | None = None
