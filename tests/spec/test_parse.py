from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.errors import PluginNotFound, SpecError
from jupyter_runtimeenv.spec import RuntimeEnvSpec, merge, parse

VALID: list[dict[str, Any]] = [
    {},
    {"env_vars": {}},
    {"env_vars": {"A": "1", "B_2": ""}},
    {"env_vars": {"PATH": "/opt/bin:${PATH}"}},
    {"py_executable": sys.executable},
    {"py_executable": "python3"},
    {"driver_sys_path": True},
    {"driver_sys_path": False},
    {"driver_sys_path": ["/tmp", "/usr"]},
    {"excludes": ["*.csv", "data/"]},
    {"config": {"setup_timeout_seconds": 30}},
    {"config": {"setup_timeout_seconds": -1, "eager_install": False}},
    {"config": {"installer": "pip", "isolated": True}},
    {"env_vars": None},
]

INVALID: list[tuple[Any, str, str]] = [
    # (spec, expected field path, a word of the reason)
    ({"env_vars": {"A": 1}}, "env_vars.A", "expected a string, got int"),
    ({"env_vars": {"A": None}}, "env_vars.A", "got null"),
    ({"env_vars": {"A": ["x"]}}, "env_vars.A", "got list"),
    ({"env_vars": {"A": True}}, "env_vars.A", "got bool"),
    ({"env_vars": {"1A": "x"}}, "env_vars.1A", "variable name"),
    ({"env_vars": {"A-B": "x"}}, "env_vars.A-B", "variable name"),
    ({"env_vars": {"": "x"}}, "env_vars.''", "variable name"),
    ({"env_vars": {"A": "x\0y"}}, "env_vars.A", "NUL"),
    ({"env_vars": ["A=1"]}, "env_vars", "mapping"),
    ({"env_vars": "A=1"}, "env_vars", "mapping"),
    ({"py_executable": 3}, "py_executable", "path or a command"),
    ({"py_executable": ""}, "py_executable", "path or a command"),
    ({"py_executable": "/no/such/python"}, "py_executable", "not an executable"),
    ({"py_executable": "no-such-python-xyz"}, "py_executable", "not an executable"),
    ({"driver_sys_path": "yes"}, "driver_sys_path", "true, false or a list"),
    ({"driver_sys_path": 1}, "driver_sys_path", "true, false or a list"),
    ({"driver_sys_path": ["/tmp", 3]}, "driver_sys_path.1", "path string"),
    ({"excludes": "*.csv"}, "excludes", "list"),
    ({"excludes": ["ok", ""]}, "excludes.1", "non-empty"),
    ({"excludes": [None]}, "excludes.0", "non-empty"),
    ({"config": []}, "config", "mapping"),
    ({"config": {"setup_timeout": 3}}, "config.setup_timeout", "unknown config key"),
    ({"config": {"setup_timeout_seconds": "10"}}, "config.setup_timeout_seconds", "number"),
    ({"config": {"setup_timeout_seconds": 0}}, "config.setup_timeout_seconds", "positive"),
    ({"config": {"setup_timeout_seconds": -5}}, "config.setup_timeout_seconds", "positive"),
    ({"config": {"setup_timeout_seconds": True}}, "config.setup_timeout_seconds", "number"),
    ({"config": {"eager_install": "yes"}}, "config.eager_install", "true or false"),
    ({"config": {"isolated": 1}}, "config.isolated", "true or false"),
    ({"config": {"installer": "conda"}}, "config.installer", "'uv' or 'pip'"),
    ({"envvars": {"A": "1"}}, "envvars", "did you mean 'env_vars'"),
    ({"no_such_field": 1}, "no_such_field", "unknown field"),
    ({"plugins": ["x"]}, "plugins", "mapping of import paths"),
    ({"plugins": {"nodots": {}}}, "plugins.nodots", "import path"),
    (
        {"plugins": {"no_such_module_xyz.Plugin": {}}},
        "plugins.no_such_module_xyz.Plugin",
        "cannot import",
    ),
    ({"plugins": {"json.NoSuchClass": {}}}, "plugins.json.NoSuchClass", "has no 'NoSuchClass'"),
    ({"plugins": {"json.JSONDecoder": {}}}, "plugins.json.JSONDecoder", "not a RuntimeEnvPlugin"),
    (["env_vars"], "", "expected a mapping"),
    (42, "", "expected a mapping"),
]


@pytest.mark.parametrize("data", VALID)
def test_valid_specs_parse_and_round_trip(data: dict[str, Any]) -> None:
    spec = parse(data)
    assert isinstance(spec, RuntimeEnvSpec)
    assert len(spec.env_id) == 64
    again = parse(spec.to_json())
    assert again == spec
    assert again.env_id == spec.env_id


def test_there_are_at_least_thirty_invalid_cases() -> None:
    assert len(INVALID) >= 30


