"""The worker bootstrap: ``python /path/to/_entry.py --fd N`` inside a composed environment.

Started by ``process.WorkerProcess.start`` (driver side), which passes one end of a
socketpair as fd ``N`` (``pass_fds``); stdout and stderr are pipes the driver forwards, so
user output never shares the channel. It is run by *file path*, not with ``-m``, so that
the environment's interpreter needs neither ``jupyter_runtimeenv`` installed nor the
package's ``__init__`` executed; ``python -m jupyter_runtimeenv.workers._entry`` works too.

Order of events, which is the point of this file:

1. drop this file's directory from ``sys.path`` (a user module named ``protocol`` must not
   find ours);
2. put the driver's entries (JSON list in ``JUPYTER_RUNTIMEENV_SYS_PATH``) that this
   interpreter does not already have first on ``sys.path``, in the driver's order;
3. only then make sure cloudpickle can be imported (the environment's own, else the
   driver's copy loaded by file path, so nothing else of the driver's site-packages leaks
   in), run the spec's ``worker_process_setup_hook`` if it has one, and say HELLO (carrying
   the hook's failure, after which the worker exits);
4. serve CALL frames one at a time with RETURN or RAISE, until EOF on the channel.

Imports: the standard library and cloudpickle only, and as few as possible before HELLO:
a worker's start is on the critical path of every new pool. cloudpickle itself (~30 ms
with the modules it pulls in) is imported when first needed: by ``pickle.loads`` for a
function pickled by value, or to pickle an error or an awkward result; a function
importable by reference never pays for it. ``typing``, ``socket``, ``threading`` and
``contextlib`` are avoided (the channel is driven with ``os.readv``/``os.write``).
"""

from __future__ import annotations

import _thread
import importlib.util
import json
import os
import pickle
import sys
import time

TYPE_CHECKING = False  # importing typing costs ~3 ms at start; annotations are strings
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

SYS_PATH_VAR = "JUPYTER_RUNTIMEENV_SYS_PATH"
CLOUDPICKLE_VAR = "JUPYTER_RUNTIMEENV_CLOUDPICKLE_DIR"
SETUP_HOOK_VAR = "JUPYTER_RUNTIMEENV_SETUP_HOOK"
#: Set for a worker started ahead of its first task (``Pool.prestart``): it has time to
#: import cloudpickle after HELLO, before that task comes. Removed from the environment.
WARM_VAR = "JUPYTER_RUNTIMEENV_WARM"
_HERE = os.path.dirname(os.path.abspath(__file__))
#: Functions loaded per driver-assigned key; the driver sends the blob anyway (it is small).
_FUNCTION_CACHE_SIZE = 256


def apply_sys_path(entries: list[str], path: list[str]) -> list[str]:
    """Put the ``entries`` that ``path`` lacks first, in their order; return those added."""
    present = set(path)
    added = [e for e in dict.fromkeys(entries) if e not in present]
    path[0:0] = added
    return added


def _load_by_path(name: str, init: str, package_dir: str | None = None) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        name, init, submodule_search_locations=[package_dir] if package_dir else None
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name} from {init}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def ensure_cloudpickle() -> None:
    """Make ``import cloudpickle`` work here without importing it (that is left to need).

    An isolated environment without cloudpickle gets the driver's (pure Python) copy,
    loaded by path and registered under its own name so that unpickling finds it.
    """
    if "cloudpickle" in sys.modules or importlib.util.find_spec("cloudpickle") is not None:
        return
    fallback = os.environ.get(CLOUDPICKLE_VAR)
    if not fallback:
        raise ImportError("No module named 'cloudpickle' (and no fallback given)")
    _load_by_path("cloudpickle", os.path.join(fallback, "__init__.py"), fallback)


def cloudpickle_dumps(obj: object, protocol: int | None = None) -> bytes:
    """``cloudpickle.dumps``, importing cloudpickle on first use."""
    import cloudpickle

    data: bytes = cloudpickle.dumps(obj, protocol=protocol)
    return data


