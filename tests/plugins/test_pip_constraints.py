"""A layered ``pip`` env resolves against the kernel's installed versions (issue 20 item 9).

A real venv plays the kernel's environment, with ``alpha 1.0`` installed from the test
wheelhouse (which also has ``alpha 2.0``, ``beta`` needing ``alpha>=2`` and ``gamma``
needing ``alpha<2``). Real uv and pip installs.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.errors import BuildError
from jupyter_runtimeenv.plugins._constraints import installed_versions, pins_for
from jupyter_runtimeenv.plugins._uv import uv_bin
from jupyter_runtimeenv.plugins.pip import venv_python, venv_site_packages

Agent = Callable[..., Any]
ALPHA = "import alpha; print(json.dumps(alpha.__version__))"


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path) -> Path:
    """A kernel's environment with alpha 1.0 (not the newest the index has)."""
    venv = tmp_path_factory.mktemp("kernel") / "venv"
    subprocess.run(
        [uv_bin(), "venv", "-q", str(venv), "--python", sys.executable, "--no-config"],
        check=True,
    )
    subprocess.run(
        [
            *(uv_bin(), "pip", "install", "-q", "--python", venv_python(venv), "alpha==1.0"),
            *("--no-index", "--find-links", str(wheelhouse), "--no-config"),
        ],
        check=True,
    )
    return venv


def spec(kernel_env: Path, *packages: str, **config: Any) -> dict[str, Any]:
    return {
        "pip": list(packages),
        "driver_python": venv_python(kernel_env),
        **({"config": config} if config else {}),
    }


@pytest.mark.parametrize("installer", ["uv", "pip"])
async def test_an_unpinned_package_gets_the_kernels_version(
    make_agent: Agent, run_in: Callable[..., Any], kernel_env: Path, installer: str
) -> None:
    agent = await make_agent()
    ctx = await agent.get_or_create(spec(kernel_env, "alpha", installer=installer), "t")
    assert run_in(ctx, ALPHA) == "1.0"  # the kernel's, though 2.0 is the newest
    # ... installed in the env itself (the kernel's copy is not what the worker sees)
    assert (venv_site_packages(Path(ctx.python).parent.parent) / "alpha").is_dir()
    log = await agent.log(ctx.env_id)
    assert "resolving against the kernel's versions of 1 installed packages" in log


async def test_a_dependency_takes_the_kernels_version_where_it_fits(
    make_agent: Agent, run_in: Callable[..., Any], kernel_env: Path
) -> None:
    agent = await make_agent()
    ctx = await agent.get_or_create(spec(kernel_env, "gamma"), "t")  # gamma: alpha<2
    assert run_in(ctx, ALPHA) == "1.0"


async def test_the_spec_pins_otherwise(
    make_agent: Agent, run_in: Callable[..., Any], kernel_env: Path
) -> None:
    agent = await make_agent()
    ctx = await agent.get_or_create(spec(kernel_env, "alpha>=2"), "t")
    assert run_in(ctx, ALPHA) == "2.0"
    log = await agent.log(ctx.env_id)
    assert "the request pins alpha otherwise" in log


async def test_a_request_the_kernels_versions_cannot_meet_is_resolved_without_them(
    make_agent: Agent, run_in: Callable[..., Any], kernel_env: Path
) -> None:
    agent = await make_agent()
    ctx = await agent.get_or_create(spec(kernel_env, "beta"), "t")  # beta: alpha>=2
    assert run_in(ctx, ALPHA) == "2.0"
    log = await agent.log(ctx.env_id)
    assert "the kernel's versions do not fit this request" in log
    assert "installing again without them" in log


