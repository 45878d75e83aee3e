"""``jupyter runtimeenv`` (also ``python -m jupyter_runtimeenv``): build, list, inspect, clean.

The CLI runs its own agent on the shared cache (``--cache-dir``, else
``$JUPYTER_RUNTIMEENV_CACHE``, else the platform's cache dir); two agents sharing a cache
(this one and a Jupyter server's) never corrupt it. Bad input exits non-zero with one line
that names the field; no traceback. A build of an env the cache holds is answered from its
index without starting an agent (``agent/cache_hit.py``).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing and argparse are not imported by an answered build (below)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence
    from typing import Any

    from .agent import RuntimeEnvAgent

# The agent, the spec parser, the errors (cloudpickle), asyncio, sqlite3, json and pathlib are
# imported once the arguments are parsed: ``--help`` and usage errors answer at once, and
# every command pays only for what it runs (tests/ipython/test_import_budget.py keeps it so).
# A build the cache has answered before is answered again before even argparse (``_answered``).


def _holder() -> str:
    """This command's reference to the env it builds, one per process: references are kept
    by env and holder name, so two builds of one env at once under one name would share a
    single reference, and the first to end would drop the other's hold."""
    return f"cli:{os.getpid()}"


def _parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(
        prog="jupyter runtimeenv", description="Build and manage runtime environments."
    )
    parser.add_argument("--cache-dir", help="the cache root (default: $JUPYTER_RUNTIMEENV_CACHE)")
    sub = parser.add_subparsers(dest="command", required=True)

    build = sub.add_parser("build", help="build an environment from a YAML or JSON spec")
    build.add_argument("spec", help="a spec file (YAML or JSON), or inline JSON")
    build.add_argument("--json", action="store_true", help="print one JSON object")
    build.add_argument("--retry", action="store_true", help="rebuild after a recent failure")
    build.add_argument("--quiet", "-q", action="store_true", help="do not stream build output")

    listing = sub.add_parser("list", help="list the environments in the cache")
    listing.add_argument("--json", action="store_true")

    logs = sub.add_parser("logs", help="print an environment's build log")
    logs.add_argument("env_id")

    gc = sub.add_parser("gc", help="evict unreferenced resources, least recently used first")
    gc.add_argument("--max-bytes", type=_size, default=None, help="target size, e.g. 5G")

    rm = sub.add_parser("rm", help="remove an environment and the resources only it uses")
    rm.add_argument("env_id")
    rm.add_argument("--force", action="store_true", help="even if others hold it")

    kernelspec = sub.add_parser("kernelspec", help="kernelspecs that start in an environment")
    ks_sub = kernelspec.add_subparsers(dest="kernelspec_command", required=True)
    install = ks_sub.add_parser("install", help="write a kernelspec using the provisioner")
    install.add_argument("name")
    install.add_argument("spec", help="a spec file (YAML or JSON), or inline JSON")
    install.add_argument("--display-name", default=None)
    install.add_argument(
        "--dask",
        metavar="ADDRESS",
        default=None,
        help="start the kernel on a node of the Dask cluster at this scheduler address",
    )
    install.add_argument(
        "--node-cache-dir",
        metavar="DIR",
        default=None,
        help="with --dask: each node's cache root ({name} and {id}: the Dask worker's)",
    )
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", default=True)
    where.add_argument("--prefix", default=None)
    return parser


def _size(text: str) -> int:
    import argparse
    import math

    units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = text[-1] if text and text[-1] in units else ""
    number = text[: -1 or None] if unit else text
    try:
        value = float(number) * units[unit]
        if not math.isfinite(value) or value < 0:
            raise ValueError(text)
        return int(value)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected a size like 500M or 5G, got {text!r}") from None


def _spec_input(text: str) -> Any:
    """A path to a spec file, or inline JSON (starts with ``{``)."""
    from .errors import SpecError
    from .spec.strict_json import loads_strict

    if text.lstrip().startswith("{"):
        try:
            return loads_strict(text)
        except ValueError as exc:
            raise SpecError("", f"inline spec is not valid JSON: {exc}") from None
    if "\0" in text or not os.path.exists(text):
        raise SpecError("", f"no spec file {text!r}")
    return text


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


