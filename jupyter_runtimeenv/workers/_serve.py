"""The worker's task loop: CALL frames in, RETURN/RAISE/SKIP frames out (see ``protocol``).

Loaded by file path by the bootstrap (``_entry.py``) after HELLO's preparations, like
``protocol`` and ``shm``: the standard library only (cloudpickle when a call needs it).

- Calls are pipelined: the driver may send several; they queue here (``pending``) and run
  one at a time, in order. Before each the worker writes the call's id into its status word
  and reads what has arrived, so a CANCEL that came in time turns the call into a SKIP; the
  word is cleared once the call is answered (``protocol`` says why).
- Between calls it waits for the next with a blocking read, or polls for it for a moment
  first while calls come back to back and a CPU is spare (``protocol.Spin``).
- A function comes once per worker (FUNC, by key) and is unpickled at its first call.
- Large buffers of the arguments are views of the driver's shared memory (``shm``); large
  buffers of a result go out through this worker's own arena when the driver allows it.
- After a call, modules it imported from the environment's installed packages or the
  standard library are reported (IMPORTS): the pool has its next workers import them before
  their first call (PRELOAD, answered by READY).
- A child of ``os.fork()`` in a task never talks on the channel: the at-fork hook points its
  copy of the socket at ``/dev/null``, and a child that returns from the task into this loop
  exits at once instead of answering.
"""

from __future__ import annotations

import _socket
import json
import mmap
import os
import pickle
import sys
import time
from collections import deque  # loaded by json already

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

#: Most functions a worker keeps unpickled; the driver mirrors this (FUNC names what to drop).
FUNCTION_CACHE_SIZE = 256
_DONTWAIT = int(_socket.MSG_DONTWAIT)
_INSTALLED = os.sep + "site-packages" + os.sep
_DIST = os.sep + "dist-packages" + os.sep
#: A worker stops preloading learned modules after this long and takes calls.
PRELOAD_SECONDS = 60.0
#: The modules a template had imported when it began to fork (``remember_modules``): its
#: forks start with them, and a forked worker knows them from here instead of a copy of
#: ``sys.modules`` (whose ~100 keys' reference counts were ~90 copy-on-write faults of
#: the template's pages, ~0.3 ms of each fork's start on a VM).
_template_modules: frozenset[str] = frozenset()


def remember_modules() -> None:
    """In a template, before its first fork: the modules every fork of it starts with."""
    global _template_modules
    _template_modules = frozenset(sys.modules)


def cloudpickle_dumps(obj: object, protocol: int | None = None, **kwargs: Any) -> bytes:
    """``cloudpickle.dumps``, importing cloudpickle on first use."""
    import cloudpickle

    data: bytes = cloudpickle.dumps(obj, protocol=protocol, **kwargs)
    return data


def failure(
    phase: str,
    exc: BaseException,
    dumps: Callable[[object], bytes],
    skip: int,
    task_id: int,
    exc_state: ModuleType,
) -> bytes:
    """The RAISE payload: plain values, so the driver can read it even if ``exc`` won't load.

    ``phase`` is ``"call"`` (the function raised), ``"load"`` (the CALL could not be
    unpickled here) or ``"result"`` (the return value could not be pickled).
    """
    import traceback  # only on the error path: keeps the start fast

    tb = exc.__traceback__
    for _ in range(skip):  # drop the loop's own frames
        if tb is not None:
            tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    kind = type(exc)
    return pickle.dumps(
        {
            "task": task_id,
            "phase": phase,
            "type": f"{kind.__module__}.{kind.__qualname__}",
            "message": exc_state.safe_str(exc),
            "traceback": text,
            # its pieces, so that the driver rebuilds it as its own type (``_exc_state``)
            "exception": exc_state.describe(exc, dumps),
        }
    )


#: Arguments' pickles up to this size are unpickled from a slice of their CALL (a copy: 0.45
#: vs 0.88 us through a memoryview for an empty call's), larger ones through a view.
_SLICED = 4096


def _pickle(value: Any, callback: Any, oob: list[memoryview]) -> bytes:
    try:  # plain pickle is several times faster; cloudpickle for what it refuses
        return pickle.dumps(value, protocol=5, buffer_callback=callback)
    except Exception:
        oob.clear()
        return cloudpickle_dumps(value, protocol=5, buffer_callback=callback)


