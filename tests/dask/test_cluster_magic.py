"""``%runtime_env`` on a Dask executor: built on every node at once, a line (or a widget row)
per node, one ``UsageError`` line naming the node and step on failure.

A real IPython shell with the extension, a real ``LocalCluster`` (two worker processes on
127.0.0.1, each node its own cache root), real builds on the nodes. The widget is the real
``ClusterBuildWidget``: outside a kernel its comms send nothing, its trait values are what a
frontend would be sent (as in ``tests/ipython/test_widget.py``).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import distributed
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

import jupyter_runtimeenv as jre
from jupyter_runtimeenv import api, session
from jupyter_runtimeenv.ipython.cluster_build import ClusterBuildWidget, NodeRows
from jupyter_runtimeenv.ipython.magics import RuntimeEnvMagics
from jupyter_runtimeenv.workers.executor import resolve_for_driver
from tests.dask.helpers import node_pids

PLUGIN = "tests.dask._node_plugins.FailOnNode"


@pytest.fixture(scope="module")
def shell() -> InteractiveShell:
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    ip = InteractiveShell.instance(config=config)
    ip.run_line_magic("load_ext", "jupyter_runtimeenv")
    return ip


@pytest.fixture
def on_cluster(make_executor: Any) -> Iterator[Any]:
    executor = make_executor()
    api.init(executor=executor)
    yield executor
    api.shutdown()


def _addresses(executor: Any) -> list[str]:
    return sorted(executor.client.scheduler_info()["workers"])


def test_runtime_env_builds_on_every_node_and_a_task_sees_it_without_the_driver_dir(
    shell: InteractiveShell, on_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "D"
    (work / "sub").mkdir(parents=True)
    (work / "data.txt").write_text("shipped to the nodes\n")
    (work / "sub" / "more.txt").write_text("and this\n")
    shell.run_line_magic(
        "runtime_env", f"--env-var K=V --working-dir {work} --no-widget --no-driver-sys-path"
    )
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    nodes = _addresses(on_cluster)
    for node in nodes:  # one line per node, naming the worker's address
        assert any(line.startswith(f"{node}  READY  env ") for line in lines), out
    assert lines[-1].startswith("runtime env ")
    assert " ready on 2/2 nodes (" in lines[-1]
    spec = api.default_runtime_env()
    assert spec is not None
    assert spec.env_vars == {"K": "V"}

    shutil.rmtree(work)  # the driver's copy is gone: the nodes have their own

    @jre.remote
    def look() -> tuple[str, list[str], str]:
        return os.environ["K"], sorted(os.listdir(".")), open("sub/more.txt").read()

    results = jre.get([look.remote() for _ in range(4)], timeout=120)
    assert {r[0] for r in results} == {"V"}
    assert {tuple(r[1]) for r in results} == {("data.txt", "sub")}
    assert {r[2] for r in results} == {"and this\n"}


def test_prestart_starts_one_worker_per_node(
    shell: InteractiveShell, on_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_line_magic("runtime_env", "--env-var WARM=1 --no-widget")
    capsys.readouterr()
    deadline = time.monotonic() + 60
    while len(pids := node_pids(on_cluster.client)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    report = on_cluster.cluster_report()
    per_node = {
        node["address"]: sum(len(env["workers"]) for env in node["envs"])
        for node in report["nodes"]
    }
    assert per_node == dict.fromkeys(_addresses(on_cluster), 1), (per_node, pids)


def test_a_failure_on_one_node_is_one_line_naming_the_node_and_step(
    shell: InteractiveShell, on_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_line_magic("runtime_env", "--env-var BEFORE=1 --no-widget")
    before = api.default_runtime_env()
    capsys.readouterr()
    body = f"plugins:\n  {PLUGIN}: {{node: node-1, salt: '{time.time()}'}}\n"
    with pytest.raises(UsageError) as info:
        shell.run_cell_magic("runtime_env", "--no-widget", body)
    message = str(info.value)
    assert "\n" not in message
    failing = next(
        node for node, root in on_cluster.client.run(_cache_root_name).items() if root == "node-1"
    )
    assert message.startswith(f"runtime_env: build failed on {failing} at step ")
    assert PLUGIN in message  # the step
    # The log by a command to run there, not a path this machine would link to.
    assert (
        "(this notebook keeps the environment it had; its log: jupyter runtimeenv logs " in message
    )
    assert message.endswith(" on that node)")
    assert api.default_runtime_env() is before
    out = capsys.readouterr().out
    # The failing node's installer lines were shown, prefixed with the node.
    assert f"[{failing.split('://')[1]}]     this node says no" in out, out
    assert any(line.startswith(f"{failing}  FAILED at step ") for line in out.splitlines())


def _cache_root_name(dask_worker: Any) -> str:
    from jupyter_runtimeenv.dask.node_ops import agent_of

    return agent_of(dask_worker).cache_root.name


def test_named_envs_the_cell_form_and_list_show_the_nodes(
    shell: InteractiveShell, on_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_cell_magic("runtime_env", "--name gpu --no-widget", "env_vars: {DEVICE: '0'}\n")
    out = capsys.readouterr().out
    assert " ready on 2/2 nodes (" in out
    assert session.lookup("gpu").env_vars == {"DEVICE": "0"}
    assert api.default_runtime_env() is None  # a named env leaves the default alone
    shell.run_line_magic("runtime_env", "--list")
    listing = capsys.readouterr().out
    gpu = next(line for line in listing.splitlines() if line.startswith("gpu "))
    assert gpu.endswith("READY on 2/2 nodes"), listing

    @jre.remote(runtime_env="gpu")
    def device() -> str:
        return os.environ["DEVICE"]

    assert jre.get(device.remote(), timeout=120) == "0"


def test_background_returns_at_once_and_the_first_task_waits(
    shell: InteractiveShell, on_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_line_magic("runtime_env", "--env-var BG=yes --background --no-widget")
    out = capsys.readouterr().out
    assert "in the background" in out
    assert api.default_runtime_env() is not None

    @jre.remote
    def bg() -> str:
        return os.environ["BG"]

    assert jre.get(bg.remote(), timeout=120) == "yes"


def test_the_widget_shows_a_row_per_node(
    shell: InteractiveShell, on_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = NodeRows()
    widget = ClusterBuildWidget()
    try:
        spec = jre.parse({"env_vars": {"ROWS": "1"}, "driver_sys_path": False})
        result = on_cluster.build_on_nodes(spec, rows)
        widget.show(rows, rows.drain())
        widget.finish(rows, result)
        for node in _addresses(on_cluster):
            assert f"<code>{node}</code>" in widget.table.value
        assert widget.table.value.count(">READY<") == 2
        assert "READY on 2/2 nodes" in widget.header.value
        assert widget.failures.value == ""
        assert widget.text().splitlines()[-1].startswith(f"runtime env {result.env_id[:12]} — ")
    finally:
        widget.close()

    magics = shell.magics_manager.registry[RuntimeEnvMagics.__name__]
    magics.widget = True  # as in a kernel whose frontend shows widgets
    try:
        body = f"plugins:\n  {PLUGIN}: {{node: node-0, salt: 'w{time.time()}'}}\n"
        with pytest.raises(UsageError):
            shell.run_cell_magic("runtime_env", "", body)
        out = capsys.readouterr().out
        # The terminal shows the widget's text/plain form: a line per node, the summary.
        assert "FAILED on 1 of 2 nodes" in out
        assert sum(line.startswith("tcp://127.0.0.1:") for line in out.splitlines()) == 2
    finally:
        magics.widget = None


def test_a_failing_node_in_the_widget_shows_its_step_and_tail(on_cluster: Any) -> None:
    rows = NodeRows()
    widget = ClusterBuildWidget()
    try:
        spec = jre.parse({"plugins": {PLUGIN: {"node": "node-1", "salt": f"t{time.time()}"}}})
        result = on_cluster.build_on_nodes(spec, rows)
        widget.show(rows, rows.drain())
        widget.finish(rows, result)
        (failed,) = result.failed
        assert failed.step == PLUGIN
        assert list(failed.lines)[-1] == "this node says no"
        assert "FAILED on 1 of 2 nodes" in widget.header.value
        assert f"<code>{failed.address}</code> failed at step" in widget.failures.value
        assert "this node says no" in widget.failures.value
    finally:
        widget.close()


def test_the_summary_the_report_and_the_declared_env_name_one_id(
    shell: InteractiveShell,
    on_cluster: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # An in-process scheduler (a LocalCluster's) puts Dask's scratch space on sys.path: it
    # is not shipped, and the env's id is the same with or without it.
    scratch = tmp_path / "dask-scratch-space" / "scheduler-x"
    scratch.mkdir(parents=True)
    monkeypatch.syspath_prepend(str(scratch))
    shell.run_line_magic("runtime_env", "--env-var SAME=1 --no-widget")
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    declared = api.default_runtime_env()
    assert declared is not None
    env_id = resolve_for_driver(declared).env_id
    assert str(scratch) not in (resolve_for_driver(declared).driver_sys_path or [])
    assert summary.startswith(f"runtime env {env_id[:12]} ready on 2/2 nodes"), summary
    monkeypatch.syspath_prepend(str(tmp_path))  # sys.path changes: the id follows it
    assert resolve_for_driver(declared).env_id != env_id
    monkeypatch.undo()
    report = on_cluster.cluster_report()
    ids = {env["driver_env_id"] for node in report["nodes"] for env in node["envs"]}
    assert env_id in ids, (env_id, report)


def test_a_node_with_nothing_staged_yet_is_reported_up_with_no_envs(make_executor: Any) -> None:
    # A cluster no executor has staged on yet: its workers have no node agent (the plugin is
    # registered with the first env). The kernel's report, which the sidebar shows from
    # the moment the executor is set, said such nodes were "unreachable" with a
    # "plugin missing" error until the first build (the 2026-12-03 CI failure of
    # tests/lab/test_sidebar_cluster.py). Its own in-process cluster: the module's has the
    # plugin since its first test.
    with (
        distributed.LocalCluster(
            n_workers=1, processes=False, protocol="tcp", host="127.0.0.1", dashboard_address=":0"
        ) as fresh,
        distributed.Client(fresh, set_as_default=False) as client,
    ):
        executor = make_executor(client)
        [node] = executor.cluster_report()["nodes"]
        assert node["state"] == "up", node
        assert node["envs"] == []
        assert "error" not in node
        executor.shutdown()
