"""Driver-side (de)serialisation of calls and outcomes, with errors that name the culprit.

``prepare_call`` is called by ``LocalExecutor.submit`` in the submitting thread, so arguments
are snapshotted at ``.remote()`` time and an unpicklable one fails right there. A call is
three parts: the function's key and pickle (made once per function, see ``function_info``;
a worker gets the pickle once, in a FUNC frame, and later calls name the key), and the body,
the pickle of ``(args, kwargs)``. Large buffers of the arguments (pickle protocol 5) are
copied into the driver's shared memory arena (``shm``) instead of the body when an arena is
given. ``dump_call`` packs the same parts into one self-contained bytes object, in band, for
a Dask node (which hands it to a worker of its own without unpickling it) and for tests.
``load_outcome`` is called by a worker's reader thread on RETURN/RAISE frames, and by the
Dask executor on the bytes a node sends back.
"""

from __future__ import annotations

import hashlib
import pickle
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import CodeType, FunctionType
from typing import Any

import cloudpickle

from .._exc_state import rebuild
from ..errors import RemoteTaskError, SerializationError
from . import protocol, shm
from .tracebacks import code_files, restore_frames

_PACKED = "jupyter-runtimeenv-call-2"


@dataclass(eq=False, slots=True)
class Call:
    """One call as the driver sends it (see the module docstring)."""

    task_id: int
    key: bytes
    blob: bytes
    body: bytes
    #: Out-of-band buffers of the arguments in the driver's arena: (segment, offset, length).
    spans: Sequence[tuple[int, int, int]] = ()  # not a list each: see future.py on the GC
    segment: shm.Segment | None = None
    arena: shm.Arena | None = None
    #: Code name -> filename of the function (see ``tracebacks``).
    sources: dict[str, str] = field(default_factory=dict)
    #: The segment is lent to a worker (sent, and not yet freed, skipped or dead there).
    lent: bool = False
    #: The task is over (its future is done): the segment goes back once not lent.
    done: bool = False

    # The arguments' segment returns to the arena when both the task is over and no worker
    # holds it: a worker that started the call says FREE once the objects built on it are
    # gone (a task may keep one), one that skipped it says SKIP, a dead one holds nothing;
    # a task that is redelivered is not over. Called by the channel and the future.

    def lend(self) -> None:
        with _share_lock:
            self.lent = True

    def unlend(self) -> None:
        with _share_lock:
            self.lent = False
            segment = self._take_segment()
        self._release(segment)

    def finish(self) -> None:
        with _share_lock:
            self.done = True
            segment = self._take_segment()
        self._release(segment)

    def _take_segment(self) -> shm.Segment | None:
        if self.lent or not self.done or self.segment is None:
            return None
        segment, self.segment = self.segment, None
        return segment

    def _release(self, segment: shm.Segment | None) -> None:
        if segment is not None and self.arena is not None:
            self.arena.free(segment.id)


_share_lock = threading.Lock()


def prepare_call(
    task_id: int,
    function: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    name: str,
    arena: shm.Arena | None = None,
) -> Call:
    """The call, ready to send; ``SerializationError`` names the part that cannot be pickled."""
    try:
        info = function_info(function)
        body, oob = _dump_body(tuple(args), dict(kwargs), arena is not None)
    except Exception as exc:
        culprit = _find_unpicklable(function, args, kwargs, name)
        raise SerializationError(f"{culprit} cannot be pickled: {_describe(exc)}") from exc
    call = Call(task_id, info.key, info.blob, body, sources=info.sources)
    if oob and arena is not None:
        try:
            call.segment, call.spans = arena.put(oob)
            call.arena = arena
        except (OSError, MemoryError, ValueError):  # no shared memory here: all in band
            call.body, _ = _dump_body(tuple(args), dict(kwargs), False)
    return call


def dump_call(
    task_id: int,
    function: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    name: str,
) -> bytes:
    """The call as one self-contained payload, all in band (see ``unpack_call``)."""
    call = prepare_call(task_id, function, args, kwargs, name)
    return pickle.dumps((_PACKED, call.task_id, call.key, call.blob, call.body), protocol=5)