async def _run_until_signal(args: argparse.Namespace) -> int:
    """``_run``, cancelled by SIGTERM or SIGHUP: the agent stops (builds cancelled, their
    process groups killed), then the command exits 128 + the signal's number."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[int] = []

    def on_signal(signum: int) -> None:
        if not received:
            received.append(signum)
            task.cancel()

    from .agent.pgroups import LIVE

    handled = [s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    for signum in handled:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        return await _run(args)
    except asyncio.CancelledError:
        if not received:
            raise
        if hasattr(task, "uncancel"):  # 3.11+
            task.uncancel()
        name = signal.Signals(received[0]).name
        print(f"error: stopped by {name}; builds cancelled", file=sys.stderr)
        return 128 + received[0]
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
        LIVE.kill_all()  # a net: run() kills its group when cancelled


async def _to_thread(func: Any, *args: Any) -> Any:
    import asyncio  # loaded already: the command runs in asyncio.run

    return await asyncio.to_thread(func, *args)


async def _run(args: argparse.Namespace) -> int:
    import json

    from .agent import RuntimeEnvAgent

    async with RuntimeEnvAgent(args.cache_dir) as agent:
        if args.command == "build":
            return await _build(agent, args)
        if args.command == "list":
            envs = await agent.status()
            if args.json:
                print(json.dumps(envs, indent=2))
            elif not envs:
                print("no environments in", agent.cache.root)
            for env in [] if args.json else envs:
                fields = ", ".join(k for k in env["spec"] if k != "config") or "(empty)"
                holders = ", ".join(env["holders"]) or "-"
                print(f"{env['env_id'][:12]}  {env['state']:<8}  {fields}  held by: {holders}")
            return 0
        if args.command == "logs":
            sys.stdout.write(await agent.log(await _resolve_id(agent, args.env_id)))
            return 0
        if args.command == "gc":
            evicted = await agent.gc(args.max_bytes)
            for item in evicted:
                print(f"evicted {item['uri']} ({_human(item['size'])})")
            total = await _to_thread(agent.cache.total_bytes)
            print(f"{len(evicted)} evicted; cache now {_human(total)}")
            return 0
        if args.command == "rm":
            env_id = await _resolve_id(agent, args.env_id)
            removed = await agent.remove(env_id, force=args.force)
            print(f"removed {env_id} and {len(removed)} resource(s) only it used")
            return 0
    raise AssertionError(args.command)


async def _build(agent: RuntimeEnvAgent, args: argparse.Namespace) -> int:
    import time

    # Parsed by _cached_build already, unless it could not look (no private index yet).
    spec = args.parsed
    if spec is None:
        spec = await _to_thread(agent.parse, _spec_input(args.spec))
    if not args.json and not args.quiet:

        def show(event: Any) -> None:
            if event.env_id != spec.env_id:
                return
            if event.kind == "log":
                print(f"  [{event.data['step']}] {event.data['line']}", file=sys.stderr)
            elif event.kind == "step" and event.data.get("status") != "running":
                print(f"  step {event.data['step']}: {event.data['status']}", file=sys.stderr)

        agent.add_listener(show)
    started = time.perf_counter()
    holder = _holder()
    try:
        await agent.ensure(spec, holder, retry=args.retry)
        context = await agent.wait(spec.env_id)
    finally:
        # The CLI's reference lasts as long as the command: built envs stay cached, unheld.
        await agent.release(spec.env_id, holder)
    forms = _forms(spec.env_id, spec.to_json(), context.to_json())
    return _show(forms[0] if args.json else forms[1], args.json, time.perf_counter() - started)


def _forms(
    env_id: str, spec: dict[str, Any], context: dict[str, Any]
) -> tuple[tuple[str, str], tuple[str, str]]:
    """What a build prints, ``--json`` and for people, each as the text before and after the
    build's seconds (``agent/answers.py`` keeps them to answer the same build again)."""
    import json

    out = {"env_id": env_id, "state": "READY", "context": context, "spec": spec}
    body = json.dumps(out, indent=2)  # ends "\n}": "seconds" is the last key
    lines = [f"python:  {context['python']}"]
    if context["command_prefix"]:
        lines.append(f"prefix:  {' '.join(context['command_prefix'])}")
    if context["cwd"]:
        lines.append(f"cwd:     {context['cwd']}")
    lines += [f"env:     {key}={value}" for key, value in context["env_vars"].items()]
    paths = [*context["extra_paths"], *context["driver_sys_path"]]  # EnvContext.sys_path
    lines += [f"path:    {path}" for path in paths]
    return (
        (body[:-2] + ',\n  "seconds": ', "\n}\n"),
        (f"env_id:  {env_id}\nstate:   READY (", " s)\n" + "".join(f"{x}\n" for x in lines)),
    )


