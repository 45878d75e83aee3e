"""Locks of a notebook's envs: the versions an env actually has, in PEP 751's ``pylock.toml``.

Saving an env to a notebook stores, for the default and each named env with a ``pip``/``uv``
field, the lock of the env as built: uv reads the venv's installed distributions (``uv pip
freeze``) and writes them as ``pylock.toml`` (``uv pip compile --format pylock.toml
--no-deps``: no new resolution, the files and hashes of exactly those versions). Declaring
the notebook's env again (the badge's Declare, ``%runtime_env --lock FILE``) pins the
field's packages to the lock's versions, so another machine or a later year installs the
same ones; ``--upgrade`` resolves the spec's own requirements instead.

Who calls it: ``server.notebook_env`` (the lock when saving, the badge's comparison) and
``ipython.magics`` (``--lock``). A package from an index is pinned by its version (the
installer fetches it from the index it is configured with; the lock's hashes are not
enforced), one installed from a file, a directory or a VCS by that source; editable installs,
which no lock holds, stay as the spec asks.
"""

from __future__ import annotations

import asyncio
import copy
import glob
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.markers import InvalidMarker, Marker, UndefinedComparison, UndefinedEnvironmentName
from packaging.utils import canonicalize_name

from .errors import BuildError, SpecError

__all__ = [
    "PIP_FIELDS",
    "differences",
    "env_versions",
    "lock_of_env",
    "locked_spec",
    "locked_versions",
    "pip_field",
    "read_lock",
]

#: The fields whose packages a lock pins (Ray's ``uv`` is our ``pip`` by another name).
PIP_FIELDS = ("pip", "uv")
#: The lock format versions this reader knows (PEP 751: a reader refuses a major it lacks).
_LOCK_MAJOR = "1"


def pip_field(spec: Mapping[str, Any]) -> str | None:
    """The name of ``spec``'s pip/uv field with packages, or ``None``."""
    for field in PIP_FIELDS:
        value = spec.get(field)
        if isinstance(value, Mapping):
            value = value.get("packages")
        if value:
            return field
    return None


def read_lock(text: str, where: str) -> list[dict[str, Any]]:
    """The ``[[packages]]`` of the ``pylock.toml`` ``text``; ``SpecError`` naming ``where``
    (and the package) when it is no lock this reader can follow."""
    try:
        toml = _toml()
    except ModuleNotFoundError:
        raise SpecError(where, "reading a pylock.toml on Python 3.10 needs tomli") from None
    try:
        data = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise SpecError(where, f"not a pylock.toml: {exc}") from None
    version = data.get("lock-version")
    if not isinstance(version, str) or version.split(".")[0] != _LOCK_MAJOR:
        raise SpecError(where, f"lock-version {version!r}: expected 1.x (PEP 751)")
    packages = data.get("packages")
    if not isinstance(packages, list):
        raise SpecError(where, "no [[packages]] table: expected a PEP 751 lock")
    for i, package in enumerate(packages):
        if not isinstance(package, dict) or not isinstance(package.get("name"), str):
            raise SpecError(f"{where}.packages[{i}]", "expected a table with a name")
    return packages


def _toml() -> Any:
    if sys.version_info >= (3, 11):
        import tomllib as toml
    else:  # Python 3.10: the same parser, as a package
        import tomli as toml
    return toml


def _pin(package: dict[str, Any], where: str) -> str:
    """One requirement line for a locked package, its marker kept: ``name @ url`` for one
    installed from a file, a directory or a VCS (it came from no index), else
    ``name==version``."""
    name = package["name"]
    direct = _direct(package)
    version = package.get("version")
    if direct is not None:
        line = f"{name} @ {direct}"
    elif isinstance(version, str) and version:
        line = f"{name}=={version}"
    else:
        raise SpecError(where, f"package {name!r} has neither a version nor a file")
    marker = package.get("marker")
    return f"{line} ; {marker}" if isinstance(marker, str) and marker else line


def _direct(package: dict[str, Any]) -> str | None:
    """The URL of a package locked by its source (PEP 751 ``archive``, ``directory``,
    ``vcs``), or ``None`` for one from an index (``wheels``/``sdist`` with a version)."""
    for key in ("archive", "directory"):
        entry = package.get(key)
        if isinstance(entry, dict):
            url = entry.get("url")
            path = entry.get("path")
            if isinstance(url, str) and url:
                return url
            if isinstance(path, str) and path:
                return Path(path).absolute().as_uri()
    vcs = package.get("vcs")
    if isinstance(vcs, dict) and isinstance(vcs.get("url"), str):
        commit = vcs.get("commit-id")
        ref = f"@{commit}" if isinstance(commit, str) and commit else ""
        return f"{vcs.get('type', 'git')}+{vcs['url']}{ref}"
    if not package.get("version"):  # a file and no version: the file is all there is
        for key in ("sdist",):
            entry = package.get(key)
            if isinstance(entry, dict) and isinstance(entry.get("url"), str):
                return str(entry["url"])
        wheels = package.get("wheels")
        if isinstance(wheels, list) and wheels and isinstance(wheels[0], dict):
            url = wheels[0].get("url")
            if isinstance(url, str):
                return url
    return None


