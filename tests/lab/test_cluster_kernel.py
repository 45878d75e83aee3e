"""A kernel on a Dask node from JupyterLab's Launcher, in a real ``jupyter lab`` and headless
Chromium (issue 18): the Launcher shows the ``--dask`` kernelspec as ``NAME (cluster)``, a
notebook made from it runs a cell on a node of the cluster (a real scheduler and two
``dask worker`` subprocesses), and its output comes back; the sidebar lists the kernel
under "Kernels on a cluster" with its node and notebook, and a kernel whose env fails to
build there with the failure naming the node. Screenshots:
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
    # Installers on the nodes never reach an index: a missing package fails at once.
    offline = {"UV_NO_INDEX": "1", "UV_OFFLINE": "1", "PIP_NO_INDEX": "1"}
    cluster = DaskNodes(tmp_path / "cluster", env=offline)
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
    install_kernelspec("broken", {"pip": ["no-such-package-here==1.0"]}, dask=nodes.address)
    lab = lab_factory()
    ui = new_page("cluster")
    page = ui.page
    page.goto(f"{lab.url}lab?token={lab.token}")
    page.locator(".jp-LabShell").wait_for(timeout=90_000)
    page.wait_for_function("() => window.jupyterapp?.commands", timeout=90_000)

    card = page.locator(".jp-LauncherCard", has_text="crunch (cluster)").first
    expect(card).to_be_visible(timeout=60_000)
    ui.shot("01-launcher")

    tab = page.locator('.lm-TabBar-tab[data-id="jupyter-runtimeenv-panel"]')
    tab.click()
    panel = page.locator("#jupyter-runtimeenv-panel")
    expect(panel.locator(".jp-RuntimeEnv-live")).to_have_text("live", timeout=20_000)

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

    kernel = panel.locator(".jp-RuntimeEnv-clusterKernel").first
    expect(kernel).to_have_attribute("data-phase", "running", timeout=30_000)
    expect(kernel).to_contain_text("Untitled.ipynb")
    node = kernel.get_attribute("data-node")
    assert node in nodes.worker_pids()
    expect(kernel.locator(".jp-RuntimeEnv-node")).to_have_text(node)
    ui.shot("03-sidebar-running")

    value, pid = output.inner_text().split()
    assert value == "from-the-cluster"
    assert ancestors(int(pid))[0] in set(nodes.worker_pids().values())
    assert ancestors(int(pid))[0] == nodes.worker_pids()[node]
    kernels = lab.request("GET", "api/kernels")
    assert [k["name"] for k in kernels] == ["crunch"]

    assert not ui.faults(), ui.faults()

    # A kernel whose env cannot be built on the node: the start fails with one line
    # naming the node, in JupyterLab's dialog and in the sidebar (with the installer's tail).
    ui.command("launcher:create")
    page.locator(".jp-LauncherCard", has_text="broken (cluster)").first.click()
    failed = panel.locator('.jp-RuntimeEnv-clusterKernel[data-phase="failed"]')
    expect(failed).to_contain_text(
        "building the kernel's environment failed on Dask worker", timeout=120_000
    )
    expect(failed.locator(".jp-RuntimeEnv-error")).to_contain_text("no-such-package-here")
    assert failed.get_attribute("data-node") in nodes.worker_pids()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("building the kernel's environment failed", timeout=60_000)
    ui.shot("04-failed-start")
    # ipywidgets' JupyterLab manager trips over a session whose kernel never started (its
    # own bug, the same with any kernel that fails to start); nothing else may fail.
    widgets_bug = "Cannot read properties of null (reading 'kernel')"
    assert [e for e in ui.errors if e != widgets_bug] == []
