"""A notebook's own environment: ``metadata.runtime_env`` in the ``.ipynb`` file.

The JupyterLab sidebar writes it ("Save environment to notebook") from the spec the notebook's
kernel declared, and reads it when the notebook opens. It is plain JSON, readable without the
extension::

    "metadata": {
      "runtime_env": {
        "version": 1,
        "spec": {"pip": {"packages": ["six"]}, "working_dir": "data", "env_vars": {"MODE": "x"}},
        "env_id": "3f2a...",          # the kernel's id of it when saved (what %runtime_env
                                      # --list showed; another machine's differs)
        "lock": "lock-version = \"1.0\"\n...",   # pylock.toml of the env as built (locks)
        "named": {"slow": {"spec": {"env_vars": {"SPEED": "slow"}}, "env_id": "9b1c..."}},
        "saved": "2026-12-02T19:00:00Z"
      }
    }

``spec`` (the default env; absent when the kernel declared only named ones) and each of
``named``'s specs are runtime env specs whose relative paths are relative to the notebook's
directory; the machine-specific fields the driver fills in itself (``driver_python`` and a
resolved ``driver_sys_path``) are left out. ``declare`` (run in the kernel by the sidebar's
"declare" button) makes ``spec`` the kernel's default, like ``%runtime_env --file``, and
declares each named env, like ``%%runtime_env --name NAME``. An env saved with a ``lock``
(PEP 751 ``pylock.toml`` text; envs with pip/uv packages) is declared with its packages
pinned to the lock's versions (``--lock``) unless ``upgrade`` asks for a new resolution.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from collections.abc import Mapping
from typing import Any

METADATA_KEY = "runtime_env"
METADATA_VERSION = 1
#: Filled in by each driver for its own machine: never stored in a notebook.
DRIVER_FIELDS = ("driver_python", "driver_sys_path")


def relative_spec(spec: Mapping[str, Any], notebook_dir: str, root_dir: str) -> dict[str, Any]:
    """``spec`` (canonical JSON, absolute paths) for a notebook in ``notebook_dir``: paths under
    ``root_dir`` become relative to the notebook's directory, driver fields are dropped.

    Paths outside ``root_dir`` stay absolute: they point outside what the notebook can carry.
    """
    notebook_dir = os.path.normpath(notebook_dir)
    root_dir = os.path.normpath(root_dir)

    def fix(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        if isinstance(value, str) and os.path.isabs(value):
            path = os.path.normpath(value)
            if path == root_dir or path.startswith(root_dir + os.sep):
                return os.path.relpath(path, notebook_dir).replace(os.sep, "/")
        return value

    out = {k: fix(v) for k, v in spec.items() if k not in DRIVER_FIELDS}
    if out.get("config") == _default_config():
        del out["config"]
    return out


def notebook_metadata(
    declared: list[Mapping[str, Any]], notebook_dir: str, root_dir: str
) -> dict[str, Any]:
    """``metadata.runtime_env`` (without ``saved``) of a kernel's ``declared`` envs (its
    report's ``[{"name", "env_id", "spec"}]``, the default's name ``None``): each spec relative
    to ``notebook_dir``, each ``env_id`` the kernel's own (the one ``--list`` shows)."""
    out: dict[str, Any] = {"version": METADATA_VERSION}
    named: dict[str, Any] = {}
    for entry in declared:
        spec = entry.get("spec")
        if not isinstance(spec, Mapping):
            continue
        item = {"spec": relative_spec(spec, notebook_dir, root_dir), "env_id": entry["env_id"]}
        if entry.get("name") is None:
            out.update(item)
        else:
            named[str(entry["name"])] = item
    if named:
        out["named"] = named
    return out


def _default_config() -> dict[str, Any]:
    from .spec.model import RuntimeEnvConfig

    return RuntimeEnvConfig().to_json()


def declare(
    spec: Mapping[str, Any] | None,
    notebook_dir: str | None = None,
    named: Mapping[str, Mapping[str, Any]] | None = None,
    locks: Mapping[str, str] | None = None,
    upgrade: bool = False,
) -> None:
    """Make ``spec`` (relative to ``notebook_dir``, default the cwd: a kernel's cwd is its
    notebook's directory) the notebook's default environment, as ``%runtime_env --file`` does
    (merged over the current default), and declare each of ``named`` as that name, as
    ``%%runtime_env --name NAME`` does (the saved spec is the env); each is built at once with
    the build widget when eager. ``locks`` maps an env's name (``""``: the default) to its
    saved ``pylock.toml`` text: its packages are pinned to the lock's versions, unless
    ``upgrade`` (then each resolves as written, like ``%runtime_env --upgrade``). Every spec
    and lock is read before any is declared: a bad one declares nothing and names its field.

    Who calls it: code the sidebar's "declare" button runs in the notebook's kernel.
    """
    from IPython import get_ipython

    from .errors import SpecError
    from .locks import locked_spec, pip_field
    from .session import check_name
    from .spec import parse
    from .spec.paths import base_dir

    directory = os.path.abspath(notebook_dir or os.getcwd())
    locks = {} if upgrade else dict(locks or {})
    resolved: list[tuple[str | None, dict[str, Any]]] = []
    with base_dir(directory):  # relative paths resolved, errors named
        if spec is not None:
            resolved.append((None, parse(dict(spec)).to_json()))
        for name, named_spec in (named or {}).items():
            check_name(name)  # it goes on a magic's line
            try:
                resolved.append((name, parse(dict(named_spec)).to_json()))
            except SpecError as exc:
                raise exc.within(f"named.{name}") from None
        # Only an env with pip/uv packages has versions to pin.
        locks = {
            env_name or "": locks[env_name or ""]
            for env_name, absolute in resolved
            if (env_name or "") in locks and pip_field(absolute)
        }
        for env_name, absolute in resolved:
            lock = locks.get(env_name or "")
            if lock is not None:  # readable, or nothing is declared
                where = f"named.{env_name}.lock" if env_name else "lock"
                parse(locked_spec(absolute, lock, where))
    shell = get_ipython()
    if shell is None:
        raise RuntimeError("declare() runs in an IPython kernel")
    if "runtime_env" not in shell.magics_manager.magics["line"]:
        shell.run_line_magic("load_ext", "jupyter_runtimeenv")
    with tempfile.TemporaryDirectory(prefix="runtime-env-") as temp:
        for env_name, absolute in resolved:
            flags = " --upgrade" if upgrade else ""
            lock = locks.get(env_name or "")
            if lock is not None:
                lock_path = os.path.join(temp, "pylock.toml")
                with open(lock_path, "w", encoding="utf-8") as file:
                    file.write(lock)
                flags = f" --lock {shlex.quote(lock_path)}"
            if env_name is not None:
                body = json.dumps(absolute)
                shell.run_cell_magic("runtime_env", f"--name {env_name}{flags}", body)
                continue
            path = os.path.join(temp, "spec.json")
            with open(path, "w", encoding="utf-8") as file:
                json.dump(absolute, file)
            shell.run_line_magic("runtime_env", f"--file {shlex.quote(path)}{flags}")
