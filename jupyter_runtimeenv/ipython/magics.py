"""``%runtime_env``, line and cell form.

Who calls it: IPython, after ``%load_ext jupyter_runtimeenv`` registered ``RuntimeEnvMagics``.
The flags become a spec that is merged over the current default (``spec.merge``: key by key,
``env_vars`` and ``config`` per entry) and handed to ``jupyter_runtimeenv.init``; with
``--name NAME`` over the env of that name instead (``session``). The cell form's body
(YAML or JSON) *is* the env, the flags merged over it: re-running an edited cell gives
exactly what it says. With ``config.eager_install`` (the default) the environment is built
at once, through the same client and with the same resolved ``driver_sys_path`` that the
first task will use, so that task finds it ready; ``--background`` returns at once and
leaves the build running (the first task waits for it). The magic keeps one reference per
env (default or name) on what it built and drops it when that env changes. Bad input is one
``UsageError`` line naming the field, and changes nothing.

The build shows in a ``BuildStatusWidget`` (``widget.py``) when the shell is a kernel's
(``widgets_available``), as text lines otherwise or with ``--no-widget``; the summary
line is printed as text either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import sys
import textwrap
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import IPython.core.magic_arguments as _untyped_magic_arguments
import yaml
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from .. import api, session
from ..errors import BuildError, RuntimeEnvError, SpecError
from ..spec import RuntimeEnvSpec, merge, parse
from ..spec.paths import resolve_path
from ..workers import envs
from ..workers.cluster import ClusterExecutor

__all__ = ["RuntimeEnvMagics", "spec_from_args"]

_F = TypeVar("_F", bound=Callable[..., Any])
# IPython's magic_arguments is untyped; these typed doors keep mypy strict on the magic.
_margs: Any = _untyped_magic_arguments


class _Decorator(Protocol):
    def __call__(self, function: _F, /) -> _F: ...


def magic_arguments() -> _Decorator:
    decorator: _Decorator = _margs.magic_arguments()
    return decorator


def argument(*args: Any, **kwargs: Any) -> _Decorator:
    decorator: _Decorator = _margs.argument(*args, **kwargs)
    return decorator


def parse_argstring(magic: Any, line: str, name: str = "runtime_env") -> Any:
    """Shell-like words (quotes removed, unlike IPython's ``arg_split``), then the flags.

    ``-h``/``--help`` prints the usage and raises ``SystemExit`` (IPython's magic parsers
    have no help flag of their own); a bad flag is a ``UsageError``.
    """
    try:
        words = shlex.split(line)
    except ValueError as exc:  # an unclosed quote
        raise UsageError(f"{name}: {exc}") from None
    if "-h" in words or "--help" in words:
        print(_plain_help(magic.parser.format_help()))
        raise SystemExit(0)
    return magic.parser.parse_args(words)


def _plain_help(text: str) -> str:
    """IPython's magic help is reStructuredText (a ``::`` line, double backquotes): plain it."""
    lines = text.strip("\n").splitlines()
    if lines and lines[0].strip() == "::":
        lines = lines[1:]
    return textwrap.dedent("\n".join(lines)).strip("\n").replace("``", "`")


def spec_from_args(args: Any, current: RuntimeEnvSpec | None) -> RuntimeEnvSpec:
    """The new default: ``current``, then the ``--file`` spec, then the flags, merged.

    Relative paths in the file are relative to the file; on the command line, to the cwd.
    Raises ``SpecError`` naming the field.
    """
    spec = current
    if args.file:
        spec = merge(spec, parse(os.fspath(args.file)))
    flags: dict[str, Any] = {}
    if args.pip or args.find_links or args.no_index:
        options = ["--no-index"] if args.no_index else []
        for directory in args.find_links or []:
            options += ["--find-links", resolve_path(directory)]
        packages = args.pip
        if packages is None:  # only index options: keep the default's requirements
            packages = list(((spec.get("pip") if spec else None) or {}).get("packages", []))
        flags["pip"] = {"packages": packages, "install_options": options}
    if args.env_var:
        flags["env_vars"] = dict(_key_value(item) for item in args.env_var)
    if args.working_dir:
        flags["working_dir"] = args.working_dir
    if args.py_module:
        flags["py_modules"] = list(args.py_module)
    if args.no_driver_sys_path:
        flags["driver_sys_path"] = False
    config: dict[str, Any] = {}
    if args.isolated:
        config["isolated"] = True
    if args.installer:
        config["installer"] = args.installer
    if args.no_eager_install:
        config["eager_install"] = False
    if config:
        flags["config"] = config
    return merge(spec, flags)


def _key_value(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise SpecError("env_vars", f"expected KEY=VALUE, got {item!r}")
    return key, value


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def show(spec: RuntimeEnvSpec | None, built: str | None = None, name: str | None = None) -> str:
    """The default (or named) spec as YAML (what ``--file`` accepts), or a line saying there
    is none.

    ``built`` is the env id the magic last built: the spec's own id plus the notebook's
    ``sys.path`` (``driver_sys_path``), resolved when a task is submitted.
    """
    if spec is None:
        return "no default runtime env: tasks run in an environment like the kernel's"
    text = yaml.safe_dump(spec.to_json(), sort_keys=False, default_flow_style=False)
    what = f"runtime env {name!r}" if name else "default runtime env"
    head = f"# {what}" + (f" (built as {built[:12]})" if built else "")
    return f"{head}\n{text.rstrip()}"


def spec_from_body(body: str) -> RuntimeEnvSpec:
    """The spec a ``%%runtime_env`` cell's body (YAML or JSON) gives; ``SpecError`` naming the
    field, or the body's line when it is not YAML. Relative paths are relative to the cwd."""
    try:
        data = yaml.safe_load(body)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 2}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError("", f"the cell body is not YAML or JSON{where}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError("", f"the cell body must be a mapping of fields, got {type(data).__name__}")
    return parse(data)


@magics_class
class RuntimeEnvMagics(Magics):
    """``%runtime_env`` and ``%%runtime_env``; one per IPython shell."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        #: env name (``None``: the default) -> (env id, holder) of the reference its last
        #: eager build took.
        self._held: dict[str | None, tuple[str, str]] = {}
        self._lock = threading.Lock()
        #: env name -> the spec as it was before ``--lock`` pinned it (what ``--upgrade``
        #: resolves); flags given later are merged into both.
        self._unlocked: dict[str | None, RuntimeEnvSpec] = {}
        self._builds = 0
        #: Show builds in a widget: ``None`` decides by the shell (``widgets_available``).
        self.widget: bool | None = None

    @magic_arguments()
    @argument("--name", metavar="NAME", help="declare (or change) the env NAME, not the default")
    @argument("--pip", action="extend", nargs="+", metavar="REQ", help="requirements to install")
    @argument(
        "--find-links",
        action="append",
        metavar="DIR",
        help="also look for packages in DIR (pip.install_options; relative to the cwd)",
    )
    @argument("--no-index", action="store_true", help="install from --find-links dirs only")
    @argument("--env-var", action="append", metavar="KEY=VALUE", help="an environment variable")
    @argument("--working-dir", metavar="PATH", help="the workers' cwd, first on their sys.path")
    @argument("--py-module", action="append", metavar="PATH", help="a module or package to ship")
    @argument("--file", metavar="SPEC", help="a YAML or JSON spec file to merge in first")
    @argument("--isolated", action="store_true", help="a bare venv, not layered over the kernel's")
    @argument("--installer", choices=["uv", "pip"], help="which installer builds the venv")
    @argument(
        "--no-driver-sys-path",
        action="store_true",
        help="do not give workers the kernel's sys.path",
    )
    @argument("--no-eager-install", action="store_true", help="build at the first task, not now")
    @argument(
        "--background",
        action="store_true",
        help="return at once; the build goes on (shown live in a widget), the first task waits",
    )
    @argument(
        "--lock",
        metavar="PYLOCK",
        help="pin the pip/uv packages to the versions of this PEP 751 pylock.toml",
    )
    @argument(
        "--upgrade",
        action="store_true",
        help="resolve the spec's own requirements, without the lock --lock (or Declare) gave it",
    )
    @argument("--list", action="store_true", help="the default and named envs, ids and states")
    @argument("--clear", action="store_true", help="forget the default (or --name) runtime env")
    @argument("--no-widget", action="store_true", help="show the build as text, not a widget")
    @line_cell_magic
    def runtime_env(self, line: str, cell: str | None = None) -> None:
        """Set, merge, show (no arguments), list or clear the notebook's runtime envs.

        Line form: flags are merged over the current default (or the env ``--name``) key by
        key (``--pip`` replaces the requirement list, ``--env-var`` adds variables). Cell
        form: the body (YAML or JSON) is the env, the flags are merged over it. With
        ``config.eager_install`` the environment is built now, showing its steps and the
        installer's output.
        """
        try:
            args = parse_argstring(RuntimeEnvMagics.runtime_env, line)
        except SystemExit:  # --help, printed
            return
        name = args.name
        if name is not None:
            try:
                session.check_name(name)
            except SpecError as exc:
                raise UsageError(f"runtime_env: --name: {exc.reason}") from None
        if args.list:
            print(self.listing())
            return
        if args.clear:
            if name is None:
                api.init(runtime_env=None)
            elif not session.forget(name):
                raise UsageError(f"runtime_env: no environment named {name!r}")
            self.release(name)
            self._unlocked.pop(name, None)
            print(f"runtime env {name!r} forgotten" if name else "default runtime env cleared")
            return
        current = api.default_runtime_env() if name is None else _named(name)
        if cell is None and not _has_flags(line, name):
            held = self._held.get(name)
            if name is not None and current is None:
                raise UsageError(f"runtime_env: no environment named {name!r}")
            print(show(current, held[0] if held else None, name))
            return
        if args.lock and args.upgrade:
            raise UsageError("runtime_env: --upgrade resolves without a lock: drop --lock")
        unlocked = self._unlocked.get(name) if cell is None else None
        try:
            base = current if cell is None else spec_from_body(cell)
            if args.upgrade and unlocked is not None:
                base = unlocked  # the spec as written, before a lock pinned it
            spec = spec_from_args(args, base)
            if args.lock:
                unlocked = spec
                spec = _locked(spec, args.lock)
            elif unlocked is not None and not args.upgrade:
                unlocked = spec_from_args(args, unlocked)  # for a later --upgrade
            else:
                unlocked = None
        except SpecError as exc:
            # One line: some reasons (packaging's) add a caret diagram below.
            raise UsageError(f"runtime_env: invalid spec: {_first_line(exc)}") from None
        label = f"runtime env {name!r}" if name else "default runtime env"
        if spec.config.eager_install:
            widget = not args.no_widget and self._widgets()
            cluster = _cluster()
            if cluster is not None:  # on every node of the cluster at once, a row each
                _build_on_cluster(cluster, spec, name, widget=widget, background=args.background)
            elif args.background:
                self._build_in_background(spec, name, widget=widget)
            else:
                self._build(spec, name, widget=widget)
        if name is None:
            api.init(runtime_env=spec)
        else:
            session.declare(name, spec)
        with self._lock:
            if unlocked is None:
                self._unlocked.pop(name, None)
            else:
                self._unlocked[name] = unlocked
        if spec.config.eager_install:
            # Its first worker starts now (once the env is READY), so the first call skips that.
            api.prestart(spec)
        if not spec.config.eager_install:
            print(f"{label} {spec.env_id[:12]} set (built at the first task)")

    def _widgets(self) -> bool:
        if self.widget is not None:
            return self.widget
        from .widget import widgets_available

        return widgets_available(self.shell)

    def _holder(self) -> str:
        with self._lock:
            self._builds += 1
            return f"runtime_env-magic:{os.getpid()}:{self._builds}"

    def _build(self, spec: RuntimeEnvSpec, name: str | None, *, widget: bool = False) -> None:
        """Build ``spec`` as the first task will see it; the env is unchanged on failure."""
        from ..client import EmbeddedClient, get_client
        from ..workers.executor import resolve_for_driver
        from .progress import build_now

        resolved = resolve_for_driver(spec)
        holder = self._holder()
        client = get_client()
        try:
            if widget:
                summary = _build_in_widget(resolved, holder)
            else:
                summary = build_now(resolved, client, holder, sys.stdout)
        except BuildError as exc:
            # The widget, or the streamed lines, showed the output: the error says it once.
            streamed = widget or isinstance(client, EmbeddedClient)
            if not widget and not isinstance(client, EmbeddedClient):
                _offer_log(exc)  # the server has the log: one click opens it (the widget's too)
            raise UsageError(_build_failed(exc, name, with_tail=not streamed)) from None
        except RuntimeEnvError as exc:
            raise UsageError(f"runtime_env: {exc}") from None
        self._hold(name, summary.env_id, holder)
        print(summary.line())

    def _build_in_background(self, spec: RuntimeEnvSpec, name: str | None, *, widget: bool) -> None:
        """Start the build and return: a widget (if shown) keeps updating; a task submitted
        meanwhile waits for the same build (the agent builds an env once)."""
        import io

        from ..client import get_client
        from ..workers.executor import resolve_for_driver
        from .progress import build_now

        resolved = resolve_for_driver(spec)
        holder = self._holder()
        client = get_client()
        view = None
        if widget:
            view, handle = _show_widget(resolved.env_id)

        def run() -> None:
            try:
                summary = build_now(resolved, client, holder, io.StringIO(), view)
            except BaseException:  # shown by the widget; the first task raises it too
                return
            finally:
                if view is not None:
                    view.finalize(handle)
            self._hold(name, summary.env_id, holder)

        threading.Thread(target=run, name="runtime-env-background-build", daemon=True).start()
        print(
            f"building runtime env {resolved.env_id[:12]} in the background;"
            " the first task in it waits for it"
        )

    def _hold(self, name: str | None, env_id: str, holder: str) -> None:
        self.release(name)
        with self._lock:
            self._held[name] = (env_id, holder)

    def release(self, name: str | None = None, *, every: bool = False) -> None:
        """Drop the reference the last eager build of ``name`` (or ``every`` one) took."""
        with self._lock:
            keys = list(self._held) if every else [name]
            dropped = [self._held.pop(key) for key in keys if key in self._held]
        if not dropped:
            return
        from ..client import get_client

        client = get_client()
        for held in dropped:
            # RuntimeEnvError: the agent is gone, and its references went with it.
            with contextlib.suppress(RuntimeEnvError):
                client.release_sync(*held)

    def listing(self) -> str:
        """``--list``: the default and named envs with their env ids and the agent's states."""
        declared = envs.declared_envs()
        if not declared:
            return "no runtime envs declared (%runtime_env [--name NAME] ... declares one)"
        cluster = _cluster()
        if cluster is not None:
            return _cluster_listing(cluster, declared)
        states = _agent_states()
        rows = [("NAME", "ENV ID", "STATE")]
        for entry in declared:
            state = states.get(entry["env_id"], "not built")
            rows.append((entry["name"] or "(default)", entry["env_id"][:12], state))
        width = max(len(r[0]) for r in rows)
        return "\n".join(f"{a:<{width}}  {b:<12}  {c}" for a, b, c in rows)


def _cluster() -> ClusterExecutor | None:
    """The session's executor when it runs on nodes (a Dask executor), else ``None``."""
    executor = session.executor()
    return executor if isinstance(executor, ClusterExecutor) else None


def _build_on_cluster(
    cluster: ClusterExecutor,
    spec: RuntimeEnvSpec,
    name: str | None,
    *,
    widget: bool,
    background: bool,
) -> None:
    from .cluster_build import build_on_cluster

    try:
        build_on_cluster(cluster, spec, name, widget=widget, background=background)
    except SpecError as exc:
        raise UsageError(f"runtime_env: invalid spec: {_first_line(exc)}") from None
    except RuntimeEnvError as exc:  # no node up, the scheduler gone ...
        raise UsageError(f"runtime_env: {_first_line(exc)}") from None


def _cluster_listing(cluster: ClusterExecutor, declared: list[dict[str, Any]]) -> str:
    """``--list`` on a cluster: each env's state on the nodes."""
    from .cluster_build import cluster_states

    specs: dict[str | None, RuntimeEnvSpec] = dict(session.named_envs())
    default = session.default_runtime_env()
    if default is not None:
        specs[None] = default
    rows = [("NAME", "ENV ID", "STATE ON THE CLUSTER")]
    for entry in declared:
        spec = specs.get(entry["name"])
        state = cluster_states(cluster, spec) if spec is not None else "?"
        rows.append((entry["name"] or "(default)", entry["env_id"][:12], state))
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{a:<{width}}  {b:<12}  {c}" for a, b, c in rows)


def _locked(spec: RuntimeEnvSpec, path: str) -> RuntimeEnvSpec:
    """``spec`` with its pip/uv packages pinned to the lock file ``path``'s versions."""
    from ..locks import locked_spec, pip_field

    data = spec.to_json()
    if pip_field(data) is None:
        raise SpecError("--lock", "this env has no pip or uv packages to pin")
    try:
        with open(resolve_path(path), encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError("--lock", f"cannot read {path}: {exc}") from None
    return parse(locked_spec(data, text, "--lock"))


def _has_flags(line: str, name: str | None) -> bool:
    """More on the line than ``--name NAME``."""
    words = shlex.split(line)
    if name is not None:
        for form in (["--name", name], [f"--name={name}"]):
            for i in range(len(words) - len(form) + 1):
                if words[i : i + len(form)] == form:
                    del words[i : i + len(form)]
                    break
    return bool(words)


def _named(name: str) -> RuntimeEnvSpec | None:
    try:
        return session.lookup(name)
    except SpecError:
        return None


def _offer_log(exc: BuildError) -> None:
    """A "View log" link above a failed build's error, for a build of the server's agent: the
    JupyterLab extension opens the whole log in a tab (``runtimeenv:view-log``); elsewhere the
    text form names the log's path."""
    import html
    import json

    import IPython.display

    display: Any = IPython.display.display  # untyped
    if not exc.env_id:
        return
    args = html.escape(json.dumps({"env_id": exc.env_id}), quote=True)
    where = f" at {html.escape(exc.where)}" if exc.where else ""
    link = (
        f'<a href="#" data-commandlinker-command="runtimeenv:view-log"'
        f' data-commandlinker-args="{args}" title="Open the whole build log"'
        ' style="color:var(--jp-content-link-color, #1976d2)">View log</a>'
    )
    text = f"the build of {exc.env_id[:12]} failed{where}"
    display(
        {
            "text/html": f"<span>{html.escape(text)} &middot; {link}</span>",
            "text/plain": f"{text}; the whole log: {exc.log_path}" if exc.log_path else text,
        },
        raw=True,
    )


def _build_failed(exc: BuildError, name: str | None, *, with_tail: bool) -> str:
    """The ``UsageError`` of a failed build: the whole error when nothing showed its output,
    else one line (the widget or the streamed lines told the message already)."""
    from .progress import kept

    if with_tail:
        return f"runtime_env: build failed ({kept(name)}): {exc}"
    where = f" at {exc.where}" if exc.where else ""
    log = f"; the whole log: {exc.log_reference}" if exc.log_path else ""
    return f"runtime_env: build failed{where}: {kept(name)}{log}"


def _agent_states() -> dict[str, str]:
    """env id -> state, from the agent (empty if it cannot be asked)."""
    from ..client import get_client

    client = get_client()
    found: list[dict[str, Any]] = []

    def ask() -> None:
        with contextlib.suppress(RuntimeEnvError, OSError):
            found.extend(asyncio.run(client.status()))

    thread = threading.Thread(target=ask, name="runtime-env-status", daemon=True)
    thread.start()
    thread.join(30)
    return {str(e.get("env_id")): str(e.get("state")) for e in found}


def _show_widget(env_id: str) -> tuple[Any, Any]:
    import IPython.display

    from ..client import EmbeddedClient, get_client
    from .widget import BuildStatusWidget

    widget = BuildStatusWidget(env_id)
    # The server's agent builds it: the JupyterLab extension can open its log.
    widget.view_log = not isinstance(get_client(), EmbeddedClient)
    display: Any = IPython.display.display  # untyped
    return widget, display(widget, display_id=True)


def _build_in_widget(spec: RuntimeEnvSpec, holder: str) -> Any:
    """``build_now`` shown in a ``BuildStatusWidget``, displayed now and replaced at the end by
    its static form (text/html and text/plain: what text-only frontends and saved notebooks
    show)."""
    from ..client import get_client
    from .progress import build_now

    widget, handle = _show_widget(spec.env_id)
    try:
        return build_now(spec, get_client(), holder, sys.stdout, widget)
    finally:
        widget.finalize(handle)
