"""``conda``. No conda channel is reachable from the test machines and no conda binary is
installed, so what cannot be tested here is a real solve and install of an environment.yml.
What is tested: an existing env by prefix and by name (fake prefixes whose bin/python is
this interpreter), the error without a binary, and the create path end to end with a fake
``micromamba`` script on PATH that makes such a prefix (it checks the arguments we pass)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.errors import BuildError, SpecError
from jupyter_runtimeenv.plugins import PluginRegistry
from jupyter_runtimeenv.plugins.conda import CondaPlugin
from jupyter_runtimeenv.spec import parse

Agent = Callable[..., Any]

CHECK = (
    "import sys, cloudpickle, jupyter_runtimeenv;"
    " print(json.dumps([sys.executable, os.environ['CONDA_PREFIX']]))"
)


def fake_prefix(path: Path) -> Path:
    (path / "bin").mkdir(parents=True)
    (path / "conda-meta").mkdir()
    os.symlink(sys.executable, path / "bin" / "python")
    return path


async def test_existing_prefix(
    make_agent: Agent, run_in: Callable[..., Any], tmp_path: Path
) -> None:
    prefix = fake_prefix(tmp_path / "envs" / "myenv")
    agent = await make_agent()
    ctx = await agent.get_or_create({"conda": str(prefix)}, "t")
    assert ctx.python == str(prefix / "bin" / "python")
    assert ctx.env_vars["PATH"].startswith(str(prefix / "bin"))
    python, conda_prefix = run_in(ctx, CHECK)
    assert conda_prefix == str(prefix)
    assert python == str(prefix / "bin" / "python")


async def test_existing_name(
    make_agent: Agent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = fake_prefix(tmp_path / "envs" / "named")
    monkeypatch.setenv("CONDA_ENVS_PATH", str(tmp_path / "envs"))
    agent = await make_agent()
    ctx = await agent.get_or_create({"conda": "named"}, "t")
    assert ctx.env_vars["CONDA_PREFIX"] == str(prefix)
    with pytest.raises(BuildError, match=r"no conda environment named 'nope'; looked in .*envs"):
        await agent.get_or_create({"conda": "nope"}, "t")


async def test_no_binary_says_which_names_were_tried(
    make_agent: Agent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CONDA_EXE", raising=False)
    monkeypatch.delenv("MAMBA_EXE", raising=False)
    # builder="binary": without it py-rattler (in the test extra) would build instead; see
    # test_conda_rattler.py for that, and for the error when neither is there.
    registry = PluginRegistry()
    registry.add(CondaPlugin(builder="binary"))
    agent = await make_agent(registry=registry)
    with pytest.raises(BuildError) as info:
        await agent.get_or_create({"conda": {"dependencies": ["python=3.11"]}}, "t")
    message = info.value.message
    assert "no conda binary found" in message
    for name in ("micromamba", "mamba", "conda", "$CONDA_EXE"):
        assert name in message


FAKE_MICROMAMBA = """#!/bin/sh
# A stand-in for micromamba: checks our arguments, makes a prefix whose python is ours.
[ "$1" = create ] && [ "$2" = --yes ] && [ "$3" = --prefix ] && [ "$5" = --file ] || exit 2
grep -q "dependencies" "$6" || exit 3
echo "fake micromamba: creating $4"
mkdir -p "$4/bin" "$4/conda-meta" && ln -s "{python}" "$4/bin/python"
"""


async def test_environment_yml_is_created_with_the_binary_found(
    make_agent: Agent,
    run_in: Callable[..., Any],
    tmp_path: Path,
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "micromamba"
    script.write_text(FAKE_MICROMAMBA.format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CONDA_EXE", raising=False)
    monkeypatch.delenv("MAMBA_EXE", raising=False)
    yml = tmp_path / "environment.yml"
    yml.write_text("name: ignored\nchannels: [conda-forge]\ndependencies: [python=3.11]\n")
    agent = await make_agent()
    ctx = await agent.get_or_create({"conda": str(yml)}, "t")
    prefix = ctx.env_vars["CONDA_PREFIX"]
    assert Path(prefix).parent == cache_dir / "shared" / "conda"
    assert "fake micromamba: creating" in await agent.log(ctx.env_id)
    assert run_in(ctx, CHECK)[1] == prefix
    # Evicting the resource removes the env it created.
    await agent.release(ctx.env_id, "t")
    await agent.gc(0)
    assert not await asyncio.to_thread(os.path.exists, prefix)


def test_values(tmp_path: Path) -> None:
    plugin = CondaPlugin()
    yml = tmp_path / "env.yaml"
    yml.write_text("name: x\ndependencies: [numpy]\n")
    assert plugin.validate(str(yml)) == {"dependencies": ["numpy"]}
    assert plugin.validate(plugin.validate(str(yml))) == {"dependencies": ["numpy"]}
    assert plugin.validate("base") == "base"
    assert plugin.validate("./rel/prefix") == str(Path.cwd() / "rel" / "prefix")
    with pytest.raises(SpecError) as info:
        parse({"conda": {"dependencies": []}})
    assert info.value.field == "conda.dependencies"
    with pytest.raises(SpecError, match="known keys"):
        parse({"conda": {"dependencies": ["x"], "bogus": 1}})
