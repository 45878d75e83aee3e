"""``conda``: an existing conda environment (by name or prefix) whose python workers use,
or one created from an ``environment.yml`` (a mapping, or a path to the file).

Who calls it: ``spec.parse`` (``validate``) and the agent (``uris``, ``create``,
``modify_context``). Creating needs micromamba, mamba or conda on PATH (or ``$MAMBA_EXE`` /
``$CONDA_EXE``); without one the build fails saying which names were tried. Conda envs are
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
from typing import TYPE_CHECKING, Any

import yaml

from ..context import ContextBuilder
from ..errors import BuildError, SpecError
from ..spec.model import sha256_of
from ..spec.paths import resolve_path
from . import _remote
from ._support import write_support
from .base import BuildContext, RuntimeEnvPlugin

if TYPE_CHECKING:
    from ..spec import RuntimeEnvSpec

#: Tried in this order: micromamba and mamba solve much faster than conda.
BINARIES = ("micromamba", "mamba", "conda")
_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")
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
    name = "conda"
    conflicts = ("pip",)
    priority = 10
    description = "an existing conda env (name or prefix) or an environment.yml to create"

    def validate(self, value: Any) -> str | dict[str, Any]:
        if isinstance(value, str):
            if value.endswith((".yml", ".yaml")) and _remote.is_remote(value):
                return self._env_dict(_parse_yaml(_remote.read_text(value, ""), value))
            if value.endswith((".yml", ".yaml")):
                return self._env_dict(_load_yaml(resolve_path(value)))
            if os.sep in value or value.startswith((".", "~")):
                return resolve_path(value)
            if not _NAME.match(value):
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
        if not await build.to_thread(_python_of, prefix):
            raise BuildError(f"{prefix} is not a conda environment: it has no bin/python")
        build.log(f"conda environment: {prefix}")
        await build.to_thread(_record, build.target, prefix)
        return 0

    async def _create_env(self, uri: str, value: dict[str, Any], build: BuildContext) -> str:
        exe = find_binary()
        prefix = _shared_prefix(build.cache_root, uri)
        await build.to_thread(shutil.rmtree, prefix, True)  # leftovers of a failed attempt
        envfile = build.target / "environment.yml"
        await build.to_thread(envfile.write_text, yaml.safe_dump(value))
        if Path(exe).name.startswith("micromamba"):
            argv = [exe, "create", "--yes", "--prefix", str(prefix), "--file", str(envfile)]
        else:
            argv = [exe, "env", "create", "--prefix", str(prefix), "--file", str(envfile)]
        try:
            async with build.limit("install"):
                await build.run(argv, what=f"{Path(exe).name} env create")
        except BaseException:
            await build.to_thread(shutil.rmtree, prefix, True)
            raise
        return str(prefix)

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        resource = Path(ctx.resource_path(uris[0]))
        prefix = (resource / "prefix.txt").read_text(encoding="utf-8").strip()
        ctx.python = _python_of(prefix) or os.path.join(prefix, "bin", "python")
        ctx.env_vars["CONDA_PREFIX"] = prefix
        ctx.env_vars["CONDA_DEFAULT_ENV"] = value if isinstance(value, str) else prefix
        path = ctx.env_vars.get("PATH") or os.environ.get("PATH", os.defpath)
        ctx.env_vars["PATH"] = os.pathsep.join([os.path.dirname(ctx.python), path])
        ctx.extra_paths.append(str(resource / "support"))

    async def delete(self, uri: str, path: Path) -> None:
        if uri.startswith("conda:env:"):
            await asyncio.to_thread(_remove_recorded, path)


def _shared_prefix(cache_root: Path, uri: str) -> Path:
    return cache_root / "shared" / "conda" / uri.rsplit(":", 1)[1]


def _record(target: Path, prefix: str) -> None:
    (target / "prefix.txt").write_text(prefix + "\n", encoding="utf-8")
    write_support(target / "support")


def _remove_recorded(resource: Path) -> None:
    prefix = (resource / "prefix.txt").read_text(encoding="utf-8").strip()
    shutil.rmtree(prefix, ignore_errors=True)


def _parse_yaml(text: str, where: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        reason = " ".join(str(exc).split())
        raise SpecError("", f"{_remote.redact(where)} is not valid YAML: {reason}") from None


def _load_yaml(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except OSError as exc:
        raise SpecError("", f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SpecError("", f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
