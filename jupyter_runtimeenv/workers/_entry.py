"""The worker bootstrap: ``python /path/to/_entry.py --fd N --lifeline L --parent P`` inside
a composed environment.

Started by ``process.WorkerProcess.start`` (driver side), which passes one end of a
socketpair as fd ``N`` and the read end of its lifeline as fd ``L`` (``pass_fds``); stdout
and stderr are pipes the driver forwards, so user output never shares the channel. With
``--zygote`` last it is a template that forks workers (``_zygote.py``); a worker forked from
it goes on below from step 2, with ``--forked`` in its command line. It is
run by *file path*, not with ``-m``, so that the environment's interpreter needs neither
``jupyter_runtimeenv`` installed nor the package's ``__init__`` executed; ``python -m
jupyter_runtimeenv.workers._entry`` works too.

Order of events, which is the point of this file:

1. drop this file's directory from ``sys.path`` (a user module named ``protocol`` must not
   find ours);
2. put the driver's entries (JSON list in ``JUPYTER_RUNTIMEENV_SYS_PATH``) that this
   interpreter does not already have first on ``sys.path``, in the driver's order;
3. only then make sure cloudpickle can be imported (the environment's own, else the
   driver's copy loaded by file path, so nothing else of the driver's site-packages leaks
   in), run the spec's ``worker_process_setup_hook`` if it has one, and say HELLO (carrying
   the hook's failure, after which the worker exits); the parent-death watchdog
   (``--lifeline``, ``--parent``: see ``watchdog``) is armed before any user code runs;
4. hand over to the task loop (``_serve.py``, loaded by file path like ``protocol.py`` and
   ``shm.py``), which answers calls until EOF on the channel, or until a task closed our
   stdout/stderr (it answers that call, then we exit: see ``stdio_intact``).

Imports: the standard library and cloudpickle only, and as few as possible before HELLO:
a worker's start is on the critical path of every new pool. cloudpickle itself (~30 ms
with the modules it pulls in) is imported when first needed: by ``pickle.loads`` for a
function pickled by value, or to pickle an error or an awkward result; a function
importable by reference never pays for it. ``typing``, ``socket``, ``threading`` and
``contextlib`` are avoided (the channel is driven with ``_socket``).
"""

from __future__ import annotations

import _thread
import importlib.util
import json
import os
import pickle
import signal
import sys
import time

TYPE_CHECKING = False  # importing typing costs ~3 ms at start; annotations are strings
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

SYS_PATH_VAR = "JUPYTER_RUNTIMEENV_SYS_PATH"
CLOUDPICKLE_VAR = "JUPYTER_RUNTIMEENV_CLOUDPICKLE_DIR"
SETUP_HOOK_VAR = "JUPYTER_RUNTIMEENV_SETUP_HOOK"
#: The env's trees whose files are links to the content store (see ``_cow.py``).
TREES_VAR = "JUPYTER_RUNTIMEENV_TREES"
#: Set for a worker started ahead of its first task (``Pool.prestart``): it has time to
#: import cloudpickle after HELLO, before that task comes. Removed from the environment.
WARM_VAR = "JUPYTER_RUNTIMEENV_WARM"
_HERE = os.path.dirname(os.path.abspath(__file__))
#: ``../_exc_state.py`` (the driver-side package's, loaded by path on the first error).
_EXC_STATE = "_jupyter_runtimeenv_exc_state"


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


# -- the parent-death watchdog (the driver's side: ``lifeline.py``) ---------------------

#: ``PR_SET_PDEATHSIG``'s signal: a real-time one (offset from SIGRTMIN) that nothing else
#: here uses; its default action ends the process, should it come before the handler.
PDEATH_OFFSET = 6
_PR_SET_PDEATHSIG = 1
#: Our exit code when the driver died (the process group is SIGKILLed first: rarely seen).
ORPHANED = 70
_start_ppid = 0
_group_ours = False  # our process group was made for us: ``orphaned`` may kill it