def unpack_call(payload: bytes | bytearray) -> Call:
    """A ``dump_call`` payload as a ``Call``. Plain pickle of plain values: nothing of the
    task (its modules, its classes) is imported here."""
    try:
        tag, task_id, key, blob, body = pickle.loads(payload)
    except Exception as exc:
        raise ValueError(f"not a call payload: {_describe(exc)}") from exc
    if tag != _PACKED:
        raise ValueError(f"not a call payload of this version: {tag!r}")
    return Call(task_id, key, blob, body)


_EMPTY_BODY = pickle.dumps(((), {}), protocol=5)
_PLAIN = frozenset((int, float, str, bytes, bool, type(None), complex))


def _dump_body(
    args: tuple[Any, ...], kwargs: dict[str, Any], shared: bool
) -> tuple[bytes, list[memoryview]]:
    if not args and not kwargs:
        return _EMPTY_BODY, []
    if _plain(args, 0) and _plain(kwargs, 0):
        # Plain pickle is several times faster; it is also exact for plain values only
        # (it would name a notebook's class by reference, which a worker cannot import).
        return pickle.dumps((args, kwargs), protocol=5), []
    oob: list[memoryview] = []
    callback = _collector(oob) if shared else None
    body = cloudpickle.dumps((args, kwargs), protocol=5, buffer_callback=callback)
    return body, oob


def _collector(oob: list[memoryview]) -> Callable[[pickle.PickleBuffer], bool]:
    def collect(buffer: pickle.PickleBuffer) -> bool:
        try:
            raw = buffer.raw()
        except BufferError:  # not contiguous: in band
            return True
        if raw.nbytes < shm.OOB_MIN:
            return True
        oob.append(raw)
        return False

    return collect


def _plain(value: Any, depth: int) -> bool:
    """Whether ``value`` is made of plain builtins only (small containers, bounded depth)."""
    kind = type(value)
    if kind in _PLAIN:
        return True
    if depth > 2 or len(value) > 64 if kind in _CONTAINERS else True:
        return False
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or (type(item) not in _PLAIN and not _plain(item, depth + 1)):
                return False
        return True
    for item in value:  # noqa: SIM110 - a loop: all() of a generator costs ~1 us more
        if type(item) not in _PLAIN and not _plain(item, depth + 1):
            return False
    return True


_CONTAINERS = frozenset((tuple, list, dict))


# -- functions: pickled once ---------------------------------------------------------------
#
# Pickling a notebook function by value costs ~40 us; a no-op round trip is a few times
# that. So the pickle is kept per function and reused while the globals its code names (and
# its closure and defaults) are still bound to the same objects: rebinding ``factor = 3`` in
# a notebook gives a fresh pickle and key; mutating an object in place does not (as in Ray
# and Dask, which pickle a function once). A function cloudpickle sends by reference (it
# lives in an importable module) is a few bytes naming it and never changes. The key is a
# digest of the pickle: a worker that has it does not get the pickle again.


@dataclass(eq=False, slots=True)
class FunctionInfo:
    #: ``None``: pickled by reference (nothing to recheck); else the fingerprint it had.
    mark: tuple[int, ...] | None
    key: bytes
    blob: bytes
    sources: dict[str, str]
    #: The global names the function's code (and code nested in it) reads.
    names: tuple[str, ...] = ()


_infos: dict[int, tuple[weakref.ref[Any], FunctionInfo]] = {}
_infos_lock = threading.Lock()


def function_info(function: Callable[..., Any]) -> FunctionInfo:
    """The function's key, pickle and source files, made once (see above)."""
    hit = _infos.get(id(function))
    if hit is not None and hit[0]() is function:
        info = hit[1]
        if info.mark is None or info.mark == _fingerprint(function, info.names):
            return info
    by_value = not _by_reference(function)
    code = getattr(function, "__code__", None)
    names = _global_names(code) if isinstance(code, CodeType) else ()
    mark = _fingerprint(function, names) if by_value else None
    blob = bytes(cloudpickle.dumps(function, protocol=5))
    key = hashlib.blake2b(blob, digest_size=protocol.KEY_SIZE).digest()
    info = FunctionInfo(mark, key, blob, code_files(function), names)
    ident = id(function)

    def forget(ref: weakref.ref[Any], ident: int = ident) -> None:
        _forget(ident, ref)

    try:
        ref = weakref.ref(function, forget)
    except TypeError:  # not weak-referenceable (a builtin, some callables): not kept
        return info
    with _infos_lock:
        _infos[ident] = (ref, info)
    return info


