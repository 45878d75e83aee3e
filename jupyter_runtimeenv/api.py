"""The Ray-like public API: ``init``, ``remote``, ``get``, ``wait`` (and ``shutdown``;
``cancel`` lives in ``interrupt``).

Users call these from a notebook (the kernel is the driver)::

    import jupyter_runtimeenv as jre
    jre.init(runtime_env={"env_vars": {"MODE": "fast"}})

    @jre.remote
    def crunch(x): ...

    futures = [crunch.remote(i) for i in range(10)]
    jre.get(futures)                                     # or: await futures[0]
    crunch.options(runtime_env={"pip": ["numpy"]}).remote(3)
    crunch.options(runtime_env="gpu").remote(3)     # a named env (``%runtime_env --name gpu``)

The effective environment of a call is the session default (``init``), then the function's
``@remote(runtime_env=...)``, then ``.options(runtime_env=...)``, merged by ``spec.merge``
(key by key; ``env_vars`` per variable). A name instead of a mapping (a named env,
``%runtime_env --name``) takes the default's place as the base the mappings merge over.

The state (default env, named envs, executor) lives in ``session``, below this module; this
module composes it with the executors (it makes the default ``LocalExecutor``, or a
``DaskExecutor`` for a client) and wires the kernel's report to the server
(``workers.report``) to the session and the pools.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, ParamSpec, TypeVar, overload

from . import session
from .spec import RuntimeEnvSpec, merge, parse
from .workers import report
from .workers.executor import Executor, LocalExecutor
from .workers.future import RemoteFuture
from .workers.interrupt import interrupted

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

EnvLike = RuntimeEnvSpec | Mapping[str, Any]
#: A spec, a mapping, or the name of a declared env.
EnvRef = EnvLike | str


# The kernel's report to the server follows the session and the pools (a no-op outside a
# kernel of a server with the extension).
report.install()


def _executor() -> Executor:
    return session.executor_or(_default_executor)


def _default_executor() -> Executor:
    """A ``LocalExecutor``; in a kernel started on a Dask node (a ``--dask`` kernelspec), a
    ``DaskExecutor`` on that kernel's cluster, so its tasks go to the cluster by default."""
    address = os.environ.get(session.CLUSTER_VAR)
    if address:
        from .dask import DaskExecutor
        from .dask.node_kernels import claim_executor

        cluster = DaskExecutor(
            address, node_cache_dir=os.environ.get(session.NODE_CACHE_VAR) or None
        )
        claim_executor(cluster)  # its pools on the nodes end with this kernel
        return cluster
    return LocalExecutor()


def init(runtime_env: EnvLike | None = None, executor: Executor | Any | None = None) -> None:
    """Set the session's default environment and, optionally, its executor.

    ``runtime_env`` is parsed now (a bad spec raises ``SpecError`` here). ``executor`` is an
    ``Executor``, or a ``distributed.Client`` or Dask scheduler address (a ``DaskExecutor``
    is made for it; needs the ``dask`` extra). Calling ``init`` again replaces both; an
    executor the session created itself is shut down when replaced.
    """
    spec = None if runtime_env is None else _as_spec(runtime_env)
    owned = False
    if executor is not None and not isinstance(executor, Executor):
        from .dask import executor_for

        executor, owned = executor_for(executor), True
    old = session.replace(spec, executor, owned=owned)
    if old is not None:
        old.shutdown()


def default_runtime_env() -> RuntimeEnvSpec | None:
    """The session's default environment (set by ``init`` or ``%runtime_env``), or ``None``.

    Who calls it: the ``%runtime_env`` magic, to show the default and merge over it.
    """
    return session.default_runtime_env()


def prestart(runtime_env: EnvLike | None = None) -> None:
    """Start a worker for ``runtime_env`` (default: the session's default environment) now,
    so that the first call does not wait for an interpreter start; the worker is stopped by
    the idle timeout if no call comes. Who calls it: the ``%runtime_env`` magic, once an
    eager build made the environment READY."""
    spec = session.default_runtime_env() if runtime_env is None else _as_spec(runtime_env)
    if spec is not None:
        _executor().prestart(_merged(spec, None))


def shutdown() -> None:
    """Forget the session's settings (default and named envs); shut down the executor if the
    session created it."""
    old = session.clear()
    if old is not None:
        old.shutdown()