@pytest.mark.parametrize("installer", ["uv", "pip"])
async def test_a_package_that_does_not_exist_fails_once(
    make_agent: Agent, kernel_env: Path, installer: str
) -> None:
    """The kernel's versions are not what failed, so the install is not tried again without
    them: the installer's error shows once, and the refusal names the package."""
    agent = await make_agent()
    request = spec(kernel_env, "alpha", "no-such-pkg-xyz", installer=installer)
    with pytest.raises(BuildError, match="installing no-such-pkg-xyz failed") as raised:
        await agent.get_or_create(request, "t")
    log = await agent.log(raised.value.env_id)
    assert "resolving against the kernel's versions" in log  # they were used ...
    assert "installing again without them" not in log  # ... and not blamed
    said = {"uv": "No solution found", "pip": "No matching distribution found"}[installer]
    assert log.count(said) == 1, log


async def test_an_isolated_env_resolves_on_its_own(
    make_agent: Agent, run_in: Callable[..., Any], kernel_env: Path
) -> None:
    agent = await make_agent()
    ctx = await agent.get_or_create(spec(kernel_env, "alpha", isolated=True), "t")
    assert run_in(ctx, ALPHA) == "2.0"
    assert "resolving against the kernel's versions" not in await agent.log(ctx.env_id)


def test_pins_follow_the_request(kernel_env: Path) -> None:
    installed = {"alpha": "1.0", "pandas": "3.1.1", "numpy": "2.3.0", "odd": "not-a-version"}
    lines, free = pins_for(
        installed,
        ["pandas<3", "numpy>=2", "alpha @ https://example.org/alpha-1.0.whl", "--no-deps"],
    )
    assert lines == ["numpy==2.3.0"]  # meets the request's specifier: kept
    assert free == ["alpha", "pandas"]  # by URL, and pinned otherwise
    assert installed_versions([str(venv_site_packages(kernel_env))]) == {"alpha": "1.0"}


def test_installed_versions_read_as_importlib_reads_them(tmp_path: Path) -> None:
    """Names and versions from ``.dist-info`` directory names give what importlib.metadata
    gives (this interpreter's own site directories, ~200 real distributions), and the odd
    cases (an .egg-info, a name the fast path cannot split, a .dist-info without METADATA,
    the first of two directories wins) are read the slow way or skipped, as before."""
    import site

    from packaging.utils import canonicalize_name

    def by_importlib(dirs: list[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for dist in metadata.distributions(path=dirs):
            try:
                name, version = dist.metadata["Name"], dist.version
            except FileNotFoundError:
                # The importlib_metadata backport, once anything in this process imported
                # it, is on sys.meta_path and raises MetadataNotFound for a .dist-info
                # without METADATA where the standard library gives None: either way no
                # distribution (a whole-suite run, which imports it earlier, failed here).
                continue
            if name and version:
                found.setdefault(canonicalize_name(name), version)
        return found

    real = [p for p in sys.path if p.endswith("site-packages")] or site.getsitepackages()
    assert len(installed_versions(real)) > 20
    assert installed_versions(real) == by_importlib(real)

    first, second = tmp_path / "first", tmp_path / "second"
    meta = "Metadata-Version: 2.1\nName: {}\nVersion: {}\n"
    for where, entry, name, version in (
        (first, "Zeta_Pkg-1.2.post1.dist-info", "Zeta-Pkg", "1.2.post1"),
        (first, "legacy.egg-info", "Legacy", "0.9"),
        (first, "odd-name-3.0.dist-info", "odd-name", "3.0"),
        (second, "zeta_pkg-9.0.dist-info", "zeta-pkg", "9.0"),  # shadowed by first's
    ):
        (where / entry).mkdir(parents=True)
        kind = "PKG-INFO" if entry.endswith(".egg-info") else "METADATA"
        (where / entry / kind).write_text(meta.format(name, version))
    (first / "broken-1.0.dist-info").mkdir()  # no METADATA: not a constraint
    dirs = [str(first), str(second), str(tmp_path / "missing")]
    expected = {"zeta-pkg": "1.2.post1", "legacy": "0.9", "odd-name": "3.0"}
    assert installed_versions(dirs) == expected == by_importlib(dirs)