def _forget(ident: int, ref: weakref.ref[Any]) -> None:
    with _infos_lock:
        hit = _infos.get(ident)
        if hit is not None and hit[0] is ref:
            del _infos[ident]


def _by_reference(function: Callable[..., Any]) -> bool:
    if not isinstance(function, FunctionType):
        return False
    check = getattr(getattr(cloudpickle, "cloudpickle", None), "_should_pickle_by_reference", None)
    if check is None:
        return False
    try:
        return bool(check(function))
    except Exception:
        return False


def _fingerprint(function: Callable[..., Any], names: tuple[str, ...]) -> tuple[int, ...]:
    if not isinstance(function, FunctionType):
        return (id(function),)
    namespace = function.__globals__
    mark = [id(function.__code__), id(function.__defaults__), id(function.__kwdefaults__)]
    if names:
        get = namespace.get
        mark += [id(get(name, _MISSING)) for name in names]
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


_MISSING = object()
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


# -- outcomes ------------------------------------------------------------------------------


def split_return(payload: bytes | bytearray) -> tuple[int, int, list[tuple[int, int, int]], int]:
    """A RETURN payload's task id, call duration (ns), spans and where its pickle starts."""
    if len(payload) < protocol.RETURN_HEAD.size:
        raise protocol.ProtocolError(f"RETURN of {len(payload)} bytes is too short")
    task_id, duration, count = protocol.RETURN_HEAD.unpack_from(payload)
    offset = protocol.RETURN_HEAD.size
    if len(payload) < offset + count * protocol.SPAN.size:
        raise protocol.ProtocolError(f"RETURN names {count} buffers it does not describe")
    if not count:  # the common case: no list comprehension (its frame) on every answer
        return task_id, duration, [], offset
    spans = [
        protocol.SPAN.unpack_from(payload, offset + i * protocol.SPAN.size) for i in range(count)
    ]
    return task_id, duration, spans, offset + count * protocol.SPAN.size


#: Up to this many bytes, a RETURN's pickle is unpickled from a copy (a slice of the payload,
#: ~0.1 us) rather than through a memoryview (set up and released: ~0.8 us per answer).
SMALL_VALUE = _COPIED = 4096


def load_small_return(payload: bytes | bytearray, task_id: int, name: str) -> Any:
    """``load_outcome`` of a RETURN whose head names no buffers and whose pickle is at most
    ``SMALL_VALUE`` bytes (the caller checked both, and ``payload`` holds a whole head)."""
    got_id = protocol.RETURN_HEAD.unpack_from(payload)[0]
    if got_id != task_id:
        raise protocol.ProtocolError(f"RETURN for task {got_id}, expected {task_id}")
    try:
        return pickle.loads(payload[_HEAD:])
    except Exception as exc:
        raise SerializationError(
            f"the result of {name} could not be unpickled in the driver: {_describe(exc)}"
        ) from exc


_HEAD = protocol.RETURN_HEAD.size


def load_outcome(
    kind: int,
    payload: bytes | bytearray,
    task_id: int,
    name: str,
    sources: Mapping[str, str] | None = None,
    buffers: Sequence[memoryview] | None = None,
) -> Any:
    """The task's value for RETURN; raises what the task should raise for RAISE.

    ``buffers``: the RETURN's out-of-band buffers, mapped by the caller (the channel).
    A ``ProtocolError`` means the frame does not belong to this task (the worker is broken).
    """
    if kind == protocol.RETURN:
        got_id, _duration, spans, start = split_return(payload)
        if got_id != task_id:
            raise protocol.ProtocolError(f"RETURN for task {got_id}, expected {task_id}")
        if spans and buffers is None:
            raise protocol.ProtocolError("a RETURN in shared memory on a channel without it")
        try:
            if len(payload) - start <= _COPIED:  # a small value: a copy costs less than a view
                return pickle.loads(payload[start:], buffers=buffers)
            with memoryview(payload) as view:
                return pickle.loads(view[start:], buffers=buffers)
        except Exception as exc:
            raise SerializationError(
                f"the result of {name} could not be unpickled in the driver: {_describe(exc)}"
            ) from exc
    if kind != protocol.RAISE:
        raise protocol.ProtocolError(f"expected RETURN or RAISE, got kind {kind}")
    info = pickle.loads(payload)
    if info.get("task", task_id) != task_id:
        raise protocol.ProtocolError(f"RAISE for task {info.get('task')}, expected {task_id}")
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