def _show(form: tuple[str, str], as_json: bool, elapsed: float) -> int:
    """Print a form (``_forms``) with the seconds, as ``json.dumps`` writes them, or for people."""
    seconds = repr(round(elapsed, 3)) if as_json else f"{elapsed:.2f}"
    sys.stdout.write(form[0] + seconds + form[1])
    return 0


def _answered(argv: Sequence[str]) -> int | None:
    """The exit code of a build answered by the cache (``agent/answers.py``) before anything
    else is imported, or None (then parsed as usual). Only ``[--cache-dir[=]DIR] build SPEC``
    with ``--json``, ``--quiet``/``-q``, ``--retry``: argparse has the rest (``--help``...)."""
    words = list(argv)
    cache_dir = None
    if words[:1] == ["--cache-dir"] and len(words) > 1 and not words[1].startswith("-"):
        cache_dir, words = words[1], words[2:]
    elif words and words[0].startswith("--cache-dir="):
        cache_dir, words = words[0].partition("=")[2], words[1:]
    if words[:1] != ["build"]:
        return None
    flags = {w for w in words[1:] if w.startswith("-")}
    specs = [w for w in words[1:] if not w.startswith("-")]
    if len(specs) != 1 or not flags <= {"--json", "--quiet", "-q", "--retry"}:
        return None
    import time

    from .agent.answers import key_of, recall
    from .agent.cache_hit import default_cache_root, private_index

    started = time.perf_counter()
    index = private_index(cache_dir or default_cache_root())
    key = None if index is None else key_of(specs[0])
    found = None if index is None or key is None else recall(index, key, "--json" in flags)
    return None if found is None else _show(found, "--json" in flags, time.perf_counter() - started)


#: Fields whose parse never hashes a tree into the content store (working_dir and py_modules
#: do; a plugin named by import path may).
_NO_TREES = frozenset(
    {
        "config",
        "excludes",
        "env_vars",
        "py_executable",
        "driver_python",
        "driver_sys_path",
        "pip",
        "uv",
        "conda",
        "worker_process_setup_hook",
    }
)


def _nothing() -> None:
    pass


def _cached_build(args: argparse.Namespace) -> tuple[int | None, Callable[[], None]]:
    """``build`` of an env the cache holds READY, without an agent: the spec is parsed as
    the agent would (trusted, the installed plugins), then looked up in the index
    (``agent.cache_hit``). The exit code, or None when the agent must build (the spec is
    left in ``args.parsed``: parsed once), and what undoes the store's attachment.

    A spec with a tree (``working_dir``, ``py_modules``) is parsed with the cache's content
    store attached, as in an agent's process, so that a build that follows stores what
    this parse read, in one pass (``plugins/_store.py``)."""
    import time
    from pathlib import Path

    from .agent import answers
    from .agent.cache_hit import default_cache_dir, find_ready, private_index
    from .context import EnvContext
    from .errors import SpecError
    from .plugins.registry import default_registry
    from .spec import TRUSTED
    from .spec.parse import load_spec_file, parse
    from .spec.paths import base_dir

    root = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    index = private_index(root)
    detach = _nothing
    if index is None:
        return None, detach  # a new cache, or one the agent must make private first
    key = answers.key_of(args.spec)  # of the bytes parsed: checked again after the parse
    data = _spec_input(args.spec)
    where = None
    if isinstance(data, str):
        path = Path(data)
        data, where = load_spec_file(path), str(path.resolve().parent)
    trees = not isinstance(data, dict) or not set(data) <= _NO_TREES
    if trees and (root / "shared" / "blobs").is_dir():
        from .plugins import _store

        detach = _store.attach(root)
    try:
        with base_dir(where):  # relative paths in a file are relative to it, as parse does
            spec = parse(data, registry=default_registry(), policy=TRUSTED)
        started = time.perf_counter()
        stored = find_ready(index, spec.env_id)
    except SpecError:
        detach()
        if detach is _nothing:
            raise
        # A parse that wrote into the store failed: the agent parses again after its start,
        # which says a cache it cannot write to (a full disk) is that, not a bad spec.
        return None, _nothing
    except BaseException:
        detach()
        raise
    if stored is None:
        args.parsed = spec
        return None, detach
    forms = _forms(spec.env_id, spec.to_json(), EnvContext.from_json(stored).to_json())
    code = _show(forms[0] if args.json else forms[1], args.json, time.perf_counter() - started)
    if isinstance(data, dict) and key is not None:
        registry = default_registry()
        plugins = {name: registry.for_field(name) for name in data if name != "config"}
        stamped = answers.stamps() if answers.closed(data, plugins) else None
        if stamped is not None and answers.key_of(args.spec) == key:
            answers.remember(index, key, spec.env_id, stamped, *forms)
    return code, detach


