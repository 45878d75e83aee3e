"""The ``pip`` plugin with real venvs and real uv/pip installs from the test wheelhouse."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from processes import alive

from jupyter_runtimeenv.agent.events import Event
from jupyter_runtimeenv.errors import BuildError, BuildTimeout, SpecError
from jupyter_runtimeenv.plugins.pip import PipPlugin, venv_site_packages
from jupyter_runtimeenv.spec import parse

Agent = Callable[..., Any]

IMPORTS = (
    "import sys, alpha, beta, cloudpickle, jupyter_runtimeenv\n"
    "try:\n    import pathspec; parent = True\nexcept ImportError:\n    parent = False\n"
    "print(json.dumps({'prefix': sys.prefix, 'alpha': alpha.__version__, 'parent': parent,"
    " 'cloudpickle': cloudpickle.__version__}))"
)


def _leftovers(cache_dir: Path) -> list[str]:
    return [p.name for p in (cache_dir / "tmp").iterdir()]


# -- validation --------------------------------------------------------------------------


def test_forms_normalise_to_one_mapping_and_are_idempotent(tmp_path: Path) -> None:
    plugin = PipPlugin()
    (tmp_path / "base.txt").write_text("Alpha >= 1.0  # a comment\n")
    (tmp_path / "req.txt").write_text("# top\n-r base.txt\nbeta\n\n./localpkg\n")
    from_file = plugin.validate(str(tmp_path / "req.txt"))
    assert from_file == {
        "packages": [str(tmp_path / "localpkg"), "alpha>=1.0", "beta"],
        "install_options": [],
        "pip_check": False,
    }
    assert plugin.validate(["beta", "Alpha>=1.0", "beta"])["packages"] == ["alpha>=1.0", "beta"]
    for value in (
        ["beta"],
        str(tmp_path / "req.txt"),
        {"packages": ["x[b,a]; python_version>'3'"]},
    ):
        once = plugin.validate(value)
        assert plugin.validate(once) == once


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        (["cloudpickle<1"], "pip.0", "would break the workers"),
        (["cloudpickle==2.2.1"], "pip.0", "cloudpickle>=3"),
        (["jupyter-runtimeenv"], "pip.0", "provided to every environment"),
        (["not a requirement!"], "pip.0", "not a valid requirement"),
        ({"packages": ["a"], "bogus": 1}, "pip.bogus", "known keys"),
        ({"packages": "/does/not/exist.txt"}, "pip.packages", "cannot read"),
        ({"pip_check": "yes"}, "pip.pip_check", "true or false"),
    ],
)
def test_bad_requests_are_refused_naming_the_field(value: Any, field: str, words: str) -> None:
    with pytest.raises(SpecError) as info:
        parse({"pip": value})
    assert info.value.field == field
    assert words in info.value.reason


def test_uv_is_the_same_field_and_conflicts_with_conda() -> None:
    assert parse({"uv": ["beta"]}).env_id == parse({"pip": ["beta"]}).env_id
    with pytest.raises(SpecError, match="same field"):
        parse({"uv": ["beta"], "pip": ["beta"]})
    with pytest.raises(SpecError, match="cannot be combined"):
        parse({"pip": ["beta"], "conda": "base"})


def test_uri_ignores_the_installer_but_not_isolation() -> None:
    plugin = PipPlugin()
    specs = [
        parse({"pip": ["beta"], "config": {"installer": "uv"}}),
        parse({"pip": ["beta"], "config": {"installer": "pip"}}),
        parse({"pip": ["beta"], "config": {"isolated": True}}),
    ]
    uris = [plugin.uris(s.fields["pip"], s) for s in specs]
    assert uris[0] == uris[1] != uris[2]


# -- building ---------------------------------------------------------------------------


async def test_layered_env_sees_its_packages_then_the_parents(
    make_agent: Agent, run_in: Callable[..., Any]
) -> None:
    agent = await make_agent()
    ctx = await agent.get_or_create({"pip": ["beta"]}, "t")
    out = run_in(ctx, IMPORTS)
    assert out["alpha"] == "2.0"  # beta's dependency, resolved from the wheelhouse
    assert out["parent"] is True  # the agent's env shows through the .pth
    assert Path(out["prefix"]) == Path(ctx.python).parent.parent
    assert ctx.env_vars["VIRTUAL_ENV"] == out["prefix"]


async def test_isolated_env_sees_only_its_packages_and_the_worker_support(
    make_agent: Agent, run_in: Callable[..., Any]
) -> None:
    agent = await make_agent()
    ctx = await agent.get_or_create({"pip": ["beta"], "config": {"isolated": True}}, "t")
    out = run_in(ctx, IMPORTS)
    assert out["parent"] is False
    assert out["alpha"] == "2.0"
    import cloudpickle

    assert out["cloudpickle"] == cloudpickle.__version__


@pytest.mark.parametrize("installer", ["uv", "pip"])
async def test_installers_build_the_same_env(
    make_agent: Agent, run_in: Callable[..., Any], cache_dir: Path, installer: str
) -> None:
    agent = await make_agent()
    spec = {"pip": ["gamma"], "config": {"installer": installer}}
    ctx = await agent.get_or_create(spec, "t")
    assert run_in(ctx, "import alpha; print(json.dumps(alpha.__version__))") == "1.0"
    log = await agent.log(ctx.env_id)
    assert f"installing gamma with {installer}" in log
    # Each installer's own words: this really was uv or pip.
    assert ("Installed 2 packages" if installer == "uv" else "Successfully installed") in log
    if installer == "uv":
        assert (cache_dir / "shared" / "uv").is_dir()  # the shared package cache
    # The console script works from the final venv (pip wrote the build dir's path into
    # its shebang; the plugin points it at the final one; uv writes relocatable ones).
    script = Path(ctx.python).parent / "alpha-cli"
    assert str(cache_dir / "tmp") not in script.read_text()
    out = await asyncio.to_thread(
        subprocess.run, [str(script)], capture_output=True, text=True, check=True, timeout=30
    )
    assert out.stdout.strip() == "1.0"


async def test_two_specs_with_one_pip_set_share_one_venv(make_agent: Agent) -> None:
    agent = await make_agent()
    events: list[Event] = []
    agent.add_listener(events.append)
    first = await agent.get_or_create({"pip": ["beta"]}, "t")
    second = await agent.get_or_create({"pip": ["beta"], "env_vars": {"X": "1"}}, "t")
    assert first.env_id != second.env_id
    assert first.python == second.python
    ends = [e for e in events if e.kind == "step" and e.data.get("status") in ("done", "cached")]
    assert [(e.env_id, e.data["status"]) for e in ends] == [
        (first.env_id, "done"),
        (second.env_id, "cached"),
    ]


async def test_cache_hit_across_agent_restarts(make_agent: Agent, cache_dir: Path) -> None:
    spec = {"pip": ["beta"]}
    first = await make_agent()
    ctx = await first.get_or_create(spec, "t")
    await first.stop()
    second = await make_agent()
    events: list[Event] = []
    second.add_listener(events.append)
    again = await second.get_or_create(spec, "t")
    assert again == ctx
    assert not [e for e in events if e.kind in ("step", "log")]  # nothing was built
    assert await asyncio.to_thread(Path(again.python).exists)


@pytest.mark.parametrize("installer", ["uv", "pip"])
async def test_missing_requirement_fails_naming_it_and_leaves_nothing(
    make_agent: Agent, cache_dir: Path, installer: str
) -> None:
    agent = await make_agent()
    with pytest.raises(BuildError) as info:
        await agent.get_or_create(
            {"pip": ["alpha", "nonexistent-pkg"], "config": {"installer": installer}}, "t"
        )
    message = info.value.message
    assert "nonexistent-pkg" in message
    assert "alpha" not in message.split("failed")[0]  # the one at fault is named, alone
    own_words = "not found" if installer == "uv" else "No matching distribution"
    assert own_words in message
    assert info.value.step == "pip"
    assert info.value.output_tail
    assert _leftovers(cache_dir) == []
    assert not list((cache_dir / "resources").glob("pip/*"))


async def test_resolver_conflict_names_both_sides(make_agent: Agent, cache_dir: Path) -> None:
    agent = await make_agent()
    with pytest.raises(BuildError) as info:
        await agent.get_or_create({"pip": ["beta", "gamma"]}, "t")
    assert "beta" in info.value.message
    assert "gamma" in info.value.message
    assert "unsatisfiable" in info.value.message or "No solution" in info.value.message
    assert _leftovers(cache_dir) == []


async def test_requirements_file_with_install_options(
    make_agent: Agent,
    run_in: Callable[..., Any],
    tmp_path: Path,
    wheelhouse: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only the spec's own install_options say where packages come from here.
    for var in ("UV_FIND_LINKS", "UV_NO_INDEX", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(var)
    (tmp_path / "requirements.txt").write_text("alpha==1.0\n")
    spec = {
        "pip": {
            "packages": str(tmp_path / "requirements.txt"),
            "install_options": ["--no-index", "--find-links", str(wheelhouse)],
        }
    }
    agent = await make_agent()
    ctx = await agent.get_or_create(spec, "t")
    assert run_in(ctx, "import alpha; print(json.dumps(alpha.__version__))") == "1.0"


async def test_a_dependency_that_breaks_the_workers_is_refused(
    make_agent: Agent, cache_dir: Path
) -> None:
    agent = await make_agent()
    with pytest.raises(BuildError, match=r"cloudpickle 0\.5\.0.*workers need"):
        await agent.get_or_create({"pip": ["picklebreaker"]}, "t")
    assert _leftovers(cache_dir) == []


async def test_pip_check(make_agent: Agent) -> None:
    agent = await make_agent()
    ok = {"packages": ["beta"], "pip_check": True}
    await agent.get_or_create({"pip": ok}, "t")
    # --no-deps leaves beta without alpha: the check must catch it.
    broken = {"packages": ["beta"], "install_options": ["--no-deps"], "pip_check": True}
    with pytest.raises(BuildError) as info:
        await agent.get_or_create({"pip": broken}, "t")
    assert "pip check" in info.value.message
    assert any("alpha" in line for line in info.value.output_tail)


async def test_installer_output_streams_into_the_log_while_it_runs(make_agent: Agent) -> None:
    agent = await make_agent()
    events: list[Event] = []
    agent.add_listener(events.append)
    ctx = await agent.get_or_create({"pip": ["delta"]}, "t")
    kinds = [(e.kind, e.data.get("state"), e.data.get("line", "")) for e in events]
    ready = kinds.index(("state", "READY", ""))
    installed = [i for i, k in enumerate(kinds) if k[0] == "log" and "beta==1.0" in k[2]]
    assert installed
    assert installed[0] < ready
    assert "beta==1.0" in await agent.log(ctx.env_id)


async def test_deadline_kills_a_hung_install(
    make_agent: Agent, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_file = tmp_path / "hang.pid"
    monkeypatch.setenv("HANG_PID_FILE", str(pid_file))
    agent = await make_agent()
    # The deadline counts from the build's start: long enough for the backend to start on a
    # loaded machine (5 s is tight under a CPU hog), or there is nothing to kill.
    spec = {"pip": ["hang"], "config": {"setup_timeout_seconds": 20}}
    with pytest.raises(BuildTimeout) as info:
        await agent.get_or_create(spec, "t")
    assert "pip" in info.value.step
    assert pid_file.exists(), "the build backend never started"
    text = pid_file.read_text()  # empty if it was killed between creating and writing it
    assert not text or not alive(int(text)), "the hung build backend is still running"
    hung = [
        p
        for p in psutil.process_iter(["cmdline"])
        if any("hang_backend" in part for part in (p.info["cmdline"] or []))
        # this test's own (other runs on the machine may build 'hang' at the same time)
        and str(cache_dir) in " ".join(p.info["cmdline"] or [])
        and alive(p.pid)  # a process that exits meanwhile is gone, not an error
    ]
    assert hung == []
    assert _leftovers(cache_dir) == []


def test_site_packages_layout_matches_the_venv(tmp_path: Path) -> None:
    # The .pth files go where the venv's python looks: same scheme as the agent's python.
    import sysconfig

    expected = Path(sysconfig.get_path("purelib")).relative_to(sysconfig.get_path("data"))
    assert venv_site_packages(tmp_path) == tmp_path / expected
