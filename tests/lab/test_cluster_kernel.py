"""A kernel on a Dask node from JupyterLab's Launcher, in a real ``jupyter lab`` and headless
Chromium (issue 18): the Launcher shows the ``--dask`` kernelspec as ``NAME (cluster)``, a
notebook made from it runs a cell on a node of the cluster (a real scheduler and two
``dask worker`` subprocesses), and its output comes back. Screenshots:
``tests/lab/screenshots/cluster-*.png``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from labserver import Lab, Page, needs_browser
from playwright.sync_api import expect

from jupyter_runtimeenv.kernels import install_kernelspec
from tests.kernels.dask_nodes import DaskNodes, ancestors

pytest.importorskip("distributed")
pytestmark = needs_browser()

CODE = 'import os; print(os.environ["K"], os.getpid())'


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[DaskNodes]:
    (tmp_path / "cluster").mkdir()
    cluster = DaskNodes(tmp_path / "cluster")
    try:
        yield cluster
    finally:
        cluster.stop()


def test_the_launcher_starts_a_cluster_kernel_and_a_cell_runs_on_a_node(
    nodes: DaskNodes,
    lab_factory: Callable[..., Lab],
    new_page: Callable[[str], Page],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The kernelspec goes where the lab server looks for the user's kernels.
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    install_kernelspec("crunch", {"env_vars": {"K": "from-the-cluster"}}, dask=nodes.address)
    lab = lab_factory()
    ui = new_page("cluster")
    page = ui.page
    page.goto(f"{lab.url}lab?token={lab.token}")
    page.locator(".jp-LabShell").wait_for(timeout=90_000)
    page.wait_for_function("() => window.jupyterapp?.commands", timeout=90_000)

    card = page.locator(".jp-LauncherCard", has_text="crunch (cluster)").first
    expect(card).to_be_visible(timeout=60_000)
    ui.shot("01-launcher")

    card.click()
    page.locator(".jp-Notebook").first.wait_for(timeout=60_000)
    expect(page.locator(".jp-Toolbar-kernelName").first).to_contain_text(
        "crunch (cluster)", timeout=60_000
    )
    idle = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
    idle.wait_for(timeout=120_000)

    page.locator(".jp-Cell .cm-content").first.click()
    page.keyboard.type(CODE)
    page.keyboard.press("Shift+Enter")
    output = page.locator(".jp-OutputArea-output").first
    expect(output).to_contain_text("from-the-cluster", timeout=120_000)
    ui.shot("02-cell-output")

    value, pid = output.inner_text().split()
    assert value == "from-the-cluster"
    assert ancestors(int(pid))[0] in set(nodes.worker_pids().values())
    kernels = lab.request("GET", "api/kernels")
    assert [k["name"] for k in kernels] == ["crunch"]
    assert not ui.errors, ui.errors
