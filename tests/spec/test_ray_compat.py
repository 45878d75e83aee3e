"""Ray's own runtime_env validation cases, ported: Ray's
``python/ray/tests/test_runtime_env_validation.py``,
``python/ray/_private/runtime_env/validation_test.py`` (uv) and the examples of Ray's
"Environment Dependencies" docs (``doc/source/ray-core/handling-dependencies.rst``).

Each valid Ray spec parses here (and normalises as Ray's tests expect where they check it);
each invalid one is refused naming the field. Where this project deliberately differs, the
case says why in one line (``DIFFERS``). Remote URIs that need a store to answer (``s3://``
with a real object) are covered against moto's server in ``tests/plugins/test_remote.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from jupyter_runtimeenv.errors import SpecError
from jupyter_runtimeenv.spec import parse

CONDA_DICT = {"dependencies": ["pip", {"pip": ["pip-install-test==0.5"]}]}
PIP_LIST = ["requests==1.0.0", "pip-install-test"]


@pytest.fixture(autouse=True)
def ray_test_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Ray's ``test_directory`` fixture: the files its cases name, the cwd at their parent."""
    subdir = tmp_path / "subdir"
    subdir.mkdir()
    (subdir / "requirements.txt").write_text("\n".join(PIP_LIST) + "\n")
    (subdir / "good_conda_env.yaml").write_text(yaml.safe_dump(CONDA_DICT))
    (subdir / "bad_conda_env.yaml").write_text("% this is not a YAML file %\n")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    return subdir


