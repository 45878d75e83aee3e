"""Creating a conda environment with py-rattler (the solver and installer pixi uses) when no
micromamba/mamba/conda binary is on PATH: the ``conda`` extra.

Who calls it: ``CondaPlugin.create``, on the agent's loop: rattler's ``solve`` and
``install`` are coroutines whose work runs on rattler's own threads, so nothing blocks the
loop and cancelling the build (deadline, interrupt) cancels them. The repodata and package
caches are shared by every env of the cache root (``<cache_root>/shared/rattler``), so a
second env with the same packages downloads nothing; a cached env does no solve at all
(its resource is found before ``create`` is called).

Channels: the spec's, else the ``channels`` of ``$CONDARC`` or ``~/.condarc``, else
conda-forge. A failed solve is one line naming the package that cannot be satisfied.
Pip packages listed inside the dependencies (``{"pip": [...]}``) are installed with uv
into the env's python; an env without python cannot take them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from ..errors import BuildError
from .base import BuildContext

__all__ = ["available", "create_env", "solve_error_line"]

_DEFAULTS = ["https://repo.anaconda.com/pkgs/main", "https://repo.anaconda.com/pkgs/r"]


def available() -> bool:
    try:
        import rattler  # noqa: F401
    except ImportError:
        return False
    return True


def default_channels() -> list[str]:
    """The ``channels`` of the user's condarc, else conda-forge."""
    for path in (os.environ.get("CONDARC"), os.path.expanduser("~/.condarc")):
        if not path or not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                data = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError):
            continue
        channels = data.get("channels") if isinstance(data, dict) else None
        if isinstance(channels, list) and channels:
            return [str(c) for c in channels]
    return ["conda-forge"]


def _channel_urls(names: list[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        out += _DEFAULTS if name == "defaults" else [name]
    return list(dict.fromkeys(out))


class _Reporter:
    """rattler's install progress, as lines in the env's log."""

    def __init__(self, build: BuildContext) -> None:
        self.build = build
        self.names: dict[int, str] = {}

    def on_transaction_start(self, total_operations: int) -> None:
        self.build.log(f"rattler: {total_operations} packages to link")

    def on_link_start(self, operation: int, package_name: str) -> int:
        self.names[operation] = package_name
        return operation

    def on_link_complete(self, index: int) -> None:
        self.build.log(f"rattler: linked {self.names.get(index, index)}")

    def on_transaction_complete(self) -> None:
        self.build.log("rattler: transaction complete")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("on_"):  # the callbacks we do not report on
            return lambda *args: 0 if name.endswith("_start") else None
        raise AttributeError(name)


async def create_env(value: dict[str, Any], prefix: Path, build: BuildContext) -> list[str]:
    """Solve and install ``value`` (an environment.yml mapping) at ``prefix``.

    Returns the pip requirements found among the dependencies (installed by the caller).
    """
    import rattler
    from rattler.exceptions import SolverError

    specs: list[str] = []
    pip: list[str] = []
    for dep in value["dependencies"]:
        if isinstance(dep, dict) and isinstance(dep.get("pip"), list):
            pip += [str(p) for p in dep["pip"]]
        elif isinstance(dep, str):
            specs.append(dep)
        else:
            raise BuildError(f"conda.dependencies: cannot read the dependency {dep!r}")
    names = value.get("channels") or default_channels()
    channels = [rattler.Channel(url) for url in _channel_urls(names)]
    shared = build.cache_root / "shared" / "rattler"
    build.log(f"rattler: solving {', '.join(specs)} from {', '.join(names)}")
    gateway = rattler.Gateway(cache_dir=shared / "repodata")
    platform = rattler.Subdir.current()
    try:
        records = await rattler.solve(
            channels,
            specs,
            gateway=gateway,
            platforms=[platform, rattler.Subdir("noarch")],
            virtual_packages=rattler.VirtualPackage.detect(),
        )
    except SolverError as exc:
        raise BuildError(solve_error_line(str(exc)), output_tail=str(exc).splitlines()) from None
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BuildError(
            f"conda solve failed: {first}", output_tail=str(exc).splitlines()
        ) from None
    for record in records:
        build.log(f"rattler: {record.name.normalized} {record.version} {record.build}")
    try:
        await rattler.install(
            records,
            prefix,
            cache_dir=shared / "pkgs",
            show_progress=False,
            reporter=_Reporter(build),
        )
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BuildError(f"conda install failed: {first}") from None
    return pip


_NONE_FOUND = re.compile(r"No candidates were found for (\S+)")
_REQUIRED = re.compile(r"└─ (\S+) ([^,\n]*?),? which (?:can|cannot) be installed")


def solve_error_line(text: str) -> str:
    """rattler's solver explanation (a tree) as one line naming the unsatisfiable package."""
    missing = _NONE_FOUND.search(text)
    if missing:
        return f"conda solve failed: no package {missing.group(1)} in the channels"
    wanted: dict[str, list[str]] = {}
    for name, spec in _REQUIRED.findall(text):
        if spec not in wanted.setdefault(name, []):
            wanted[name].append(spec)
    for name, specs in wanted.items():
        if len(specs) > 1:
            return (
                f"conda solve failed: {name} cannot be satisfied: required as"
                f" {' and as '.join(f'{name} {s}' for s in specs)}"
            )
    flat = " ".join(line.strip(" │├└─") for line in text.splitlines() if line.strip())
    return f"conda solve failed: {flat[:300]}"