def locked_spec(spec: Mapping[str, Any], text: str, where: str) -> dict[str, Any]:
    """``spec`` (JSON) with its pip/uv field's packages replaced by the lock's pins; the
    field's other keys (install options, pip_check) kept. A spec without such a field is
    returned as it is (nothing to pin)."""
    out = copy.deepcopy(dict(spec))
    field = pip_field(out)
    if field is None:
        return out
    pins = [_pin(p, f"{where}.packages[{i}]") for i, p in enumerate(read_lock(text, where))]
    value = out[field]
    # Editable installs are not in a lock (uv pip freeze leaves them out): kept as asked.
    asked = value.get("packages") if isinstance(value, Mapping) else value
    if isinstance(asked, list):
        pins += [line for line in asked if isinstance(line, str) and _is_editable(line)]
    if isinstance(value, Mapping):
        out[field] = {**value, "packages": pins}
    else:  # a list or a requirements file
        out[field] = pins
    return out


def _is_editable(line: str) -> bool:
    return line.lstrip().startswith(("-e ", "-e\t", "--editable"))


def locked_versions(text: str, where: str) -> dict[str, str]:
    """``{canonical name: version}`` of the lock's packages for this platform (a package
    whose marker does not hold here is left out; one locked by file alone: ``""``)."""
    return {
        canonicalize_name(p["name"]): str(p.get("version") or "")
        for p in read_lock(text, where)
        if _applies(p.get("marker"))
    }


def _applies(marker: Any) -> bool:
    if not isinstance(marker, str) or not marker:
        return True
    try:
        return bool(Marker(marker).evaluate())
    except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
        return True  # compared, rather than hidden


def env_versions(python: str) -> dict[str, str]:
    """``{canonical name: version}`` installed in the venv of ``python`` itself (not the
    environment it is layered over). Blocking: run in a thread."""
    from .plugins._constraints import installed_versions

    venv = os.path.dirname(os.path.dirname(python))
    site = glob.glob(os.path.join(glob.escape(venv), "lib", "python*", "site-packages"))
    return installed_versions(site)


def differences(lock: Mapping[str, str], env: Mapping[str, str]) -> list[str]:
    """How ``env``'s versions differ from ``lock``'s, one line a package, sorted by name
    (``alpha: 1.0 in the lock, 2.0 in the env``); empty when they agree."""
    lines = []
    for name in sorted(set(lock) | set(env)):
        locked, here = lock.get(name), env.get(name)
        if locked == here or (locked == "" and here is not None):
            continue
        if here is None:
            lines.append(f"{name}: {locked or 'a file'} in the lock, not in the env")
        elif locked is None:
            lines.append(f"{name}: {here} in the env, not in the lock")
        else:
            lines.append(f"{name}: {locked} in the lock, {here} in the env")
    return lines


async def lock_of_env(python: str, options: Sequence[str], env: Mapping[str, str], uv: str) -> str:
    """The ``pylock.toml`` text of what the venv of ``python`` has installed, from uv
    (``uv pip freeze`` then ``uv pip compile --format pylock.toml --no-deps``, with the
    env's own index options). ``BuildError`` with uv's last lines when it cannot."""
    frozen = await _run(
        [uv, "pip", "freeze", "--python", python, "--exclude-editable"], env, stdin=None
    )
    argv = [uv, "pip", "compile", "-", "--format", "pylock.toml", "--no-deps", "--no-header"]
    argv += ["--quiet", "--python", python, *options]
    return await _run(argv, env, stdin=frozen)


async def _run(argv: list[str], env: Mapping[str, str], stdin: str | None) -> str:
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
    )
    try:
        out, err = await process.communicate(None if stdin is None else stdin.encode())
    finally:
        if process.returncode is None:  # cancelled: leave no uv behind
            process.kill()
            await process.wait()
    if process.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-5:]
        raise BuildError(f"{' '.join(argv[1:3])} failed: {'; '.join(tail)}", output_tail=tail)
    return out.decode()