def watchdog(lifeline: int | None, parent: int) -> None:
    """Main thread, before any task: die with the process that started us, whatever kills it.

    Two threads, each blocked in a system call (no polling, and they work while a task
    runs): one reads the ``lifeline`` pipe, whose write end only the driver holds, and gets
    EOF when it is gone (every platform); on Linux the other waits for the signal of
    ``PR_SET_PDEATHSIG`` (not SIGKILL: a SIGKILL would leave the task's children behind).
    Either kills our process group, so the task's children go too. ``parent`` is the
    driver's pid: behind a command prefix that forks instead of exec'ing (``timeout``) our
    parent is that command, and only the lifeline applies.

    The signal is blocked in every thread (threads and children inherit the mask of the
    thread that makes them), so the kernel hands it to the waiting thread: a Python handler
    would run only when the main thread next runs bytecode, not while a task sleeps.
    """
    global _group_ours
    _group_ours = _own_group(parent or _start_ppid)
    if sys.platform == "linux" and parent and parent == _start_ppid:
        sig = signal.SIGRTMIN + PDEATH_OFFSET
        signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
        _thread.start_new_thread(_watch_signal, (sig,))
    if lifeline is not None:
        os.set_inheritable(lifeline, False)  # a task's children need not hold it
        _thread.start_new_thread(_watch_lifeline, (lifeline,))
    else:
        _thread.start_new_thread(_watch_ppid, ())


def _watch_signal(sig: int) -> None:
    try:
        import ctypes  # here, in the thread: ~3 ms the start does not wait for

        # Per thread: this one lives as long as the process.
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except Exception:
        return  # the lifeline still holds
    while True:
        if os.getppid() != _start_ppid:  # also: it died before the prctl
            orphaned()
        # Also sent when the driver's *thread* that started us exits (the driver starts us
        # from a thread that lives as long as it does, but a fork of it may not): hence the
        # check above, not an exit here.
        signal.sigwait({sig})


def _watch_lifeline(lifeline: int) -> None:
    try:
        while os.read(lifeline, 64):
            pass  # nobody writes; EOF when the last write end (the driver's) closes
    except OSError:
        _watch_ppid()  # taken from us (EBADF): watch the parent instead
    orphaned()


def _watch_ppid() -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != _start_ppid:
            orphaned()


def _own_group(driver: int) -> bool:
    """Whether our process group is ours alone: not the ``driver``'s (it starts us, or the
    command prefix in front of us, leading a group of its own in its session:
    ``lifeline.OWN_GROUP``), where a bootstrap run by hand would share its parent's. Asked
    as the watchdog is armed, while the driver is there to be asked."""
    try:
        return os.getpgid(0) != os.getpgid(driver)
    except OSError:  # the driver is gone already: ours if we lead it
        return os.getpgid(0) == os.getpid()


def orphaned() -> None:
    """The driver is gone: SIGKILL our process group (us and whatever the task started), or
    just exit where the group is not ours alone (a bootstrap run by hand)."""
    try:
        if _group_ours:
            os.killpg(os.getpgid(0), signal.SIGKILL)
    finally:
        os._exit(ORPHANED)


_stdio: tuple[tuple[int, int], ...] | None = None  # None: not watched


def _stdio_ids() -> tuple[tuple[int, int], ...]:
    out = []
    for fd in (1, 2):
        st = os.fstat(fd)
        out.append((st.st_dev, st.st_ino))
    return tuple(out)


def stdio_intact() -> bool:
    """Whether fds 1 and 2 are still the pipes the driver reads. A task that closed them
    (or pointed them elsewhere and left them so) broke this worker for every later task:
    it answers its task, then exits (``STDIO_BROKEN``) and the pool starts another."""
    if _stdio is None:
        return True
    try:
        return _stdio_ids() == _stdio
    except OSError:
        return False


#: Exit code of a worker whose stdout or stderr a task closed (see ``stdio_intact``).
STDIO_BROKEN = 5