# (Ray spec, what the parsed field must be (None: not checked), note)
VALID: list[tuple[dict[str, Any], Any, str]] = [
    # test_runtime_env_validation.py
    ({"pip": None}, {}, "test_key_with_value_none: a null field is absent"),
    ({"excludes": []}, {}, "test_validate_excludes_empty_list"),
    ({}, {}, "test_empty"),
    ({"conda": "my_env_name"}, "my_env_name", "test_validate_conda_str"),
    ({"conda": "subdir/good_conda_env.yaml"}, CONDA_DICT, "test_validate_conda_valid_file"),
    ({"conda": CONDA_DICT}, CONDA_DICT, "test_validate_conda_valid_dict"),
    (
        {"pip": "subdir/requirements.txt"},
        {"packages": sorted(PIP_LIST), "install_options": [], "pip_check": False},
        "test_validate_pip_valid_file; DIFFERS: sorted, so equal requests share a venv",
    ),
    (
        {"pip": PIP_LIST},
        {"packages": sorted(PIP_LIST), "install_options": [], "pip_check": False},
        "test_validate_pip_valid_list (sorted, as above)",
    ),
    ({"pip": ["pkg1", "ray", "pkg2"]}, None, "test_validate_ray: ray is just a package here"),
    ({"env_vars": {"hi1": "hi1", "hi2": "hi2"}}, {"hi1": "hi1", "hi2": "hi2"}, "serialization"),
    (
        {"working_dir": "https://some_domain.com/path/file.zip"},
        "https://some_domain.com/path/file.zip",
        "test_validate_remote_valid_input (https: no request at parse time)",
    ),
    (
        {"py_modules": ["https://some_domain.com/path/file.zip"]},
        ["https://some_domain.com/path/file.zip"],
        "test_validate_remote_valid_input",
    ),
    # validation_test.py (uv)
    (
        {"uv": {"packages": ["tensorflow"]}},
        {"packages": ["tensorflow"], "install_options": [], "pip_check": False},
        "test_parse_and_validate_uv",
    ),
    (
        {"uv": {"packages": ["tensorflow", "tensorflow"]}},
        {"packages": ["tensorflow"], "install_options": [], "pip_check": False},
        "uv: duplicates removed",
    ),
    (
        {"uv": ["requests==1.0.0", "aiohttp", "ray[serve]"]},
        {
            "packages": ["aiohttp", "ray[serve]", "requests==1.0.0"],
            "install_options": [],
            "pip_check": False,
        },
        "uv as a list (sorted)",
    ),
    (
        {"uv": "subdir/requirements.txt"},
        None,
        "DIFFERS from the old uv test (TypeError): newer Ray takes a requirements file for uv",
    ),
    # handling-dependencies.rst
    ({"working_dir": "app", "pip": ["emoji"]}, None, "docs: working_dir + pip"),
    ({"pip": ["requests", "chess"]}, None, "docs"),
    ({"env_vars": {"OMP_NUM_THREADS": "32", "TF_WARNINGS": "none"}}, None, "docs"),
    (
        {"conda": {"dependencies": ["pytorch", "pip", {"pip": ["requests", "ray[serve]"]}]}},
        None,
        "docs: conda with pip inside",
    ),
    (
        {
            "pip": {
                "packages": ["tensorflow", "requests"],
                "pip_check": False,
                "pip_version": "==22.0.2;python_version=='3.8.11'",
            }
        },
        {
            "packages": ['pip==22.0.2; python_version == "3.8.11"', "requests", "tensorflow"],
            "install_options": [],
            "pip_check": False,
        },
        "docs: pip_version installs that pip into the venv, as Ray does",
    ),
    (
        {"pip": {"packages": ["emoji"], "pip_install_options": ["--no-cache-dir"]}},
        {"packages": ["emoji"], "install_options": ["--no-cache-dir"], "pip_check": False},
        "pip_install_options is Ray's name for install_options",
    ),
    (
        {"uv": {"packages": ["emoji"], "uv_version": "==0.4.0", "uv_check": True}},
        {"packages": ["emoji"], "install_options": [], "pip_check": True, "uv_version": "==0.4.0"},
        "docs: uv keys; uv_version is recorded, the uv shipped with this package installs",
    ),
    (
        {"uv": {"packages": ["emoji"], "uv_pip_install_options": ["--no-cache"]}},
        {"packages": ["emoji"], "install_options": ["--no-cache"], "pip_check": False},
        "uv_pip_install_options",
    ),
    ({"py_executable": f"{sys.executable} -X utf8"}, None, "py_executable with arguments"),
    ({"worker_process_setup_hook": "logging.basicConfig"}, "logging.basicConfig", "docs"),
    ({"config": {"setup_timeout_seconds": 10}}, None, "docs: RuntimeEnvConfig"),
    ({"config": {"setup_timeout_seconds": 600.0}}, None, "a whole float: our normal form"),
    ({"working_dir": "https://host.example/app.tar.gz?v=2"}, None, "an archive URL with a query"),
    ({"config": {"setup_timeout_seconds": -1, "eager_install": False}}, None, "docs"),
    ({"config": {"log_files": ["/tmp/ray/session_latest/logs/x.log"]}}, None, "log_files"),
    (
        {"pip": ["emoji"], "_ray_commit": "abc", "_inject_current_ray": False},
        None,
        "Ray's bookkeeping fields in a serialised spec are dropped",
    ),
]


@pytest.mark.parametrize(("data", "expected", "note"), VALID, ids=[v[2][:40] for v in VALID])
def test_valid_ray_specs_parse(data: dict[str, Any], expected: Any, note: str) -> None:
    spec = parse(data)
    assert parse(spec.to_json()).env_id == spec.env_id  # the normal form parses to itself
    fields = [k for k in data if not k.startswith("_") and k != "config"]
    if expected is None:
        return
    if expected == {}:
        assert spec.is_empty()
        assert spec.env_id == parse({}).env_id
        return
    name = {"uv": "pip"}.get(fields[0], fields[0])
    assert spec.get(name) == expected


def test_key_order_does_not_matter_like_ray_serialization() -> None:
    one = parse({"pip": ["requests"], "env_vars": {"hi1": "hi1", "hi2": "hi2"}})
    two = parse({"env_vars": {"hi2": "hi2", "hi1": "hi1"}, "pip": ["requests"]})
    assert one.env_id == two.env_id
    assert parse(one.to_json()).env_id == one.env_id


