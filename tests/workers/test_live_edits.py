"""Issue 20 item 8: an edit to a module of the working_dir (or py_modules) is seen by the
next call, as modules in sys.path folders are; an unchanged tree costs no rebuild and no new
worker. And issue 19 item 2: a merge never walks a tree whose field did not change."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.client import EmbeddedClient
from jupyter_runtimeenv.plugins import _hashing
from jupyter_runtimeenv.spec import merge, parse, refresh
from jupyter_runtimeenv.workers.executor import LocalExecutor


def helper_value() -> tuple[int, int]:
    import helper

    return helper.VALUE, os.getpid()


def mod_value() -> int:
    import extra_mod

    return int(extra_mod.VALUE)


def call(function: Any, env: Any = None) -> Any:
    remote = jre.remote(function)
    return (remote.options(runtime_env=env) if env else remote).remote().result(120)


def builds(client: EmbeddedClient) -> int:
    return len(client._thread.run(client.agent.status()))


def test_the_next_call_sees_an_edit_and_an_unchanged_tree_costs_nothing(
    agent_executor: LocalExecutor, client: EmbeddedClient, tmp_path: Path
) -> None:
    src = tmp_path / "project"
    src.mkdir()
    (src / "helper.py").write_text("VALUE = 1\n")
    (src / "data.csv").write_text("a,b\n")
    jre.init(runtime_env={"working_dir": str(src)}, executor=agent_executor)

    value, first_pid = call(helper_value)
    assert value == 1
    envs = builds(client)
    assert call(helper_value) == (1, first_pid)  # same worker
    assert builds(client) == envs  # no rebuild

    (src / "helper.py").write_text("VALUE = 2\n")  # no %runtime_env, no reload
    value, pid = call(helper_value)
    assert value == 2
    assert pid != first_pid  # the worker with the old module is not reused
    assert builds(client) == envs + 1
    assert call(helper_value) == (2, pid)  # and stays


def test_py_modules_edits_are_seen_too(agent_executor: LocalExecutor, tmp_path: Path) -> None:
    module = tmp_path / "extra_mod.py"
    module.write_text("VALUE = 10\n")
    env = {"py_modules": [str(module)]}
    assert call(mod_value, env) == 10
    module.write_text("VALUE = 11\n")
    assert call(mod_value, env) == 11


def test_a_deleted_working_dir_keeps_the_env_it_was_declared_with(
    agent_executor: LocalExecutor, tmp_path: Path
) -> None:
    """A driver may delete a directory it has shipped: refresh keeps the identity."""
    src = tmp_path / "gone"
    src.mkdir()
    (src / "helper.py").write_text("VALUE = 7\n")
    spec = parse({"working_dir": str(src)})
    assert call(helper_value, spec)[0] == 7
    (src / "helper.py").unlink()
    src.rmdir()
    assert refresh(spec) is spec
    assert call(helper_value, spec)[0] == 7


def test_a_merge_does_not_walk_an_unchanged_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "project"
    (src / "pkg").mkdir(parents=True)
    for i in range(20):
        (src / "pkg" / f"m{i}.py").write_text(f"X = {i}\n")
    base = parse({"working_dir": str(src), "excludes": ["*.log"]})
    scanned: list[str] = []
    real_scandir = os.scandir

    def counting_scandir(path: Any) -> Any:
        scanned.append(str(path))
        return real_scandir(path)

    monkeypatch.setattr(_hashing.os, "scandir", counting_scandir)
    merged = merge(base, {"env_vars": {"A": "1"}})
    assert scanned == []
    assert merged.identity["working_dir"] == base.identity["working_dir"]
    assert merged.env_id == parse({**base.to_json(), "env_vars": {"A": "1"}}).env_id
    # What an identity depends on changed (excludes): walked again.
    merge(base, {"excludes": ["*.tmp"]})
    assert scanned
    # refresh of an unchanged tree: a walk, the same spec object back.
    assert refresh(base) is base
