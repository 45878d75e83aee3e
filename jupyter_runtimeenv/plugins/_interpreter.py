"""What a venv needs to know about the interpreter it is made from: its version and the
site-packages it layers over. Asked in-process for the agent's own interpreter, by running
the other one otherwise (memoised per executable and mtime). Blocking: call it in a thread.
"""

from __future__ import annotations

import json
import os
import site
import sys
import threading
from dataclasses import dataclass

from ..errors import BuildError

_PROBE = (
    "import json, os, site, sys\n"
    "dirs = list(site.getsitepackages())\n"
    "user = site.getusersitepackages()\n"
    "if site.ENABLE_USER_SITE and os.path.isdir(user): dirs.append(user)\n"
    "ordered = [p for p in sys.path if p in dirs]\n"
    "print(json.dumps({'version': list(sys.version_info[:3]),"
    " 'implementation': sys.implementation.name, 'prefix': sys.prefix,"
    " 'site_dirs': ordered + [p for p in dirs if p not in ordered]}))\n"
)


@dataclass(frozen=True)
class Interpreter:
    executable: str
    version: tuple[int, int, int]
    implementation: str
    prefix: str
    #: Its site-packages directories in ``sys.path`` order: what a layered venv adds.
    site_dirs: tuple[str, ...]


_memo: dict[tuple[str, int], Interpreter] = {}
_lock = threading.Lock()


def interpreter(executable: str | None = None) -> Interpreter:
    """The interpreter at ``executable`` (default: the agent's own)."""
    executable = executable or sys.executable
    # Not realpath: a venv's python is a symlink to its base interpreter, yet another env.
    if os.path.abspath(executable) == os.path.abspath(sys.executable):
        return _this(executable)
    try:
        key = (os.path.abspath(executable), os.stat(executable).st_mtime_ns)
    except OSError as exc:
        raise BuildError(f"driver_python {executable!r}: {exc.strerror or exc}") from exc
    with _lock:
        if key in _memo:
            return _memo[key]
    import subprocess  # here: the agent's own interpreter (a CLI's parse) asks no process

    try:
        out = subprocess.run(
            [executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True
        )
        data = json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", None) or str(exc)
        raise BuildError(
            f"driver_python {executable!r} could not be asked for its version and"
            f" site-packages: {detail.strip()[-500:]}"
        ) from exc
    found = Interpreter(
        executable,
        (data["version"][0], data["version"][1], data["version"][2]),
        str(data["implementation"]),
        str(data["prefix"]),
        tuple(data["site_dirs"]),
    )
    with _lock:
        _memo[key] = found
    return found


def _this(executable: str) -> Interpreter:
    dirs = [*site.getsitepackages()]
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    ordered = [p for p in sys.path if p in dirs]
    return Interpreter(
        executable,
        (sys.version_info[0], sys.version_info[1], sys.version_info[2]),
        sys.implementation.name,
        sys.prefix,
        tuple(ordered + [p for p in dirs if p not in ordered]),
    )
