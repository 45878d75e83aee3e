"""``notebook_meta``: a kernel's spec as a notebook's ``metadata.runtime_env``, and back."""

from __future__ import annotations

import json
from pathlib import Path

from jupyter_runtimeenv import parse
from jupyter_runtimeenv.notebook_meta import relative_spec
from jupyter_runtimeenv.spec.paths import base_dir


def test_paths_under_the_root_become_relative_to_the_notebook(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "proj" / "data").mkdir(parents=True)
    (root / "lib").mkdir()
    spec = parse(
        {
            "working_dir": str(root / "proj" / "data"),
            "py_modules": [str(root / "lib"), str(tmp_path)],
            "env_vars": {"A": "/not/a/path/under/root"},
            "driver_python": "/usr/bin/python3",
            "driver_sys_path": [str(root / "proj")],
        }
    ).to_json()
    out = relative_spec(spec, str(root / "proj"), str(root))
    assert out == {
        "working_dir": "data",
        "py_modules": ["../lib", str(tmp_path)],  # outside the root: stays absolute
        "env_vars": {"A": "/not/a/path/under/root"},
    }
    json.dumps(out)  # plain JSON
    # Read back against the notebook's directory: the same env as the kernel's, minus driver
    # fields.
    with base_dir(str(root / "proj")):
        again = parse(out)
    assert again.to_json()["working_dir"] == str(root / "proj" / "data")


def test_a_non_default_config_is_kept(tmp_path: Path) -> None:
    spec = parse({"env_vars": {"A": "1"}, "config": {"installer": "pip"}}).to_json()
    out = relative_spec(spec, str(tmp_path), str(tmp_path))
    assert out["config"]["installer"] == "pip"
