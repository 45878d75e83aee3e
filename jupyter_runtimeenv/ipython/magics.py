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
env (default or name) on what it built and drops it when that env changes or is forgotten
(``--clear``, ``shutdown()``, ``init(runtime_env=None)``). Bad input is one
``UsageError`` line naming the field, and changes nothing.

The flags and the cell body become a spec in ``_env_specs.py``; builds in a widget, as text
or on a cluster are ``_env_builds.py``'s; the flags' parser is ``_magic_args.py``'s.

The build shows in a ``BuildStatusWidget`` (``widget.py``) when the shell is a kernel's
(``widgets_available``), as text lines otherwise or with ``--no-widget``; the summary
line is printed as text either way.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from .. import api, session
from ..errors import BuildError, RuntimeEnvError, SpecError
from ..spec import RuntimeEnvSpec
from ..workers import envs
from ._env_builds import (
    agent_states,
    build_failed,
    build_in_widget,
    build_on_every_node,
    cluster_listing,
    offer_log,
    session_cluster,
    show_widget,
)
from ._env_specs import first_line, has_flags, locked, show, spec_from_args, spec_from_body
from ._magic_args import argument, magic_arguments, parse_argstring

__all__ = ["RuntimeEnvMagics", "spec_from_args"]


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
        session.observe(self._release_forgotten)

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
        if cell is None and not has_flags(line, name):
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
                spec = locked(spec, args.lock)
            elif unlocked is not None and not args.upgrade:
                unlocked = spec_from_args(args, unlocked)  # for a later --upgrade
            else:
                unlocked = None
        except SpecError as exc:
            # One line: some reasons (packaging's) add a caret diagram below.
            raise UsageError(f"runtime_env: invalid spec: {first_line(exc)}") from None
        label = f"runtime env {name!r}" if name else "default runtime env"
        if spec.config.eager_install:
            widget = not args.no_widget and self._widgets()
            cluster = session_cluster()
            if cluster is not None:  # on every node of the cluster at once, a row each
                build_on_every_node(cluster, spec, name, widget=widget, background=args.background)
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
                summary = build_in_widget(resolved, holder, name)
            else:
                summary = build_now(resolved, client, holder, sys.stdout, name=name)
        except BuildError as exc:
            # The widget, or the streamed lines, showed the output: the error says it once.
            streamed = widget or isinstance(client, EmbeddedClient)
            if not widget and not isinstance(client, EmbeddedClient):
                offer_log(exc)  # the server has the log: one click opens it (the widget's too)
            raise UsageError(build_failed(exc, name, with_tail=not streamed)) from None
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
            view, handle = show_widget(resolved.env_id)

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

    def _release_forgotten(self) -> None:
        """Drop the references of envs the session no longer declares: ``shutdown()`` and
        ``init(runtime_env=None)`` forget them without this magic, and a notebook that forgot
        an env must not hold it (the sidebar would list it under the notebook, GC could not
        take it). Who calls it: ``session``, after each change (a build's reference is taken
        before its env is declared, and no change comes between)."""
        names = set(session.names())
        default = session.default_runtime_env()
        with self._lock:
            gone = [n for n in self._held if (default is None if n is None else n not in names)]
        for name in gone:
            self.release(name)

    def listing(self) -> str:
        """``--list``: the default and named envs with their env ids and the agent's states."""
        declared = envs.declared_envs()
        if not declared:
            return "no runtime envs declared (%runtime_env [--name NAME] ... declares one)"
        cluster = session_cluster()
        if cluster is not None:
            return cluster_listing(cluster, declared)
        states = agent_states()
        rows = [("NAME", "ENV ID", "STATE")]
        for entry in declared:
            state = states.get(entry["env_id"], "not built")
            rows.append((entry["name"] or "(default)", entry["env_id"][:12], state))
        width = max(len(r[0]) for r in rows)
        return "\n".join(f"{a:<{width}}  {b:<12}  {c}" for a, b, c in rows)


def _named(name: str) -> RuntimeEnvSpec | None:
    try:
        return session.lookup(name)
    except SpecError:
        return None
