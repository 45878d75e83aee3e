"""``conda`` built with py-rattler (no conda binary) from a local channel this test builds
and indexes with py-rattler's own indexer: tiny noarch packages (``tinytool`` depends on
``tinylib>=2``; ``oldthing`` on ``tinylib<2``), solved, installed and used by a process
started in the env the way a worker starts.

What is real here: rattler's solve, its package cache, its install (linking) and the
channel's repodata. What is not testable offline: a conda env with its own ``python``
(conda-forge's python is not reachable), so the envs built here have none, and workers run
on the driver's python with the env's ``bin`` on PATH (the README says so).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.errors import BuildError
from jupyter_runtimeenv.plugins import PluginRegistry, _rattler
from jupyter_runtimeenv.plugins.conda import CondaPlugin

Agent = Callable[..., Any]
TOOL = '#!/bin/sh\necho "tinytool sees tinylib $(cat "$CONDA_PREFIX/share/tinylib/VERSION")"\n'


def conda_package(
    channel: Path, name: str, version: str, depends: list[str], files: dict[str, str]
) -> None:
    """A noarch ``.tar.bz2`` conda package: info/index.json, info/paths.json, the files."""
    index = {
        "name": name,
        "version": version,
        "build": "0",
        "build_number": 0,
        "depends": depends,
        "noarch": "generic",
        "subdir": "noarch",
        "timestamp": 1_700_000_000_000,
        "license": "MIT",
    }
    members = {rel: text.encode() for rel, text in files.items()}
    paths = [
        {
            "_path": rel,
            "path_type": "hardlink",
            "sha256": hashlib.sha256(data).hexdigest(),
            "size_in_bytes": len(data),
        }
        for rel, data in members.items()
    ]
    members["info/index.json"] = json.dumps(index).encode()
    members["info/paths.json"] = json.dumps({"paths": paths, "paths_version": 1}).encode()
    members["info/files"] = ("\n".join(files) + "\n").encode()
    (channel / "noarch").mkdir(parents=True, exist_ok=True)
    with tarfile.open(channel / "noarch" / f"{name}-{version}-0.tar.bz2", "w:bz2") as tf:
        for rel, data in members.items():
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.mode = 0o755 if rel.startswith("bin/") else 0o644
            tf.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def channel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import asyncio

    from rattler.index import index_fs

    root = tmp_path_factory.mktemp("channel")
    conda_package(root, "tinylib", "1.0", [], {"share/tinylib/VERSION": "1.0"})
    conda_package(root, "tinylib", "2.0", [], {"share/tinylib/VERSION": "2.0"})
    conda_package(root, "tinytool", "1.0", ["tinylib >=2"], {"bin/tinytool": TOOL})
    conda_package(root, "oldthing", "1.0", ["tinylib <2"], {"share/oldthing/README": "old"})
    asyncio.run(index_fs(root, force=True))
    assert (root / "noarch" / "repodata.json").is_file()
    return root


@pytest.fixture
async def agent(make_agent: Agent) -> Any:
    registry = PluginRegistry()
    registry.add(CondaPlugin(builder="rattler"))
    return await make_agent(registry=registry)


def env_of(channel: Path, *deps: Any) -> dict[str, Any]:
    return {"conda": {"channels": [str(channel)], "dependencies": list(deps)}}


async def test_solve_install_and_use_with_a_dependency(
    agent: Any, channel: Path, run_in: Callable[..., Any]
) -> None:
    ctx = await agent.get_or_create(env_of(channel, "tinytool"), "t")
    out = run_in(
        ctx,
        "import subprocess; print(json.dumps(subprocess.run(['tinytool'],"
        " capture_output=True, text=True, check=True).stdout.strip()))",
    )
    assert out == "tinytool sees tinylib 2.0"  # the dependency, solved to the version it needs
    log = await agent.log(ctx.env_id)
    assert "rattler: solving tinytool" in log
    assert "rattler: tinylib 2.0 0" in log
    assert "rattler: linked tinytool" in log

    # A cached second request does no solve: another env with the same conda env reuses it.
    again = await agent.get_or_create({**env_of(channel, "tinytool"), "env_vars": {"X": "1"}}, "t")
    assert again.env_vars["CONDA_PREFIX"] == ctx.env_vars["CONDA_PREFIX"]
    assert "rattler: solving" not in await agent.log(again.env_id)


async def test_a_version_conflict_is_one_line_naming_the_package(agent: Any, channel: Path) -> None:
    with pytest.raises(BuildError) as info:
        await agent.get_or_create(env_of(channel, "tinytool", "oldthing"), "t")
    line = str(info.value).splitlines()[0]
    assert "conda solve failed: tinylib cannot be satisfied" in line
    assert "tinylib <2" in line
    assert "tinylib >=2" in line


async def test_a_missing_package_is_named(agent: Any, channel: Path) -> None:
    with pytest.raises(BuildError, match="no package nosuchpkg in the channels"):
        await agent.get_or_create(env_of(channel, "nosuchpkg"), "t")


async def test_pip_dependencies_need_python_in_the_env(agent: Any, channel: Path) -> None:
    with pytest.raises(BuildError, match="pip packages need python in the environment"):
        await agent.get_or_create(env_of(channel, "tinylib", {"pip": ["alpha"]}), "t")


async def test_without_binary_or_rattler_the_error_names_both(
    make_agent: Agent, channel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_rattler, "available", lambda: False)
    for var in ("MAMBA_EXE", "CONDA_EXE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    agent = await make_agent()
    with pytest.raises(BuildError) as info:
        await agent.get_or_create(env_of(channel, "tinylib"), "t")
    assert "micromamba" in str(info.value)
    assert "jupyter-runtimeenv[conda]" in str(info.value)
