"""``py_modules``: packages, single files, wheels and zips on sys.path in declared order;
and an env with pip + working_dir + py_modules building its resources at the same time."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from wheelhouse import build_wheel

from jupyter_runtimeenv.agent.events import Event
from jupyter_runtimeenv.errors import SpecError
from jupyter_runtimeenv.spec import parse

Agent = Callable[..., Any]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


async def test_every_kind_of_module_imports_in_declared_order(
    make_agent: Agent, run_in: Callable[..., Any], tmp_path: Path
) -> None:
    first = _write(tmp_path / "one" / "shared" / "__init__.py", "WHO = 'first'\n").parent
    second = _write(tmp_path / "two" / "shared" / "__init__.py", "WHO = 'second'\n").parent
    single = _write(tmp_path / "single.py", "WHO = 'single'\n")
    wheel = build_wheel(tmp_path, "wheeled", "3.0", [])
    archive = tmp_path / "zipped.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("zipped/__init__.py", "WHO = 'zipped'\n")
    spec = {"py_modules": [str(first), str(second), str(single), str(wheel), str(archive)]}
    agent = await make_agent()
    ctx = await agent.get_or_create(spec, "t")
    out = run_in(
        ctx,
        "import shared, single, wheeled, zipped;"
        " print(json.dumps([shared.WHO, single.WHO, wheeled.__version__, zipped.WHO]))",
    )
    assert out == ["first", "single", "3.0", "zipped"]  # the first 'shared' wins
    assert len(ctx.extra_paths) == 5


async def test_working_dir_goes_ahead_of_the_modules(
    make_agent: Agent, run_in: Callable[..., Any], tmp_path: Path
) -> None:
    mod = _write(tmp_path / "mods" / "same.py", "WHO = 'module'\n")
    wd = _write(tmp_path / "wd" / "same.py", "WHO = 'working_dir'\n").parent
    agent = await make_agent()
    ctx = await agent.get_or_create({"py_modules": [str(mod)], "working_dir": str(wd)}, "t")
    assert ctx.extra_paths[0] == ctx.cwd
    assert run_in(ctx, "import same; print(json.dumps(same.WHO))") == "working_dir"


def test_values_are_checked_and_idempotent(tmp_path: Path) -> None:
    mod = _write(tmp_path / "m.py", "")
    with pytest.raises(SpecError) as info:
        parse({"py_modules": [str(mod), str(tmp_path / "missing")]})
    assert info.value.field == "py_modules.1"
    with pytest.raises(SpecError, match="a list"):
        parse({"py_modules": str(mod)})
    spec = parse({"py_modules": [str(mod), str(mod)]})
    assert spec.fields["py_modules"] == [str(mod)]
    assert parse(spec.to_json()).env_id == spec.env_id


async def test_pip_working_dir_and_py_modules_build_at_the_same_time(
    make_agent: Agent, tmp_path: Path
) -> None:
    wd = _write(tmp_path / "wd" / "main.py", "").parent
    mod = _write(tmp_path / "lib" / "lib.py", "")
    agent = await make_agent()
    events: list[Event] = []
    agent.add_listener(events.append)
    spec = {"pip": ["delta"], "working_dir": str(wd), "py_modules": [str(mod)]}
    await agent.get_or_create(spec, "t")
    steps = [e for e in events if e.kind == "step"]
    started = {e.data["step"].split()[0]: e.data["started"] for e in steps if "started" in e.data}
    ended = {
        e.data["step"].split()[0]: e.data["ended"] for e in steps if e.data.get("status") == "done"
    }
    assert set(started) == set(ended) == {"pip", "working_dir", "py_modules"}
    # Every step started before any finished: they ran at the same time, not in turn.
    assert max(started.values()) <= min(ended.values())
