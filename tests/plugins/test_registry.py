"""Loading plugins: entry points (built-in and third-party alike), import paths, allow-lists."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.errors import PluginNotFound, SpecError
from jupyter_runtimeenv.plugins import ENTRY_POINT_GROUP, PluginRegistry, default_registry
from jupyter_runtimeenv.plugins.env_vars import EnvVarsPlugin
from jupyter_runtimeenv.spec import SpecPolicy, parse

PLUGIN_MODULE = """
from jupyter_runtimeenv.errors import SpecError
from jupyter_runtimeenv.plugins import RuntimeEnvPlugin


class Niceness(RuntimeEnvPlugin):
    name = "niceness"
    priority = 80

    def validate(self, value):
        if not isinstance(value, int) or isinstance(value, bool):
            raise SpecError("", f"expected an integer, got {type(value).__name__}")
        return value

    def modify_context(self, uris, value, ctx):
        ctx.command_prefix[:0] = ["nice", "-n", str(value)]
        ctx.env_vars["ORDER"] = ctx.env_vars.get("ORDER", "") + "niceness,"


class Early(RuntimeEnvPlugin):
    name = "early"
    priority = 5

    def modify_context(self, uris, value, ctx):
        ctx.env_vars["ORDER"] = ctx.env_vars.get("ORDER", "") + "early,"
        ctx.env_vars["WHO"] = "early"


class Late(RuntimeEnvPlugin):
    name = "late"
    priority = 95

    def modify_context(self, uris, value, ctx):
        ctx.env_vars["ORDER"] = ctx.env_vars.get("ORDER", "") + "late,"
        ctx.env_vars["WHO"] = "late"
"""


@pytest.fixture
def third_party(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A third-party distribution on sys.path, with entry points like an installed one."""
    (tmp_path / "niceplug.py").write_text(PLUGIN_MODULE)
    dist = tmp_path / "niceplug-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: niceplug\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        textwrap.dedent(
            f"""\
            [{ENTRY_POINT_GROUP}]
            niceness = niceplug:Niceness
            broken = no_such_module_for_plugins:Plugin
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_builtins_load_from_entry_points() -> None:
    registry = default_registry()
    assert isinstance(registry.for_field("env_vars"), EnvVarsPlugin)
    for field in ("env_vars", "py_executable", "driver_sys_path", "pip", "uv", "working_dir"):
        assert field in registry.fields()
    assert registry.for_field("uv") is registry.for_field("pip")


def test_third_party_entry_point_claims_a_field(third_party: Path) -> None:
    registry = PluginRegistry()
    spec = parse({"niceness": 5}, registry=registry)
    assert spec.get("niceness") == 5
    with pytest.raises(SpecError) as info:
        parse({"niceness": "high"}, registry=registry)
    assert info.value.field == "niceness"
    assert "expected an integer, got str" in info.value.reason


def test_broken_entry_point_is_reported_when_used(third_party: Path) -> None:
    registry = PluginRegistry()
    assert parse({"env_vars": {"A": "1"}}, registry=registry).env_vars == {"A": "1"}
    with pytest.raises(SpecError) as info:
        parse({"broken": 1}, registry=registry)
    assert info.value.field == "broken"
    assert "failed to load" in info.value.reason
    assert "no_such_module_for_plugins" in info.value.reason


def test_import_path_plugin_config_is_validated_by_the_plugin(third_party: Path) -> None:
    spec = parse({"plugins": {"niceplug.Niceness": 3}})
    assert spec.plugins == {"niceplug.Niceness": 3}
    with pytest.raises(SpecError) as info:
        parse({"plugins": {"niceplug.Niceness": "x"}})
    assert info.value.field == "plugins.niceplug.Niceness"
    assert parse({"plugins": {"niceplug:Niceness": 3}}).plugins == {"niceplug:Niceness": 3}


def test_allowed_plugins_refuse_others(third_party: Path) -> None:
    policy = SpecPolicy.untrusted(allowed_plugins=["niceplug.Early"])
    parse({"plugins": {"niceplug.Early": {}}}, policy=policy)
    with pytest.raises(PluginNotFound) as info:
        parse({"plugins": {"niceplug.Late": {}}}, policy=policy)
    assert info.value.field == "plugins.niceplug.Late"
    assert "not allowed" in info.value.reason


async def test_modify_context_runs_in_priority_order(
    third_party: Path, make_agent: Callable[..., Any]
) -> None:
    agent = await make_agent()
    spec = agent.parse(
        {"plugins": {"niceplug.Late": {}, "niceplug.Niceness": 7, "niceplug.Early": {}}}
    )
    ctx = await agent.get_or_create(spec, "h")
    assert ctx.env_vars["ORDER"] == "early,niceness,late,"
    assert ctx.env_vars["WHO"] == "late"
    assert ctx.command_prefix == ("nice", "-n", "7")
