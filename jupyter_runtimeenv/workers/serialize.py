"""Driver-side (de)serialisation of calls and outcomes, with errors that name the culprit.

``dump_call`` is called by ``LocalExecutor.submit`` in the submitting thread, so arguments
are snapshotted at ``.remote()`` time and an unpicklable one fails right there.
``load_outcome`` is called by a worker's reader thread on RETURN/RAISE frames.
"""

from __future__ import annotations

import itertools
import pickle
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from types import CodeType, FunctionType
from typing import Any

import cloudpickle

from .._exc_state import rebuild
from ..errors import RemoteTaskError, SerializationError
from . import protocol
from .tracebacks import restore_frames


def dump_call(
    task_id: int,
    function: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    name: str,
) -> bytes:
    """The CALL payload ``(task_id, key, function_blob, args, kwargs)``.

    ``SerializationError`` names which part could not be pickled.
    """
    try:
        key, blob = _function_blob(function)
        return bytes(cloudpickle.dumps((task_id, key, blob, tuple(args), dict(kwargs)), protocol=5))
    except Exception as exc:
        culprit = _find_unpicklable(function, args, kwargs, name)
        raise SerializationError(f"{culprit} cannot be pickled: {_describe(exc)}") from exc


# Pickling a notebook function by value costs ~40 us; a no-op round trip is a few times
# that. So the blob is kept per function and reused while the globals its code names (and
# its closure and defaults) are still bound to the same objects: rebinding ``factor = 3``
# in a notebook gives a fresh blob; mutating an object in place does not (as in Ray and
# Dask, which pickle a function once). Workers cache the loaded function by ``key``.
_blobs: weakref.WeakKeyDictionary[Callable[..., Any], tuple[tuple[int, ...], int, bytes]] = (
    weakref.WeakKeyDictionary()
)
_blob_lock = threading.Lock()
_keys = itertools.count(1)


def _function_blob(function: Callable[..., Any]) -> tuple[int, bytes]:
    mark = _fingerprint(function)
    try:
        with _blob_lock:
            hit = _blobs.get(function)
    except TypeError:  # not weak-referenceable (a builtin, a callable object)
        hit = None
    if hit is not None and hit[0] == mark:
        return hit[1], hit[2]
    blob = bytes(cloudpickle.dumps(function, protocol=5))
    key = next(_keys)
    try:
        with _blob_lock:
            _blobs[function] = (mark, key, blob)
    except TypeError:
        pass
    return key, blob


def _fingerprint(function: Callable[..., Any]) -> tuple[int, ...]:
    if not isinstance(function, FunctionType):
        return (id(function),)
    namespace = function.__globals__
    missing = object()
    mark = [id(function.__code__), id(function.__defaults__), id(function.__kwdefaults__)]
    mark += [id(namespace.get(name, missing)) for name in _global_names(function.__code__)]
    for cell in function.__closure__ or ():
        try:
            mark.append(id(cell.cell_contents))
        except ValueError:  # an empty cell
            mark.append(0)
    return tuple(mark)


def _global_names(code: CodeType) -> tuple[str, ...]:
    names = _names_cache.get(code)
    if names is None:
        found = list(code.co_names)
        for const in code.co_consts:
            if isinstance(const, CodeType):
                found += _global_names(const)
        names = _names_cache[code] = tuple(dict.fromkeys(found))
    return names


_names_cache: weakref.WeakKeyDictionary[CodeType, tuple[str, ...]] = weakref.WeakKeyDictionary()


def _find_unpicklable(
    function: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], name: str
) -> str:
    parts: list[tuple[str, Any]] = [(f"the function {name}", function)]
    parts += [(f"argument {i} of {name}", value) for i, value in enumerate(args)]
    parts += [(f"keyword argument {key!r} of {name}", value) for key, value in kwargs.items()]
    for label, value in parts:
        try:
            cloudpickle.dumps(value)
        except Exception:
            return f"{label} ({type(value).__name__})"
    return f"the call of {name}"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def load_outcome(
    kind: int,
    payload: bytes | bytearray,
    task_id: int,
    name: str,
    sources: Mapping[str, str] | None = None,
) -> Any:
    """The task's value for RETURN; raises what the task should raise for RAISE.

    A ``ProtocolError`` means the frame does not belong to this task (the worker is broken).
    """
    if kind == protocol.RETURN:
        try:
            got_id, value = cloudpickle.loads(payload)
        except Exception as exc:
            raise SerializationError(
                f"the result of {name} could not be unpickled in the driver: {_describe(exc)}"
            ) from exc
        if got_id != task_id:
            raise protocol.ProtocolError(f"RETURN for task {got_id}, expected {task_id}")
        return value
    if kind != protocol.RAISE:
        raise protocol.ProtocolError(f"expected RETURN or RAISE, got kind {kind}")
    info = pickle.loads(payload)
    phase, text = info["phase"], restore_frames(info["traceback"], sources or {})
    cause, remote_type = rebuild(info["exception"], cloudpickle.loads)
    if phase == "result":
        summary = f"{info['type']}: {info['message']}"
        raise SerializationError(f"the result of {name} cannot be pickled: {summary}")
    if phase == "load":
        where = f"{name} (unpickling its call in the worker)"
        error = RemoteTaskError.wrap(where, text, cause, remote_type)
    else:
        error = RemoteTaskError.wrap(name, text, cause, remote_type)
    raise error