@pytest.mark.parametrize(
    "data",
    [
        {"pip": []},
        {"pip": {"packages": []}},
        {"uv": []},
        {"env_vars": {}},
        {"excludes": []},
        {"py_modules": []},
        {"pip": [], "env_vars": {}, "excludes": [], "py_modules": [], "conda": None},
    ],
)
def test_empty_values_normalise_away(data: dict[str, Any]) -> None:
    spec = parse(data)
    assert spec.is_empty()
    assert spec.env_id == parse({}).env_id


# (Ray spec, field named, a word of the reason, note)
INVALID: list[tuple[Any, str, str, str]] = [
    ({"working_dir": "unknown://abc"}, "working_dir", "archive", "test_validate_bad_uri"),
    ({"working_dir": 1}, "working_dir", "expected", "test_validate_invalid_type"),
    ({"working_dir": "s3://bucket/file"}, "working_dir", "archive", "remote invalid extension"),
    ({"working_dir": "gs://bucket/file"}, "working_dir", "archive", "remote invalid extension"),
    ({"py_modules": "."}, "py_modules", "list", "test_validate_not_a_list"),
    ({"py_modules": ["unknown://abc"]}, "py_modules.0", "archive", "test_validate_bad_uri"),
    ({"py_modules": [1]}, "py_modules.0", "expected", "test_validate_invalid_type"),
    ({"py_modules": ["s3://bucket/file"]}, "py_modules.0", "archive", "remote invalid ext"),
    ({"excludes": 1}, "excludes", "list", "test_validate_excludes_invalid_types"),
    ({"excludes": True}, "excludes", "list", "excludes bool"),
    ({"excludes": "string"}, "excludes", "list", "excludes str"),
    ({"excludes": ["string", 1]}, "excludes.1", "pattern", "excludes item"),
    ({"conda": 1}, "conda", "expected", "test_validate_conda_invalid_types"),
    ({"conda": True}, "conda", "expected", "conda bool"),
    ({"conda": "../bad_path.yaml"}, "conda", "cannot read", "test_validate_conda_invalid_path"),
    ({"conda": "subdir/bad_conda_env.yaml"}, "conda", "YAML", "invalid conda file"),
    ({"pip": 1}, "pip", "expected", "test_validate_pip_invalid_types"),
    ({"pip": True}, "pip", "expected", "pip bool"),
    ({"pip": "../bad_path.txt"}, "pip", "cannot read", "test_validate_pip_invalid_path"),
    ({"env_vars": {"INT_ENV": 1}}, "env_vars.INT_ENV", "string", "test_type_validation"),
    ({"env_vars": {1: "hi"}}, "env_vars.1", "variable name", "env_vars key"),
    ({"pip": ["requests"], "conda": "env_name"}, "pip", "cannot be combined", "pip+conda"),
    ({"uv": ["requests"], "conda": "env_name"}, "", "cannot be combined", "uv+conda"),
    ({"uv": ["requests"], "pip": ["requests"]}, "", "same field", "uv+pip conflict, as Ray"),
    ({"uv": {"random_key": "random_value"}}, "uv.random_key", "unknown key", "uv keys"),
    ({"pip": {"packages": ["a"], "pip_check": "yes"}}, "pip.pip_check", "true or false", ""),
    ({"pip": {"packages": ["a"], "pip_version": 22}}, "pip.pip_version", "version", ""),
    ({"pip": {"packages": 3}}, "pip.packages", "list", "packages of the wrong type"),
    (
        {"pip": {"packages": ["a"], "pip_version": "22", "uv_version": "0.4"}},
        "pip",
        "mixes",
        "DIFFERS: pip and uv are one field here, so either takes Ray's keys, but not mixed",
    ),
    (
        {"pip": {"packages": ["a"], "install_options": [], "pip_install_options": []}},
        "pip.pip_install_options",
        "give one",
        "",
    ),
    ({"config": {"setup_timeout_seconds": "10"}}, "config.setup_timeout_seconds", "number", ""),
    ({"config": {"setup_timeout_seconds": 0}}, "config.setup_timeout_seconds", "positive", ""),
    ({"config": {"eager_install": "x"}}, "config.eager_install", "true or false", ""),
    ({"config": {"log_files": "x.log"}}, "config.log_files", "list", ""),
    ({"py_executable": "no-such-exe-xyz run python"}, "py_executable", "not an executable", ""),
    ({"py_executable": "python3 'unclosed"}, "py_executable", "split", ""),
    (
        {"worker_process_setup_hook": "not an import path"},
        "worker_process_setup_hook",
        "import",
        "",
    ),
    ({"worker_process_setup_hook": 3}, "worker_process_setup_hook", "callable", ""),
    # Ray-only features: one line saying so, not "unknown field".
    ({"container": {"image": "anyscale/ray-ml"}}, "container", "a Ray feature", ""),
    ({"image_uri": "rayproject/ray:2.9.0"}, "image_uri", "a Ray feature", ""),
    ({"java_jars": ["a.jar"]}, "java_jars", "a Ray feature", ""),
    ({"_nsight": "default"}, "_nsight", "a Ray feature", ""),
    ({"mpi": {"args": ["-n", "2"]}}, "mpi", "a Ray feature", ""),
    ({"working_dir": "gcs://_ray_pkg_abc.zip"}, "working_dir", "a Ray feature", "Ray's GCS"),
    # Ray refuses these at parse time; they used to be taken here and to fail later, or never
    # (issue 21 item 13: Ray's validation.py and RuntimeEnvConfig, field by field).
    ({"pip": {"pip_check": True}}, "pip", "must include 'packages'", "dict without packages"),
    ({"uv": {"uv_check": True}}, "uv", "must include 'packages'", "dict without packages"),
    ({"uv": {"packages": "subdir/requirements.txt"}}, "uv.packages", "list", "uv.packages: list"),
    ({"uv": {"packages": ["a"], "pip_version": "==22"}}, "uv.pip_version", "'pip' field", ""),
    ({"uv": {"packages": ["a"], "pip_install_options": []}}, "uv.pip_install_options", "'pip'", ""),
    ({"pip": {"packages": ["a"], "uv_check": True}}, "pip.uv_check", "'uv' field", ""),
    (
        {"pip": {"packages": ["a"], "uv_pip_install_options": []}},
        "pip.uv_pip_install_options",
        "'uv' field",
        "",
    ),
    (
        {"config": {"setup_timeout_seconds": 1.5}},
        "config.setup_timeout_seconds",
        "whole number",
        "Ray's RuntimeEnvConfig: an int (600.0, our normal form, is whole)",
    ),
    ({"py_executable": "uv run"}, "py_executable", "uv run", "Ray >= 2.47 refuses a bare uv run"),
    ({"py_executable": "/usr/local/bin/uv run"}, "py_executable", "uv run", "with a path"),
    ({"conda": "/no/such/conda/prefix"}, "conda", "directory", "an absolute prefix must exist"),
    ({"working_dir": "https://host.example/code"}, "working_dir", "archive", "http: an archive"),
    ({"py_modules": ["https://host.example/pkg"]}, "py_modules.0", "archive", "http: archive"),
    (
        {"some_plugin_field": {}},
        "some_plugin_field",
        "unknown field",
        "DIFFERS: Ray warns and ignores unknown fields; we refuse them so typos are caught",
    ),
]


@pytest.mark.parametrize(("data", "field", "words", "note"), INVALID)
def test_invalid_ray_specs_are_refused_naming_the_field(
    data: Any, field: str, words: str, note: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse(data)
    if field:
        assert info.value.field == field
    else:
        assert info.value.field in data
    assert words in info.value.reason
    assert "\n" not in str(info.value)


def test_py_modules_takes_imported_modules_as_ray_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    (tmp_path / "raypkg").mkdir()
    (tmp_path / "raypkg" / "__init__.py").write_text("X = 1\n")
    (tmp_path / "raysingle.py").write_text("Y = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    package = importlib.import_module("raypkg")
    single = importlib.import_module("raysingle")
    spec = parse({"py_modules": [package, single]})
    assert spec.get("py_modules") == [str(tmp_path / "raypkg"), str(tmp_path / "raysingle.py")]
    with pytest.raises(SpecError) as info:
        parse({"py_modules": [sys]})
    assert info.value.field == "py_modules.0"
    assert "no file to ship" in info.value.reason