def exc_state() -> ModuleType:
    """``_exc_state`` (how a task's exception travels), loaded on the first error."""
    return sys.modules.get(_EXC_STATE) or _load_by_path(
        _EXC_STATE, os.path.join(os.path.dirname(_HERE), "_exc_state.py")
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


def _flush() -> None:
    # The driver attributes output read before RETURN to the task; make it all be there.
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 - contextlib is not imported before it is needed
            stream.flush()
        except Exception:
            pass


def parse_args(argv: list[str]) -> dict[str, int] | None:
    """``--fd N [--lifeline N] [--parent PID] [--zygote|--forked]`` as a dict (the last flag
    as ``zygote: 1``); None if malformed."""
    args: dict[str, int] = {}
    if argv and argv[-1] in ("--zygote", "--forked"):
        args["zygote"] = int(argv[-1] == "--zygote")
        argv = argv[:-1]
    if len(argv) % 2 or not argv or argv[0] != "--fd":
        return None
    for i in range(0, len(argv), 2):
        flag, value = argv[i], argv[i + 1]
        if flag not in ("--fd", "--lifeline", "--parent") or not value.isdigit():
            return None
        args[flag[2:]] = int(value)
    return args


def main(argv: list[str]) -> int:
    global _start_ppid
    _start_ppid = os.getppid()  # first: the watchdog, armed later, compares with it
    if sys.path and os.path.abspath(sys.path[0] or ".") == _HERE:
        del sys.path[0]
    args = parse_args(argv)
    if args is None:
        print("usage: _entry.py --fd N [--lifeline N] [--parent PID] [--zygote]", file=sys.stderr)
        return 2
    if args.get("zygote"):
        zygote(args)  # returns in a forked worker only, its modules loaded
    added = apply_sys_path(json.loads(os.environ.get(SYS_PATH_VAR) or "[]"), sys.path)
    protocol, shm, loop = _modules()
    if os.environ.get(TREES_VAR):  # before any user code: writes to shared files copy first
        _cow().install_from_env()
    ensure_cloudpickle()
    # Takes the channel (not inherited by a task's children; /dev/null in a fork's).
    spin = protocol.Spin(None)  # told by each call whether to poll (the driver reads the load)
    worker = loop.Worker(args["fd"], protocol, shm, exc_state, stdio_intact, spin)
    return start(worker, protocol, added, (args.get("lifeline"), args.get("parent", 0)))


def _modules() -> tuple[ModuleType, ModuleType, ModuleType]:
    """The protocol, shared memory and serving modules, loaded by path (once: a forked
    worker has its template's)."""
    loaded = []
    for name, path in (
        ("protocol", os.path.join(_HERE, "protocol.py")),
        ("shm", os.path.join(_HERE, "shm.py")),
        ("serve", os.path.join(_HERE, "_serve.py")),
    ):
        module = sys.modules.get(f"_jupyter_runtimeenv_{name}")
        if module is None:
            module = _load_by_path(f"_jupyter_runtimeenv_{name}", path)
        loaded.append(module)
    return loaded[0], loaded[1], loaded[2]


def _cow() -> ModuleType:
    """The copy-on-write guard's module (``_cow.py``), loaded by path once: a forked worker
    has its template's (loading it was ~6 ms of a forked working_dir worker's start at load
    11; installing it is each worker's own)."""
    module = sys.modules.get("_jupyter_runtimeenv_cow")
    if module is None:
        module = _load_by_path("_jupyter_runtimeenv_cow", os.path.join(_HERE, "_cow.py"))
    return module


def zygote(args: dict[str, int]) -> None:
    """Be a template (``_zygote.serve``): import what every worker needs, then fork workers
    on request. Returns in a forked worker; the template exits inside."""
    _modules()
    _cow()
    try:
        ensure_cloudpickle()
        import cloudpickle  # noqa: F401 (the point of a template: its forks have it)
    except Exception:
        pass  # as in a worker: the first call that needs it reports the error
    _modules()[2].remember_modules()  # what its forks start with (``_serve``)
    template = _load_by_path("_jupyter_runtimeenv_zygote", os.path.join(_HERE, "_zygote.py"))
    template.serve(args["fd"], args.get("lifeline"), args.get("parent", 0), PDEATH_OFFSET)


def start(
    worker: Any, protocol: ModuleType, added: list[str], guard: tuple[int | None, int]
) -> int:
    """From the setup hook to the end: say HELLO, serve; the exit code. The watchdog
    (``guard``: lifeline, parent) is armed before any user code runs: before the setup hook
    if there is one, else just after HELLO, while the driver sends the first CALL (starting
    its threads is then off the critical path of a new worker's first result)."""
    global _stdio
    # Output goes to pipes: line buffering lets the driver show it as it comes.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    try:
        _stdio = _stdio_ids()
    except OSError:
        _stdio = None  # started without them: nothing to watch
    hook = os.environ.get(SETUP_HOOK_VAR)
    if hook:
        watchdog(*guard)
    setup_error = run_setup_hook(hook)
    hello = {
        "version": protocol.PROTOCOL_VERSION,
        "pid": os.getpid(),
        "python": sys.version,
        "sys_path_added": added,
    }
    if setup_error is not None:
        hello["setup_error"] = setup_error
    worker.hello(hello)
    if setup_error is not None:
        return 4
    if not hook:
        watchdog(*guard)
    if os.environ.pop(WARM_VAR, None):
        try:  # noqa: SIM105 - contextlib is not imported before it is needed
            import cloudpickle  # noqa: F401 (see WARM_VAR)
        except Exception:
            pass  # the first call that needs it reports the error, as in any worker
    try:
        return STDIO_BROKEN if worker.serve() else 0
    except (protocol.ProtocolError, OSError) as exc:
        print(f"jupyter-runtimeenv worker: channel broken: {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    code = main(sys.argv[1:])
    _flush()
    # Not sys.exit: a non-daemon thread left by a task must not keep the worker alive.
    os._exit(code)