async def _resolve_id(agent: RuntimeEnvAgent, prefix: str) -> str:
    """Accept an unambiguous prefix of an env id, as ``docker`` and ``git`` do; anything
    outside the hex alphabet is refused before it is looked up."""
    from .errors import EnvNotFound, RuntimeEnvError

    try:
        return await agent.resolve_id(prefix)
    except EnvNotFound as exc:
        raise RuntimeEnvError(str(exc)) from None


def _install_kernelspec(args: argparse.Namespace) -> int:
    from .kernels import install_kernelspec

    path = install_kernelspec(
        args.name,
        _spec_input(args.spec),
        display_name=args.display_name,
        user=args.prefix is None,
        prefix=args.prefix,
        dask=args.dask,
        node_cache_dir=args.node_cache_dir,
    )
    where = f" (kernels on the Dask cluster at {args.dask})" if args.dask else ""
    print(f"installed kernelspec {args.name} in {path}{where}")
    return 0


def _exit_at_once(code: int) -> None:
    """End the process now if nothing is left to finalise but the output and the ``atexit``
    handlers: no other thread (a tree's hashing pool, a spare tree being laid out), no
    agent (stopped), the index closed. The interpreter's finalisation (modules torn down,
    the GC) is ~7 ms of a cached build's ~75 (21 runs, load 2.6) and ~10-15 ms after a
    build by the agent, with asyncio and the agent's modules loaded. The ``atexit``
    handlers run first, as at any exit (logging's flush, ``agent.pgroups``' net). If the
    output cannot be flushed (a closed pipe), Python's own exit reports it as before."""
    import atexit

    threading = sys.modules.get("threading")  # not imported: no thread started through it
    run_handlers = getattr(atexit, "_run_exitfuncs", None)  # CPython's own exit calls it
    if (threading is not None and threading.active_count() != 1) or run_handlers is None:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    run_handlers()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        answered = _answered(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        return 130
    if answered is not None:
        if argv is None:  # the program itself (not a caller's function call)
            _exit_at_once(answered)
        return answered
    args = _parser().parse_args(argv)
    import sqlite3

    from .errors import BuildError, RuntimeEnvError, SpecError

    detach = _nothing
    try:
        if args.command == "kernelspec":
            return _install_kernelspec(args)
        args.parsed = None
        if args.command == "build":
            done, detach = _cached_build(args)
            if done is not None:
                detach()
                detach = _nothing
                if argv is None:  # the program itself (not a caller's function call)
                    _exit_at_once(done)
                return done
        import asyncio

        code = asyncio.run(_run_until_signal(args))
        if argv is None and args.command == "build":  # the program: as a cached build ends
            detach()
            detach = _nothing
            _exit_at_once(code)
        return code
    except SpecError as exc:
        print(f"error: invalid spec: {exc}", file=sys.stderr)
        return 2
    except BuildError as exc:
        print(f"error: build failed: {exc}", file=sys.stderr)
        return 1
    except RuntimeEnvError as exc:  # CacheUnavailable too: one line naming the cache
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (OSError, sqlite3.Error) as exc:  # the disk filled up (or went away) mid-command
        from pathlib import Path

        from .agent.cache_hit import default_cache_dir
        from .agent.private import describe

        root = Path(args.cache_dir or default_cache_dir())
        print(f"error: cannot use the cache at {root}: {describe(exc, root)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        detach()


if __name__ == "__main__":
    sys.exit(main())
