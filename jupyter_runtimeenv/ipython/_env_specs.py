"""From what ``%runtime_env`` is given to a spec, and back to text.

Who calls it: ``RuntimeEnvMagics.runtime_env`` (``magics.py``). What it owns: the spec the
flags give (merged over the current default or named env: ``spec_from_args``), the spec a
``%%runtime_env`` cell's body gives (``spec_from_body``), pinning it to a lock file
(``locked``), whether a line says more than ``--name NAME`` (``has_flags``), and the spec as
YAML (``show``). Bad input is a ``SpecError`` naming the field.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from ..errors import SpecError
from ..spec import RuntimeEnvSpec, merge, parse
from ..spec.paths import resolve_path


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


def first_line(error: Exception) -> str:
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
    import yaml  # here, not at import: %load_ext and a %runtime_env of flags need none (~10 ms)

    text = yaml.safe_dump(spec.to_json(), sort_keys=False, default_flow_style=False)
    what = f"runtime env {name!r}" if name else "default runtime env"
    head = f"# {what}" + (f" (built as {built[:12]})" if built else "")
    return f"{head}\n{text.rstrip()}"


def spec_from_body(body: str) -> RuntimeEnvSpec:
    """The spec a ``%%runtime_env`` cell's body (YAML or JSON) gives; ``SpecError`` naming the
    field, or the body's line when it is not YAML. Relative paths are relative to the cwd."""
    import yaml

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


def locked(spec: RuntimeEnvSpec, path: str) -> RuntimeEnvSpec:
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


def has_flags(line: str, name: str | None) -> bool:
    """More on the line than ``--name NAME``."""
    words = shlex.split(line)
    if name is not None:
        for form in (["--name", name], [f"--name={name}"]):
            for i in range(len(words) - len(form) + 1):
                if words[i : i + len(form)] == form:
                    del words[i : i + len(form)]
                    break
    return bool(words)
