"""A notebook's own environment: ``metadata.runtime_env`` in the ``.ipynb`` file.

The JupyterLab sidebar writes it ("Save environment to notebook") from the spec the notebook's
kernel declared, and reads it when the notebook opens. It is plain JSON, readable without the
extension::

    "metadata": {
      "runtime_env": {
        "version": 1,
        "spec": {"pip": {"packages": ["six"]}, "working_dir": "data", "env_vars": {"MODE": "x"}},
        "env_id": "3f2a...",          # the env the kernel had when it was saved (informative)
        "saved": "2026-12-02T19:00:00Z"
      }
    }

``spec`` is a runtime env spec whose relative paths are relative to the notebook's directory;
the machine-specific fields the driver fills in itself (``driver_python`` and a resolved
``driver_sys_path``) are left out. ``declare`` (run in the kernel by the sidebar's "declare"
button) makes it the kernel's default, like ``%runtime_env --file``.
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


def _default_config() -> dict[str, Any]:
    from .spec.model import RuntimeEnvConfig

    return RuntimeEnvConfig().to_json()


def declare(spec: Mapping[str, Any], notebook_dir: str | None = None) -> None:
    """Make ``spec`` (relative to ``notebook_dir``, default the cwd: a kernel's cwd is its
    notebook's directory) the notebook's default environment, as ``%runtime_env --file`` does:
    merged over the current default, built at once with the build widget when eager.

    Who calls it: code the sidebar's "declare" button runs in the notebook's kernel.
    """
    from IPython import get_ipython

    from .spec import parse
    from .spec.paths import base_dir

    with base_dir(os.path.abspath(notebook_dir or os.getcwd())):
        absolute = parse(dict(spec)).to_json()  # relative paths resolved, errors named
    shell = get_ipython()
    if shell is None:
        raise RuntimeError("declare() runs in an IPython kernel")
    if "runtime_env" not in shell.magics_manager.magics["line"]:
        shell.run_line_magic("load_ext", "jupyter_runtimeenv")
    fd, path = tempfile.mkstemp(prefix="runtime-env-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            json.dump(absolute, file)
        shell.run_line_magic("runtime_env", f"--file {shlex.quote(path)}")
    finally:
        os.unlink(path)