class RemoteFunction(Generic[P, R]):
    """A function that runs in a worker: ``f.remote(...)`` returns a ``RemoteFuture``."""

    def __init__(
        self,
        function: Callable[P, R],
        runtime_env: EnvRef | None = None,
        retries: int = 0,
        *,
        env_name: str | None = None,
        files_out: Sequence[str] = (),
    ) -> None:
        if not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be a whole number >= 0, got {retries!r}")
        self._function = function
        self._retries = retries
        self._files_out = _check_files_out(files_out)
        #: The named env the overrides merge over (``None``: the session default).
        self._env_name = env_name
        if isinstance(runtime_env, str):
            self._env_name, runtime_env = session.check_name(runtime_env), None
        self._runtime_env = None if runtime_env is None else _as_spec(runtime_env)
        self._memo: tuple[int, RuntimeEnvSpec] | None = None
        functools.update_wrapper(self, function)

    def __repr__(self) -> str:
        return f"<RemoteFunction {getattr(self._function, '__qualname__', self._function)}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = getattr(self._function, "__name__", "f")
        raise TypeError(
            f"remote function {name} cannot be called directly; "
            f"use {name}.remote(...) and get() the result"
        )

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> RemoteFuture[R]:
        """Run the function in its environment; returns at once."""
        executor = _executor()
        name = getattr(self._function, "__name__", "task")
        if not self._retries and not self._files_out:  # the common case: no dict to unpack
            return executor.submit(
                self._function, args, kwargs, runtime_env=self._effective_env(), name=name
            )
        # Only executors that can lose a node (Dask) take ``retries``; executors of ours
        # take ``files_out`` (passed when given, so that other executors keep working).
        extra: dict[str, Any] = {"retries": self._retries} if self._retries else {}
        if self._files_out:
            extra["files_out"] = self._files_out
        return executor.submit(
            self._function, args, kwargs, runtime_env=self._effective_env(), name=name, **extra
        )

    def options(
        self,
        *,
        runtime_env: EnvRef | None = None,
        retries: int | None = None,
        files_out: Sequence[str] | None = None,
    ) -> RemoteFunction[P, R]:
        """The same function with ``runtime_env`` merged over this one's (and ``retries``);
        a name selects that named env as the base instead of the session default.

        ``files_out``: gitignore-style patterns (``["results.csv"]``, ``["*.png", "out/"]``)
        of the files a call writes in its working directory to copy back beside the notebook
        before its result is returned. The files a call writes there are listed in one line
        of its output either way: its working directory is its env's own copy."""
        if runtime_env is None and retries is None and files_out is None:
            return self
        env, name = self._runtime_env, self._env_name
        if isinstance(runtime_env, str):
            name = runtime_env
        elif runtime_env is not None:
            env = _merged(self._runtime_env, _as_spec(runtime_env))
        again = self._retries if retries is None else retries
        patterns = self._files_out if files_out is None else files_out
        return RemoteFunction(self._function, env, again, env_name=name, files_out=patterns)

    def _effective_env(self) -> RuntimeEnvSpec:
        memo, generation = self._memo, session.generation()
        if memo is not None and memo[0] == generation:
            return memo[1]
        if self._env_name is None:
            base = session.default_runtime_env()
        else:
            base = session.lookup(self._env_name)
        spec = _merged(base, self._runtime_env)
        self._memo = (generation, spec)
        return spec


@overload
def remote(function: Callable[P, R], /) -> RemoteFunction[P, R]: ...


@overload
def remote(
    *, runtime_env: EnvRef | None = None, retries: int = 0
) -> Callable[[Callable[P, R]], RemoteFunction[P, R]]: ...


def remote(
    function: Callable[P, R] | None = None,
    /,
    *,
    runtime_env: EnvRef | None = None,
    retries: int = 0,
) -> RemoteFunction[P, R] | Callable[[Callable[P, R]], RemoteFunction[P, R]]:
    """``@remote``, ``@remote(runtime_env={...}, retries=N)`` or
    ``@remote(runtime_env="NAME")`` on a function (a name: a named env, ``session.declare``).

    ``retries``: on a Dask cluster, how many more times the call may run when its node is
    lost or its worker process dies (mark idempotent functions only). Locally unused.
    """
    if function is not None:
        if not callable(function):
            raise TypeError(f"@remote expects a function, got {type(function).__name__}")
        return RemoteFunction(function, runtime_env, retries)

    def decorate(fn: Callable[P, R]) -> RemoteFunction[P, R]:
        return RemoteFunction(fn, runtime_env, retries)

    return decorate


@overload
def get(refs: concurrent.futures.Future[T], timeout: float | None = None) -> T: ...


@overload
def get(refs: Sequence[concurrent.futures.Future[T]], timeout: float | None = None) -> list[T]: ...