class FdChannel:
    """The worker's end of the socketpair, with the two methods ``protocol`` uses.

    Plain ``os`` calls on the descriptor: the ``socket`` module costs ~3 ms to import.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def recv_into(self, view: memoryview) -> int:
        return os.readv(self.fd, [view])

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]


def _watch_parent(parent: int) -> None:
    # If the driver is SIGKILLed while a task runs, nobody reads our EOF: exit on our own.
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(70)


def failure(phase: str, exc: BaseException, dumps: Callable[[object], bytes], skip: int) -> bytes:
    """The RAISE payload: plain values, so the driver can read it even if ``exc`` won't load.

    ``phase`` is ``"call"`` (the function raised), ``"load"`` (the CALL could not be
    unpickled here) or ``"result"`` (the return value could not be pickled).
    """
    import traceback  # only on the error path: keeps the start fast

    tb = exc.__traceback__
    for _ in range(skip):  # drop the bootstrap's own frames
        if tb is not None:
            tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    try:
        blob: bytes | None = dumps(exc)
    except Exception:
        blob = None  # the traceback text still tells the story
    kind = type(exc)
    return pickle.dumps(
        {
            "phase": phase,
            "type": f"{kind.__module__}.{kind.__qualname__}",
            "message": str(exc),
            "traceback": text,
            "exception": blob,
        }
    )


def run_setup_hook(raw: str | None) -> dict[str, str] | None:
    """Run the worker_process_setup_hook described by ``raw``; its failure, or None."""
    if not raw:
        return None
    name = "worker_process_setup_hook"
    try:
        hook = json.loads(raw)
        if "import" in hook:
            name = hook["import"]
            module_name, _, attr = name.replace(":", ".").rpartition(".")
            func = getattr(importlib.import_module(module_name), attr)
        else:
            name = hook.get("name", name)
            with open(hook["pickle"], "rb") as f:
                func = pickle.loads(f.read())
        func()
        _flush()
    except BaseException as exc:
        import traceback

        _flush()
        return {
            "hook": name,
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        }
    return None


def serve(sock: FdChannel, protocol: ModuleType) -> None:
    """Answer CALL frames until the driver closes the channel."""
    dumps = cloudpickle_dumps
    loads = pickle.loads
    send = protocol.send_frame
    functions: dict[int, Any] = {}
    while True:
        frame = protocol.recv_frame(sock)
        if frame is None:
            return
        kind, payload = frame
        if kind != protocol.CALL:
            raise protocol.ProtocolError(f"worker expected CALL, got kind {kind}")
        try:
            task_id, key, blob, args, kwargs = loads(payload)
            function = functions.get(key)
            if function is None:
                function = functions[key] = loads(blob)
                if len(functions) > _FUNCTION_CACHE_SIZE:
                    del functions[next(iter(functions))]
        except BaseException as exc:
            send(sock, protocol.RAISE, failure("load", exc, dumps, 0))
            continue
        del payload, blob
        try:
            value = function(*args, **kwargs)
        except BaseException as exc:
            _flush()
            send(sock, protocol.RAISE, failure("call", exc, dumps, 1))
            continue
        finally:
            del args, kwargs
        _flush()
        try:
            try:  # plain pickle is several times faster; cloudpickle for what it refuses
                data = pickle.dumps((task_id, value), protocol=5)
            except Exception:
                data = dumps((task_id, value), protocol=5)
        except BaseException as exc:
            send(sock, protocol.RAISE, failure("result", exc, dumps, 0))
            continue
        finally:
            del value
        send(sock, protocol.RETURN, data)
        del data


def _flush() -> None:
    # The driver attributes output read before RETURN to the task; make it all be there.
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 - contextlib is not imported before it is needed
            stream.flush()
        except Exception:
            pass


def main(argv: list[str]) -> int:
    if sys.path and os.path.abspath(sys.path[0] or ".") == _HERE:
        del sys.path[0]
    added = apply_sys_path(json.loads(os.environ.get(SYS_PATH_VAR) or "[]"), sys.path)
    if len(argv) != 2 or argv[0] != "--fd":
        print("usage: _entry.py --fd N", file=sys.stderr)
        return 2
    protocol = _load_by_path("_jupyter_runtimeenv_protocol", os.path.join(_HERE, "protocol.py"))
    ensure_cloudpickle()
    sock = FdChannel(int(argv[1]))
    # Output goes to pipes: line buffering lets the driver show it as it comes.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    _thread.start_new_thread(_watch_parent, (os.getppid(),))
    setup_error = run_setup_hook(os.environ.get(SETUP_HOOK_VAR))
    hello = {
        "version": protocol.PROTOCOL_VERSION,
        "pid": os.getpid(),
        "python": sys.version,
        "sys_path_added": added,
    }
    if setup_error is not None:
        hello["setup_error"] = setup_error
    protocol.send_frame(sock, protocol.HELLO, json.dumps(hello).encode())
    if setup_error is not None:
        return 4
    if os.environ.pop(WARM_VAR, None):
        try:  # noqa: SIM105 - contextlib is not imported before it is needed
            import cloudpickle  # noqa: F401 (see WARM_VAR)
        except Exception:
            pass  # the first call that needs it reports the error, as in any worker
    try:
        serve(sock, protocol)
    except (protocol.ProtocolError, OSError) as exc:
        print(f"jupyter-runtimeenv worker: channel broken: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    _flush()
    # Not sys.exit: a non-daemon thread left by a task must not keep the worker alive.
    os._exit(code)
