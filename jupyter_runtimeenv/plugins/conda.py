"""``conda``: an existing conda environment (by name or prefix) whose python workers use,
or one created from an ``environment.yml`` (a mapping, or a path to the file).

Who calls it: ``spec.parse`` (``validate``) and the agent (``uris``, ``create``,
``modify_context``). Creating uses micromamba, mamba or conda on PATH (or ``$MAMBA_EXE`` /
``$CONDA_EXE``), else py-rattler (the ``conda`` extra, see ``_rattler``); without either the
build fails saying which names were tried. An env without its own python (say, only tools
and data from noarch packages) runs workers on the driver's python with the env's ``bin``
first on ``PATH`` and ``CONDA_PREFIX`` set. Conda envs are
not relocatable, so a created env lives at ``<cache_root>/shared/conda/<key>`` and the
resource directory (which the agent renames into place) records its prefix; ``delete``
removes it on eviction. Either way the resource holds the ``support`` directory that makes
cloudpickle and this package importable by the env's python.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from ..context import ContextBuilder
from ..errors import BuildError, SpecError
from ..spec import files
from ..spec.model import sha256_of
from ..spec.paths import resolve_path
from ..spec.policy import current_policy
from . import _rattler, _remote
from ._support import write_support
from ._uv import installer_env, uv_bin
from .base import BuildContext, RuntimeEnvPlugin

if TYPE_CHECKING:
    from ..spec import RuntimeEnvSpec

#: Tried in this order: micromamba and mamba solve much faster than conda.
BINARIES = ("micromamba", "mamba", "conda")
_NAME = re.compile(r"[A-Za-z0-9_.+-]+")
_ENV_KEYS = ("name", "channels", "dependencies", "variables", "prefix")

__all__ = ["BINARIES", "CondaPlugin", "find_binary", "find_named_env"]


def find_binary() -> str:
    """The first conda-like executable found; ``BuildError`` naming what was tried."""
    tried = []
    for var in ("MAMBA_EXE", "CONDA_EXE"):
        tried.append(f"${var}")
        exe = os.environ.get(var)
        if exe and os.access(exe, os.X_OK):
            return exe
    for name in BINARIES:
        tried.append(name)
        found = shutil.which(name)
        if found:
            return found
    raise BuildError(
        "no conda binary found to create the environment: tried "
        + ", ".join(tried)
        + " (on PATH). Install micromamba, or give an existing env's name or prefix"
    )


def _env_dirs() -> list[str]:
    dirs: list[str] = []
    for var in ("CONDA_ENVS_PATH", "CONDA_ENVS_DIRS"):
        dirs += [d for d in os.environ.get(var, "").split(os.pathsep) if d]
    for var in ("MAMBA_ROOT_PREFIX", "CONDA_ROOT"):
        if os.environ.get(var):
            dirs.append(os.path.join(os.environ[var], "envs"))
    for var in ("CONDA_EXE", "MAMBA_EXE"):
        if os.environ.get(var):
            dirs.append(os.path.join(os.path.dirname(os.path.dirname(os.environ[var])), "envs"))
    home = os.path.expanduser("~")
    for root in ("miniforge3", "miniconda3", "anaconda3", "mambaforge", "micromamba"):
        dirs.append(os.path.join(home, root, "envs"))
    dirs += [os.path.join(home, ".conda", "envs"), "/opt/conda/envs"]
    return list(dict.fromkeys(dirs))


def find_named_env(name: str) -> str:
    """The prefix of the conda env called ``name``; ``BuildError`` naming where we looked."""
    dirs = _env_dirs()
    for directory in dirs:
        prefix = os.path.join(directory, name)
        if os.path.isdir(os.path.join(prefix, "conda-meta")) or _python_of(prefix):
            return prefix
    raise BuildError(f"no conda environment named {name!r}; looked in {', '.join(dirs)}")


def _python_of(prefix: str) -> str | None:
    for rel in ("bin/python", "python.exe"):
        path = os.path.join(prefix, rel)
        if os.path.exists(path):
            return path
    return None


class CondaPlugin(RuntimeEnvPlugin):
    """``builder``: ``"auto"`` (a conda binary if one is found, else py-rattler),
    ``"binary"`` or ``"rattler"``."""

    name = "conda"
    conflicts = ("pip",)
    priority = 10
    description = "an existing conda env (name or prefix) or an environment.yml to create"

    def __init__(self, builder: Literal["auto", "binary", "rattler"] = "auto") -> None:
        self.builder = builder

    def validate(self, value: Any) -> str | dict[str, Any]:
        if isinstance(value, str):
            if value.endswith((".yml", ".yaml")) and _remote.is_remote(value):
                local = _remote.local_path(value)
                if local is not None:
                    current_policy().check_file(local, "environment file")
                return self._env_dict(_parse_yaml(_remote.read_text(value, ""), value))
            if value.endswith((".yml", ".yaml")):
                path = resolve_path(value)
                current_policy().check_file(path, "environment file")
                return self._env_dict(_load_yaml(path))
            if os.sep in value or value.startswith((".", "~")):
                return resolve_path(value)
            if not _NAME.fullmatch(value):
                raise SpecError("", f"{value!r} is not an env name, a prefix or a .yml file")
            return value
        if isinstance(value, dict):
            return self._env_dict(value)
        raise SpecError("", f"expected an env name, prefix, .yml path or mapping, got {value!r}")

    def _env_dict(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise SpecError("", "an environment.yml must hold a mapping")
        for key in data:
            if key not in _ENV_KEYS:
                raise SpecError(str(key), f"unknown key; known keys are {', '.join(_ENV_KEYS)}")
        deps = data.get("dependencies")
        if not isinstance(deps, list) or not deps:
            raise SpecError("dependencies", "expected a non-empty list of packages")
        channels = data.get("channels")
        if channels is not None:
            if not isinstance(channels, list) or not all(isinstance(c, str) for c in channels):
                raise SpecError("channels", "expected a list of channel names or URLs")
            # A local channel directory, relative to the spec like every other path.
            data = {**data, "channels": [_channel(c) for c in channels]}
        # name and prefix are dropped: where the env lives is the agent's business.
        return {k: data[k] for k in ("channels", "dependencies", "variables") if k in data}

    def uris(self, value: Any, spec: RuntimeEnvSpec) -> list[str]:
        if isinstance(value, dict):
            return [f"conda:env:{sha256_of(value)[:32]}"]
        return [f"conda:existing:{value}"]

    async def create(self, uri: str, value: Any, build: BuildContext) -> int:
        if isinstance(value, dict):
            prefix = await self._create_env(uri, value, build)
        elif os.sep in value:
            prefix = value
        else:
            prefix = await build.to_thread(find_named_env, value)
        if not isinstance(value, dict) and not await build.to_thread(_python_of, prefix):
            raise BuildError(f"{prefix} is not a conda environment: it has no bin/python")
        build.log(f"conda environment: {prefix}")
        await build.to_thread(_record, build.target, prefix)
        return 0

    async def _create_env(self, uri: str, value: dict[str, Any], build: BuildContext) -> str:
        exe = None if self.builder == "rattler" else self._binary()
        prefix = _shared_prefix(build.cache_root, uri)
        await build.to_thread(shutil.rmtree, prefix, True)  # leftovers of a failed attempt
        try:
            async with build.limit("install"):
                if exe is None:
                    pip = await _rattler.create_env(value, prefix, build)
                    if pip:
                        await _install_pip(prefix, pip, build)
                else:
                    await self._create_with(exe, prefix, value, build)
        except BaseException:
            await build.to_thread(shutil.rmtree, prefix, True)
            raise
        return str(prefix)

    def _binary(self) -> str | None:
        """The conda binary to use, or None for py-rattler."""
        try:
            return find_binary()
        except BuildError as missing:
            if self.builder == "binary" or not _rattler.available():
                raise BuildError(
                    f"{missing}; or install py-rattler (pip install"
                    " 'jupyter-runtimeenv[conda]') to build without a conda binary"
                ) from None
            return None

    async def _create_with(
        self, exe: str, prefix: Path, value: dict[str, Any], build: BuildContext
    ) -> None:
        envfile = build.target / "environment.yml"
        await build.to_thread(envfile.write_text, yaml.safe_dump(value))
        if Path(exe).name.startswith("micromamba"):
            argv = [exe, "create", "--yes", "--prefix", str(prefix), "--file", str(envfile)]
        else:
            argv = [exe, "env", "create", "--prefix", str(prefix), "--file", str(envfile)]
        await build.run(argv, what=f"{Path(exe).name} env create")

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        resource = Path(ctx.resource_path(uris[0]))
        prefix = (resource / "prefix.txt").read_text(encoding="utf-8").strip()
        python = _python_of(prefix)
        if python is not None:  # else: the driver's python, with the env's tools on PATH
            ctx.python = python
            ctx.extra_paths.append(str(resource / "support"))
        ctx.env_vars["CONDA_PREFIX"] = prefix
        ctx.env_vars["CONDA_DEFAULT_ENV"] = value if isinstance(value, str) else prefix
        # A template (expanded where the worker starts): the agent's own PATH is not the
        # kernel's, nor the node's.
        path = ctx.env_vars.get("PATH") or "${PATH}"
        ctx.env_vars["PATH"] = os.pathsep.join([os.path.join(prefix, "bin"), path])

    async def delete(self, uri: str, path: Path) -> None:
        if uri.startswith("conda:env:"):
            await asyncio.to_thread(_remove_recorded, path)


def _channel(name: str) -> str:
    if name.startswith((".", "/", "~")):
        return resolve_path(name)
    return name


async def _install_pip(prefix: Path, requirements: list[str], build: BuildContext) -> None:
    python = await build.to_thread(_python_of, str(prefix))
    if python is None:
        raise BuildError(
            "conda.dependencies: pip packages need python in the environment;"
            " add python to the conda dependencies"
        )
    reqs = build.target / "conda-pip-requirements.txt"
    await build.to_thread(reqs.write_text, "\n".join(requirements) + "\n")
    await build.run(
        [uv_bin(), "pip", "install", "--python", python, "-r", str(reqs)],
        env=installer_env(build.cache_root),
        what="uv pip install (conda's pip dependencies)",
    )


def _shared_prefix(cache_root: Path, uri: str) -> Path:
    return cache_root / "shared" / "conda" / uri.rsplit(":", 1)[1]


def _record(target: Path, prefix: str) -> None:
    (target / "prefix.txt").write_text(prefix + "\n", encoding="utf-8")
    write_support(target / "support")


def _remove_recorded(resource: Path) -> None:
    prefix = (resource / "prefix.txt").read_text(encoding="utf-8").strip()
    shutil.rmtree(prefix, ignore_errors=True)


def _yaml_reason(exc: yaml.YAMLError) -> str:
    """What is wrong, quoting the file only where the sender may read it: YAML's messages
    carry an excerpt of the text, which over REST would hand the file's content over."""
    if current_policy().quote_files:
        return " ".join(str(exc).split())
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or type(exc).__name__
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


def _parse_yaml(text: str, where: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        reason = _yaml_reason(exc)
        raise SpecError("", f"{_remote.redact(where)} is not valid YAML: {reason}") from None


def _load_yaml(path: str) -> Any:
    try:
        return yaml.safe_load(files.read_text(path, what="environment file"))
    except files.BadFile as exc:
        raise SpecError("", str(exc)) from None
    except yaml.YAMLError as exc:
        raise SpecError("", f"{path} is not valid YAML: {_yaml_reason(exc)}") from None