def get(
    refs: concurrent.futures.Future[T] | Sequence[concurrent.futures.Future[T]],
    timeout: float | None = None,
) -> T | list[T]:
    """The result of a future, or the results of a list of futures, in order.

    Raises the task's error (``RemoteTaskError``, ``BrokenWorker``, ``BuildError`` ...) and
    ``TimeoutError`` when ``timeout`` seconds pass first (for a list: in total). An interrupt
    (``KeyboardInterrupt``) cancels every future given that is not done, killing the workers
    that run them, and is raised again with a one-line message (see ``interrupt``).
    """
    __tracebackhide__ = True
    deadline = None if timeout is None else time.monotonic() + timeout
    if isinstance(refs, concurrent.futures.Future):
        refs_list = [refs]
    elif not isinstance(refs, Sequence) or isinstance(refs, str | bytes):
        raise TypeError(f"get() expects a future or a list of futures, got {type(refs).__name__}")
    else:
        refs_list = list(refs)
    try:
        if isinstance(refs, concurrent.futures.Future):
            return _result(refs, deadline)
        return [_result(ref, deadline) for ref in refs_list]
    except KeyboardInterrupt as caught:
        # Raised anew: a one-line message instead of the frames of the wait it broke.
        raise interrupted(
            [f for f in refs_list if isinstance(f, concurrent.futures.Future)], caught
        ) from None


def _result(future: concurrent.futures.Future[T], deadline: float | None) -> T:
    __tracebackhide__ = True
    if not isinstance(future, concurrent.futures.Future):
        raise TypeError(f"get() expects futures, got {type(future).__name__}")
    remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
    try:
        return future.result(remaining)
    except concurrent.futures.TimeoutError:
        if future.done():  # the task itself raised a TimeoutError
            raise
        raise TimeoutError(f"get() timed out waiting for {future!r}") from None


def wait(
    futures: Iterable[concurrent.futures.Future[T]],
    num_returns: int = 1,
    timeout: float | None = None,
    *,
    progress: bool = False,
) -> tuple[list[concurrent.futures.Future[T]], list[concurrent.futures.Future[T]]]:
    """Wait until ``num_returns`` futures are done or ``timeout`` passes, like ``ray.wait``.

    Returns ``(ready, not_ready)``, each in the order given; ``ready`` holds at most
    ``num_returns`` futures. An interrupt cancels the futures it was waiting on, as ``get``.
    ``progress=True`` shows the futures' progress meanwhile (a bar in a kernel, a text line
    elsewhere: ``jupyter_runtimeenv.progress``).
    """
    futures = list(futures)
    if not 0 <= num_returns <= len(futures):
        raise ValueError(f"num_returns must be between 0 and {len(futures)}, got {num_returns}")
    if len(set(map(id, futures))) != len(futures):
        raise ValueError("wait() got the same future twice")
    __tracebackhide__ = True
    if progress:
        from .ipython.tasks import TaskProgress

        TaskProgress(futures).wait(num_returns, timeout)
        return _split(futures, num_returns)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while sum(f.done() for f in futures) < num_returns:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            pending = [f for f in futures if not f.done()]
            concurrent.futures.wait(
                pending, remaining, return_when=concurrent.futures.FIRST_COMPLETED
            )
    except KeyboardInterrupt as caught:
        raise interrupted(futures, caught) from None
    return _split(futures, num_returns)


def _split(
    futures: list[concurrent.futures.Future[T]], num_returns: int
) -> tuple[list[concurrent.futures.Future[T]], list[concurrent.futures.Future[T]]]:
    ready: list[concurrent.futures.Future[T]] = []
    for future in futures:
        if future.done() and len(ready) < num_returns:
            ready.append(future)
    not_ready = [f for f in futures if not any(f is r for r in ready)]
    return ready, not_ready


def _merged(base: RuntimeEnvSpec | None, override: RuntimeEnvSpec | None) -> RuntimeEnvSpec:
    """``merge(base, override)``, but a side alone is returned as it is: parsing it again
    would hash a ``working_dir`` or ``py_modules`` tree again (a walk of every file) for
    the same spec. Each ``.options(runtime_env=...)`` call saved two such walks."""
    if override is None and base is not None:
        return base
    if base is None and override is not None:
        return override
    return merge(base, override)


def _check_files_out(patterns: Sequence[str]) -> tuple[str, ...]:
    """``files_out`` as a tuple; ``ValueError`` naming it for anything but pattern strings."""
    if isinstance(patterns, str):
        patterns = [patterns]  # one pattern given bare
    out = tuple(patterns)
    for pattern in out:
        if not isinstance(pattern, str) or not pattern.strip():
            raise ValueError(
                f"files_out: expected gitignore-style pattern strings, got {pattern!r}"
            )
    return out


def _as_spec(value: EnvLike) -> RuntimeEnvSpec:
    return value if isinstance(value, RuntimeEnvSpec) else parse(dict(value))