def flush_std() -> None:
    # The driver attributes output read before an answer to its call: make it all be there.
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 - contextlib is not imported before it is needed
            stream.flush()
        except Exception:
            pass


class Worker:
    """This process's end of the channel and everything the loop keeps between calls."""

    def __init__(
        self,
        fd: int,
        protocol: ModuleType,
        shm: ModuleType,
        exc_state: Callable[[], ModuleType],
        stdio_intact: Callable[[], bool],
        spin: Any,
    ) -> None:
        self.protocol = protocol
        self.shm = shm
        self.exc_state = exc_state
        self.stdio_intact = stdio_intact
        self.pid = os.getpid()
        self.fd = fd
        os.set_inheritable(fd, False)  # exec'd children must not hold the channel
        self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0, fd)
        self.reader = protocol.Reader(self.sock)
        self._status_fd = shm.memfd("jupyter-runtimeenv-status", protocol.STATUS.size)
        self.status = mmap.mmap(self._status_fd, protocol.STATUS.size)
        self.functions: dict[bytes, Any] = {}
        self.pending: deque[tuple[int, bytes, int, list[Any], bytes, int]] = deque()
        self.pending_ids: set[int] = set()
        #: Whether to poll for the next call before blocking (``protocol.Spin``).
        self.spin = spin
        self.cancelled: set[int] = set()
        self.arguments: Any = None  # shm.Mappings of the driver's segments, when first needed
        self.results: Any = None  # shm.Arena for large results, when first needed
        self.shown: set[int] = set()  # result segments the driver has mapped
        #: Large buffers of the result being pickled, and the callback that collects them
        #: (made once: not a closure per call).
        self._oob: list[memoryview] = []
        self._collect = self._collector(self._oob)
        #: Modules known (not new to report): the template's and ``modules``. A fork that
        #: has imported nothing since its template is not looked through (iterating
        #: ``sys.modules`` writes each key's reference count: the faults above).
        self.known = _template_modules
        same = len(sys.modules) == len(self.known)
        self.modules: set[str] = set() if same else set(sys.modules).difference(self.known)
        self.module_count = len(sys.modules)
        self.stdlib = os.path.dirname(os.__file__) + os.sep
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        """In a child of ``os.fork()`` (a task forked): take the channel away from it."""
        try:
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, self.fd, inheritable=False)
            os.close(null)
        except OSError:
            pass
        try:  # noqa: SIM105 - contextlib is not imported before it is needed
            self.status.close()
        except Exception:
            pass

    # -- sending --------------------------------------------------------------------------

    def send(self, frames: list[Any], fds: list[int] | None = None) -> None:
        self.protocol.send(self.sock, frames, fds or ())

    def hello(self, hello: dict[str, Any]) -> None:
        """Say HELLO, with the status word's descriptor (the driver maps it)."""
        P = self.protocol
        self.send(P.frame(P.HELLO, json.dumps(hello).encode()), [self._status_fd])
        os.close(self._status_fd)

    # -- the loop -------------------------------------------------------------------------

    def serve(self) -> bool:
        """Answer calls until the driver closes the channel (``False``), or until a call
        broke our stdout/stderr (``True``: that call is answered; the calls held after it
        never start here, and the driver gives them to another worker)."""
        P = self.protocol
        pending, reader, status, sock = self.pending, self.reader, self.status, self.sock
        if not self.stdio_intact():
            return True
        while True:
            if not pending:
                if not reader.wait(self.spin):
                    return False
                self.absorb()
                continue
            task_id = pending[0][0]
            P.STATUS.pack_into(status, 0, task_id)
            # A CANCEL that came while the previous call ran. A poll first: ~1 us, where a
            # read that finds nothing raises (~2-3 us), as it does on nearly every call.
            if reader.arrived():
                try:
                    reader.pump(_DONTWAIT)
                except BlockingIOError:
                    pass
                else:
                    self.absorb()
            self.pending_ids.discard(task_id)
            if task_id in self.cancelled:
                self.cancelled.discard(task_id)
                spans = pending.popleft()[3]
                if spans:  # its arguments' segment was held, never used
                    self.arguments.unhold({s[0] for s in spans})
                out, fds = P.frame(P.SKIP, P.ID.pack(task_id)), None
            else:
                out, fds = self.run(pending.popleft())
            if fds is None and len(out) == 1:  # one small answer (``protocol.send``'s case)
                sock.sendall(out[0])
            else:
                self.send(out, fds)
            P.STATUS.pack_into(status, 0, 0)
            # Only a call can break them (two fstat calls: once per call, not per wake-up).
            if not self.stdio_intact():
                return True

    def absorb(self) -> None:
        """Take in every frame read so far."""
        P = self.protocol
        for kind, payload in self.reader.frames():
            if kind == P.CALL:
                task_id, key, flags, count = P.CALL_HEAD.unpack_from(payload)
                self.spin.told = flags & P.SPARE != 0  # for the wait after this call
                start = P.CALL_HEAD.size
                if count:
                    size = P.SPAN.size
                    spans = [P.SPAN.unpack_from(payload, start + i * size) for i in range(count)]
                    start += count * size
                    self._map_arguments(spans)
                else:
                    spans = []
                self.pending.append((task_id, key, flags, spans, payload, start))
                self.pending_ids.add(task_id)
            elif kind == P.FUNC:
                key, blob, forget = pickle.loads(payload)
                for old in forget:
                    self.functions.pop(old, None)
                self.functions[key] = blob  # unpickled at its first call
            elif kind == P.CANCEL:
                for (task_id,) in P.ID.iter_unpack(payload):
                    if task_id in self.pending_ids:
                        self.cancelled.add(task_id)
            elif kind == P.FREE:
                for (segment_id,) in P.SEGMENT.iter_unpack(payload):
                    if self.results is not None:
                        self.results.free(segment_id)
            elif kind == P.DROP:
                for (segment_id,) in P.SEGMENT.iter_unpack(payload):
                    if self.arguments is not None:
                        self.arguments.drop(segment_id)
            elif kind == P.PRELOAD:
                self.preload(json.loads(payload))
            else:
                raise P.ProtocolError(f"worker got frame kind {kind}")

    def _map_arguments(self, spans: list[tuple[int, int, int]]) -> None:
        if self.arguments is None:
            self.arguments = self.shm.Mappings()
        segments = {s[0] for s in spans}
        for segment_id in sorted(segments):
            if not self.arguments.knows(segment_id):
                self.arguments.attach(segment_id, self.reader.take_fd())
        self.arguments.hold(segments)

    def run(self, call: tuple[int, bytes, int, list[Any], bytes, int]) -> tuple[list[Any], Any]:
        """Run one call; the frames that answer it (and a descriptor to send with them)."""
        P = self.protocol
        task_id, key, flags, spans, payload, start = call
        del call  # the payload goes as soon as it is unpickled
        try:
            function = self.functions[key]
            if type(function) is bytes:
                function = self.functions[key] = pickle.loads(function)
            buffers = self.arguments.views(spans) if spans else None
            if len(payload) - start <= _SLICED:  # a copy of a few bytes: cheaper than a view
                args, kwargs = pickle.loads(payload[start:], buffers=buffers)
            else:
                with memoryview(payload) as view:
                    args, kwargs = pickle.loads(view[start:], buffers=buffers)
            del buffers
        except BaseException as exc:
            return P.frame(P.RAISE, self._failure("load", exc, 0, task_id)), None
        finally:
            if spans:  # the objects built on the segment hold it from now on
                self.arguments.unhold({s[0] for s in spans})
        del payload
        started = time.perf_counter_ns()
        try:
            value = function(*args, **kwargs)
        except BaseException as exc:
            self._still_the_worker()
            flush_std()
            return P.frame(P.RAISE, self._failure("call", exc, 1, task_id)), None
        finally:
            del args, kwargs
        duration = time.perf_counter_ns() - started
        self._still_the_worker()
        flush_std()
        fds = None
        try:
            data, result_spans, fd = self.dump_result(task_id, value, flags & P.RESULT_SHARED)
        except BaseException as exc:
            return P.frame(P.RAISE, self._failure("result", exc, 0, task_id)), None
        finally:
            del value
        if fd is not None:
            fds = [fd]
        # What ``_notices`` looks at, first here: there is nothing to tell on most calls.
        quiet = self.arguments is None and self.results is None
        out = [] if quiet and len(sys.modules) == self.module_count else self._notices()
        head = P.RETURN_HEAD.pack(task_id, duration, len(result_spans))
        if result_spans:
            head += b"".join(P.SPAN.pack(*s) for s in result_spans)
        size = len(head) + len(data)
        if size < P._SMALL:  # ``P.frame``'s one buffer, without its generic steps
            out.append(P.HEADER.pack(P.RETURN, size) + head + data)
        else:
            out += P.frame(P.RETURN, head, data)
        return out, fds

    def _failure(self, phase: str, exc: BaseException, skip: int, task_id: int) -> bytes:
        return failure(phase, exc, cloudpickle_dumps, skip, task_id, self.exc_state())

    def _still_the_worker(self) -> None:
        if os.getpid() != self.pid:  # a forked child returned from the task: it ends here
            flush_std()
            os._exit(0)

    def dump_result(
        self, task_id: int, value: Any, shared: int
    ) -> tuple[bytes, list[tuple[int, int, int]], int | None]:
        oob = self._oob
        oob.clear()  # a result that could not be pickled may have left buffers in it
        data = _pickle(value, self._collect if shared else None, oob)
        if not oob:
            return data, [], None
        if self.results is None:
            self.results = self.shm.Arena("jupyter-runtimeenv-result", tell_drops=True)
        try:
            segment, spans = self.results.put(oob)
        except (OSError, MemoryError, ValueError):  # no room in shared memory: in band
            oob.clear()
            return _pickle(value, None, oob), [], None
        finally:
            oob.clear()
        fd = None
        if segment.id not in self.shown:
            self.shown.add(segment.id)
            fd = segment.fd
        return data, spans, fd

    def _collector(self, oob: list[memoryview]) -> Callable[[pickle.PickleBuffer], bool]:
        least = self.shm.OOB_MIN

        def collect(buffer: pickle.PickleBuffer) -> bool:
            try:
                raw = buffer.raw()
            except BufferError:
                return True
            if raw.nbytes < least:
                return True
            oob.append(raw)
            return False

        return collect

    def _notices(self) -> list[Any]:
        """FREE, DROP and IMPORTS frames due with the next answer."""
        P = self.protocol
        out: list[Any] = []
        if self.arguments is not None:
            freed = self.arguments.take_freed()
            if freed:
                out += P.frame(P.FREE, b"".join(P.SEGMENT.pack(i) for i in freed))
        if self.results is not None:
            dropped = self.results.take_dropped()
            if dropped:
                self.shown.difference_update(dropped)
                out += P.frame(P.DROP, b"".join(P.SEGMENT.pack(i) for i in dropped))
        if len(sys.modules) != self.module_count:
            learned = self.learned()
            if learned:
                out += P.frame(P.IMPORTS, json.dumps(learned).encode())
        return out

    # -- learned imports ------------------------------------------------------------------

    def learned(self) -> list[str]:
        """Modules imported since the last call that a new worker may import up front: from
        installed packages or the standard library, not the user's own code."""
        modules = sys.modules
        known = self.known
        new = [name for name in list(modules) if name not in self.modules and name not in known]
        self.modules.update(new)
        self.module_count = len(modules)
        out = []
        for name in new:
            module = modules.get(name)
            path = getattr(module, "__file__", None)
            if not isinstance(path, str) or name.startswith(("__main__", "_jupyter_runtimeenv")):
                continue
            if _INSTALLED in path or _DIST in path or path.startswith(self.stdlib):
                out.append(name)
        return out

    def preload(self, names: list[str]) -> None:
        """Import what the pool learned, before the first call; then say READY."""
        import importlib
        import io

        P = self.protocol
        started = time.monotonic()
        failed: list[str] = []
        imported = 0
        saved = sys.stdout, sys.stderr
        sink = io.StringIO()  # import-time chatter was shown once, with the first import
        sys.stdout = sys.stderr = sink
        try:
            for name in names:
                if time.monotonic() - started > PRELOAD_SECONDS:
                    failed.append(f"(stopped after {PRELOAD_SECONDS:.0f} s)")
                    break
                if name in sys.modules:
                    continue
                try:
                    importlib.import_module(name)
                    imported += 1
                except BaseException:
                    failed.append(name)
        finally:
            sys.stdout, sys.stderr = saved
        self.modules = set(sys.modules)
        self.module_count = len(sys.modules)
        ready = {
            "imported": imported,
            "failed": failed[:20],
            "seconds": round(time.monotonic() - started, 3),
        }
        self.send(P.frame(P.READY, json.dumps(ready).encode()))
