"""The session of this process: its default environment, its named environments and its
executor. State only: nothing here builds, submits or reports.

Who calls it: the public API (``api.py``: ``init``, ``remote``, ``shutdown``) writes it; the
``%runtime_env`` magic declares named envs; readers below the API (the Dask executor's
``prepare``, the kernel's report to the server, ``workers.envs.declared_envs``) read it
without reaching up to the API. Observers registered with ``observe`` hear of every change
(the reporter uses this to show the declared envs in the sidebar); they are called outside
the lock and must be cheap.

A named env stands alone: it is not merged over the default. ``generation`` changes at every
change of the default or the named envs, so callers may memoise what they derive from them.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import SpecError
from .spec import RuntimeEnvSpec

if TYPE_CHECKING:
    from .workers.executor import Executor

__all__ = [
    "CLUSTER_VAR",
    "NAME_PATTERN",
    "NODE_CACHE_VAR",
    "check_name",
    "clear",
    "declare",
    "default_runtime_env",
    "executor",
    "executor_or",
    "forget",
    "generation",
    "lookup",
    "named_envs",
    "names",
    "observe",
    "replace",
]

#: Set in the environment of a kernel started on a Dask node (``kernels/remote.py``): the
#: scheduler's address as the node sees it. The API then makes the session's executor a
#: ``DaskExecutor`` on that cluster, and ``NODE_CACHE_VAR`` (when set) is its nodes' cache dir.
CLUSTER_VAR = "JUPYTER_RUNTIMEENV_DASK_SCHEDULER"
NODE_CACHE_VAR = "JUPYTER_RUNTIMEENV_NODE_CACHE_DIR"

#: What an env name may look like: a word, as in a Python identifier, plus ``-`` and ``.``.
NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")

_lock = threading.Lock()
_default: RuntimeEnvSpec | None = None
_named: dict[str, RuntimeEnvSpec] = {}
_executor: Executor | None = None
_owns_executor = False
_generation = 0
_observers: list[Callable[[], None]] = []


def generation() -> int:
    """A number that changes whenever the default or a named env changes."""
    return _generation


def default_runtime_env() -> RuntimeEnvSpec | None:
    """The default environment (``init``, ``%runtime_env``), or ``None``."""
    return _default


def executor() -> Executor | None:
    """The session's executor, if one was set or made."""
    return _executor


def executor_or(make: Callable[[], Executor]) -> Executor:
    """The session's executor; when there is none, ``make()`` one and keep it (owned: it is
    shut down when replaced or at ``clear``)."""
    global _executor, _owns_executor
    executor = _executor  # set once, replaced whole: read without the lock on every call
    if executor is not None:
        return executor
    with _lock:
        if _executor is None:
            _executor, _owns_executor = make(), True
        return _executor


def replace(
    runtime_env: RuntimeEnvSpec | None, executor: Executor | None = None, *, owned: bool = False
) -> Executor | None:
    """Set the default env and, if given, the executor (``owned``: the session made it).

    Returns the executor the caller must shut down (an owned one that was replaced), if any.
    """
    global _default, _executor, _owns_executor
    with _lock:
        old = _executor if _owns_executor and executor is not None else None
        _default = runtime_env
        if executor is not None:
            _executor, _owns_executor = executor, owned
        _bump()
    _changed()
    return old


def clear() -> Executor | None:
    """Forget the default, the named envs and the executor; returns the executor to shut
    down (one the session made itself), if any."""
    global _default, _executor, _owns_executor
    with _lock:
        old = _executor if _owns_executor else None
        _default, _executor, _owns_executor = None, None, False
        _named.clear()
        _bump()
    _changed()
    return old


def check_name(name: Any) -> str:
    """``name`` if it is a valid env name, else ``SpecError`` naming it."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise SpecError(
            "name", f"{name!r} is not a valid env name (a letter or _, then letters, digits, _.-)"
        )
    return name


def declare(name: str, spec: RuntimeEnvSpec) -> None:
    """Declare (or replace) the env ``name``."""
    check_name(name)
    with _lock:
        _named[name] = spec
        _bump()
    _changed()


def forget(name: str) -> bool:
    """Drop the env ``name``; ``False`` if there was none."""
    with _lock:
        found = _named.pop(name, None) is not None
        _bump()
    _changed()
    return found


def lookup(name: str) -> RuntimeEnvSpec:
    """The spec declared as ``name``; ``SpecError`` (field ``runtime_env``) naming the
    declared ones otherwise."""
    with _lock:
        spec = _named.get(name)
        known = sorted(_named)
    if spec is None:
        declared = ", ".join(known) if known else "none yet; use %runtime_env --name NAME ..."
        raise SpecError("runtime_env", f"no environment named {name!r} (declared: {declared})")
    return spec


def names() -> list[str]:
    """The declared names, sorted."""
    with _lock:
        return sorted(_named)


def named_envs() -> list[tuple[str, RuntimeEnvSpec]]:
    """The named envs, sorted by name."""
    with _lock:
        return sorted(_named.items())


def observe(callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback()`` after every change; returns a function that removes it."""
    with _lock:
        if callback not in _observers:
            _observers.append(callback)

    def remove() -> None:
        with _lock:
            if callback in _observers:
                _observers.remove(callback)

    return remove


def _bump() -> None:
    global _generation
    _generation += 1


def _changed() -> None:
    with _lock:
        observers = list(_observers)
    for callback in observers:
        callback()
