"""A kernel's Dask cluster in the sidebar (issue 17 item 3, the panel's part), in a real
``jupyter lab`` and headless Chromium: a notebook starts a real ``LocalCluster`` (two worker
processes on 127.0.0.1, each node its own cache root) and runs tasks in a declared env there;
under the notebook's group the sidebar shows the cluster (scheduler, Dask's dashboard link),
both nodes with their cache, the env on each node by its declared name and its workers,
live; Stop on a node's worker goes through the kernel; GC collects the nodes' caches.
Screenshots: ``tests/lab/screenshots/sidebar-cluster-*.png``."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from labserver import Lab, Page, needs_browser, notebook, open_panel, toast

from tests.processes import descendants, wait_gone

pytest.importorskip("distributed")
pytestmark = needs_browser()


def cells(node_root: str) -> list[str]:
    return [
        "%load_ext jupyter_runtimeenv",
        "import distributed, jupyter_runtimeenv as jre\n"
        "from jupyter_runtimeenv.dask import DaskExecutor\n"
        "cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1,"
        " processes=True, host='127.0.0.1', dashboard_address='127.0.0.1:0')\n"
        "client = distributed.Client(cluster)\n"
        f"executor = DaskExecutor(client, node_cache_dir={node_root!r} + '/node-{{name}}')\n"
        "jre.init(executor=executor)",
        "%runtime_env --env-var K=cluster --no-widget",
        "@remote\n"
        "def where(i):\n"
        "    import os\n"
        "    return os.environ['K']\n"
        "print('ran', get([where.remote(i) for i in range(8)]))",
        # The end (run by the test): nothing of the cluster outlives the kernel's cell.
        "from jupyter_runtimeenv import api\n"
        "api.shutdown(); executor.shutdown(); client.close(); cluster.close()\n"
        "print('cluster closed')",
    ]


def test_a_kernels_cluster_shows_its_nodes_envs_and_workers(
    lab: Lab, new_page: Callable[[str], Page]
) -> None:
    from playwright.sync_api import expect

    node_root = lab.root.parent / "nodes"
    node_root.mkdir()
    (lab.root / "dask.ipynb").write_text(notebook(cells(str(node_root))))
    view = new_page("sidebar-cluster")
    page = view.page
    panel = open_panel(view, lab)
    view.open_notebook(lab, "dask.ipynb", goto=False)
    for i in range(4):
        view.page.evaluate(
            "i => { window.jupyterapp.shell.currentWidget.content.activeCellIndex = i; }", i
        )
        view.command("notebook:run-cell-and-select-next", wait=False)
    expect(page.locator(".jp-OutputArea-output").filter(has_text="ran ['cluster'")).to_have_count(
        1, timeout=240_000
    )

    group = panel.locator('.jp-RuntimeEnv-group[data-group="dask.ipynb"]')
    cluster = group.locator(".jp-RuntimeEnv-daskCluster")
    expect(cluster).to_have_count(1, timeout=60_000)
    assert (cluster.get_attribute("data-scheduler") or "").startswith("tcp://127.0.0.1:")
    expect(cluster.locator("a.jp-RuntimeEnv-link")).to_have_attribute(
        "href", re.compile(r"^http://127\.0\.0\.1:\d+/status")
    )
    nodes = cluster.locator(".jp-RuntimeEnv-clusterNode")
    expect(nodes).to_have_count(2, timeout=60_000)
    expect(cluster).to_contain_text("2/2 nodes up")
    # The env on each node, by the name the notebook declared it with, READY.
    for i in range(2):
        env = nodes.nth(i).locator(".jp-RuntimeEnv-nodeEnv")
        expect(env.locator(".jp-RuntimeEnv-name")).to_have_text("(default)", timeout=60_000)
        expect(env.locator(".jp-RuntimeEnv-state")).to_have_text("READY")
    workers = cluster.locator(".jp-RuntimeEnv-worker")
    expect(workers.first).to_be_visible(timeout=60_000)
    view.shot("01-light", panel)
    view.shot("01-light-page")
    view.theme("JupyterLab Dark")
    view.shot("02-dark", panel)

    # Stop a node's worker: through the kernel's executor, then gone from its node.
    worker = workers.first
    pid = worker.get_attribute("data-pid")
    worker.get_by_role("button", name="Stop").click()
    expect(toast(page, f"Stopped worker {pid}")).to_be_visible(timeout=60_000)
    expect(cluster.locator(f'.jp-RuntimeEnv-worker[data-pid="{pid}"]')).to_have_count(
        0, timeout=60_000
    )
    # GC on the cluster's nodes says what it freed there.
    cluster.get_by_role("button", name="GC").click()
    expect(toast(page, re.compile(r"GC on 2 nodes of dask\.ipynb"))).to_be_visible(timeout=60_000)
    view.theme("JupyterLab Light")
    view.shot("03-after-stop-and-gc-light", panel)

    # The cluster closed, then the kernel shut down: no process of either is left.
    started = descendants(lab.proc.pid)
    page.evaluate("() => { window.jupyterapp.shell.currentWidget.content.activeCellIndex = 4; }")
    view.command("notebook:run-cell", wait=False)
    closed = page.locator(".jp-OutputArea-output").filter(has_text="cluster closed")
    expect(closed).to_have_count(1, timeout=120_000)
    for kernel in lab.request("GET", "api/kernels"):
        lab.request("DELETE", f"api/kernels/{kernel['id']}")
    assert wait_gone(started, timeout=60) == []
    assert not view.faults(), view.faults()
