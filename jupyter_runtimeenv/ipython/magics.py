"""``%runtime_env``: set, show or clear the notebook's default runtime environment.

Who calls it: IPython, after ``%load_ext jupyter_runtimeenv`` registered ``RuntimeEnvMagics``.
The flags become a spec that is merged over the current default (``spec.merge``: key by key,
``env_vars`` and ``config`` per entry) and handed to ``jupyter_runtimeenv.init``; with
``config.eager_install`` (the default) the environment is built at once, through the same
client and with the same resolved ``driver_sys_path`` that the first task will use, so
that task finds it ready. The magic keeps one reference on the environment it built and
drops it when the default changes. Bad input is one ``UsageError`` line naming the field.

The build shows in a ``BuildStatusWidget`` (``widget.py``) when the shell is a kernel's
(``widgets_available``), as text lines otherwise or with ``--no-widget``; the summary
line is printed as text either way.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import IPython.core.magic_arguments as _untyped_magic_arguments
import yaml
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from ..errors import BuildError, RuntimeEnvError, SpecError
from ..spec import RuntimeEnvSpec, merge, parse
from ..spec.paths import resolve_path
from ..workers import api

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


def parse_argstring(magic: Any, line: str) -> Any:
    """Shell-like words (quotes removed, unlike IPython's ``arg_split``), then the flags."""
    try:
        words = shlex.split(line)
    except ValueError as exc:  # an unclosed quote
        raise UsageError(f"runtime_env: {exc}") from None
    return magic.parser.parse_args(words)


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


def show(spec: RuntimeEnvSpec | None, built: str | None = None) -> str:
    """The default spec as YAML (what ``--file`` accepts), or a line saying there is none.

    ``built`` is the env id the magic last built: the spec's own id plus the notebook's
    ``sys.path`` (``driver_sys_path``), resolved when a task is submitted.
    """
    if spec is None:
        return "no default runtime env: tasks run in an environment like the kernel's"
    text = yaml.safe_dump(spec.to_json(), sort_keys=False, default_flow_style=False)
    head = "# default runtime env" + (f" (built as {built[:12]})" if built else "")
    return f"{head}\n{text.rstrip()}"


@magics_class
class RuntimeEnvMagics(Magics):
    """The ``%runtime_env`` line magic; one instance per IPython shell."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        #: (env id, holder) of the environment the last eager build took a reference on.
        self._held: tuple[str, str] | None = None
        self._builds = 0
        #: Show builds in a widget: ``None`` decides by the shell (``widgets_available``).
        self.widget: bool | None = None

    @magic_arguments()
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
    @argument("--clear", action="store_true", help="forget the default runtime env")
    @argument("--no-widget", action="store_true", help="show the build as text, not a widget")
    @line_magic
    def runtime_env(self, line: str) -> None:
        """Set, merge, show (no arguments) or clear the notebook's default runtime env.

        Flags are merged over the current default key by key (``--pip`` replaces the
        requirement list, ``--env-var`` adds variables). With ``config.eager_install`` the
        environment is built now, printing its steps and the installer's output.
        """
        try:
            args = parse_argstring(RuntimeEnvMagics.runtime_env, line)
        except SystemExit:  # argparse on --help or a bad flag; IPython already printed
            return
        if args.clear:
            api.init(runtime_env=None)
            self.release()
            print("default runtime env cleared")
            return
        current = api.default_runtime_env()
        if not line.strip():
            print(show(current, self._held[0] if self._held else None))
            return
        try:
            spec = spec_from_args(args, current)
        except SpecError as exc:
            # One line: some reasons (packaging's) add a caret diagram below.
            raise UsageError(f"runtime_env: invalid spec: {_first_line(exc)}") from None
        if spec.config.eager_install:
            self._build(spec, widget=not args.no_widget and self._widgets())
        api.init(runtime_env=spec)
        if spec.config.eager_install:
            api.prestart()  # READY now: its first worker starts, so the first call skips that
        if not spec.config.eager_install:
            print(f"default runtime env {spec.env_id[:12]} set (built at the first task)")

    def _widgets(self) -> bool:
        if self.widget is not None:
            return self.widget
        from .widget import widgets_available

        return widgets_available(self.shell)

    def _build(self, spec: RuntimeEnvSpec, *, widget: bool = False) -> None:
        """Build ``spec`` as the first task will see it; the default is unchanged on failure."""
        from ..client import get_client
        from ..workers.executor import resolve_for_driver
        from .progress import build_now

        resolved = resolve_for_driver(spec)
        self._builds += 1
        holder = f"runtime_env-magic:{os.getpid()}:{self._builds}"
        try:
            if widget:
                summary = _build_in_widget(resolved, holder)
            else:
                summary = build_now(resolved, get_client(), holder, sys.stdout)
        except BuildError as exc:
            raise UsageError(
                f"runtime_env: build failed (the default was not changed): {exc}"
            ) from None
        except RuntimeEnvError as exc:
            raise UsageError(f"runtime_env: {exc}") from None
        self.release()
        self._held = (summary.env_id, holder)
        print(summary.line())

    def release(self) -> None:
        """Drop the reference the last eager build took (the default changed or was cleared)."""
        held, self._held = self._held, None
        if held is None:
            return
        from ..client import get_client

        # RuntimeEnvError: the agent is gone, and its references went with it.
        with contextlib.suppress(RuntimeEnvError):
            get_client().release_sync(*held)


def _build_in_widget(spec: RuntimeEnvSpec, holder: str) -> Any:
    """``build_now`` shown in a ``BuildStatusWidget``, displayed now and updated at the end
    (the update refreshes its text/plain form for text-only frontends and saved notebooks)."""
    import IPython.display

    from ..client import get_client
    from .progress import build_now
    from .widget import BuildStatusWidget

    widget = BuildStatusWidget(spec.env_id)
    display: Any = IPython.display.display  # untyped
    handle = display(widget, display_id=True)
    try:
        return build_now(spec, get_client(), holder, sys.stdout, widget)
    finally:
        if handle is not None:
            handle.update(widget)