@pytest.mark.parametrize(("data", "field", "reason"), INVALID)
def test_invalid_specs_name_the_field(data: Any, field: str, reason: str) -> None:
    with pytest.raises(SpecError) as info:
        parse(data)
    assert info.value.field == field
    assert reason in info.value.reason
    assert str(info.value).startswith(f"{field}: " if field else reason[:5])


def test_unknown_field_lists_known_fields() -> None:
    with pytest.raises(SpecError) as info:
        parse({"nope": 1})
    for known in ("env_vars", "config", "excludes", "driver_sys_path", "py_executable"):
        assert known in info.value.reason
    assert "jupyter_runtimeenv.plugins" in info.value.reason


def test_plugin_not_found_is_a_spec_error() -> None:
    with pytest.raises(PluginNotFound) as info:
        parse({"plugins": {"no_such_module_xyz.Plugin": {}}})
    assert "ModuleNotFoundError" in info.value.reason


def test_config_does_not_change_env_id_but_isolated_does() -> None:
    base = parse({"env_vars": {"A": "1"}})
    assert (
        parse({"env_vars": {"A": "1"}, "config": {"setup_timeout_seconds": 5}}).env_id
        == base.env_id
    )
    assert parse({"env_vars": {"A": "1"}, "config": {"installer": "pip"}}).env_id == base.env_id
    assert parse({"env_vars": {"A": "1"}, "config": {"isolated": True}}).env_id != base.env_id


def test_canonical_form_is_order_independent() -> None:
    a = parse({"env_vars": {"A": "1", "B": "2"}, "excludes": ["x"]})
    b = parse({"excludes": ["x"], "env_vars": {"B": "2", "A": "1"}})
    assert a.canonical_json() == b.canonical_json()
    assert a.env_id == b.env_id
    assert parse({"env_vars": {"A": "2"}}).env_id != parse({"env_vars": {"A": "1"}}).env_id


def test_config_values_are_typed() -> None:
    spec = parse({"config": {"setup_timeout_seconds": -1, "installer": "pip"}})
    assert spec.config.setup_timeout_seconds is None
    assert spec.config.installer == "pip"
    assert spec.config.eager_install is True
    assert parse({}).config.setup_timeout_seconds == 600.0


def test_spec_is_frozen() -> None:
    spec = parse({"env_vars": {"A": "1"}})
    with pytest.raises(AttributeError):
        spec.env_id = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.fields["env_vars"] = {}  # type: ignore[index]


def test_yaml_file_with_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    path = tmp_path / "env.yaml"
    path.write_text("env_vars:\n  A: '1'\ndriver_sys_path:\n  - src\n")
    spec = parse(path)
    assert spec.env_vars == {"A": "1"}
    assert spec.driver_sys_path == [str(tmp_path / "src")]
    assert parse(str(path)) == spec


def test_json_file(tmp_path: Path) -> None:
    path = tmp_path / "env.json"
    path.write_text(json.dumps({"env_vars": {"A": "1"}}))
    assert parse(path).env_vars == {"A": "1"}


@pytest.mark.parametrize(
    ("name", "text", "reason"),
    [
        ("bad.yaml", "env_vars: [unclosed", "not valid YAML"),
        ("bad.json", "{nope", "not valid JSON"),
        ("list.yaml", "- a\n- b\n", "must hold a mapping"),
    ],
)
def test_bad_files_name_the_file(tmp_path: Path, name: str, text: str, reason: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        parse(path)
    assert reason in str(info.value)
    assert name in str(info.value)


def test_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"missing\.yaml"):
        parse(tmp_path / "missing.yaml")


def test_empty_file_is_the_empty_spec(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert parse(path).is_empty()


def test_merge_overrides_key_by_key_and_env_vars_per_variable() -> None:
    base = {"env_vars": {"A": "1", "B": "2"}, "driver_sys_path": False, "excludes": ["a"]}
    merged = merge(base, {"env_vars": {"B": "3", "C": "4"}, "excludes": ["b"]})
    assert merged.env_vars == {"A": "1", "B": "3", "C": "4"}
    assert merged.excludes == ["b"]
    assert merged.driver_sys_path is False


def test_merge_config_per_key_and_none_removes() -> None:
    base = parse(
        {"env_vars": {"A": "1"}, "config": {"installer": "pip", "setup_timeout_seconds": 9}}
    )
    merged = merge(base, {"config": {"setup_timeout_seconds": 5}, "env_vars": None})
    assert merged.config.installer == "pip"
    assert merged.config.setup_timeout_seconds == 5
    assert "env_vars" not in merged


def test_merge_with_nothing_is_identity() -> None:
    base = parse({"env_vars": {"A": "1"}})
    assert merge(base, None) == base
    assert merge(None, base) == base
