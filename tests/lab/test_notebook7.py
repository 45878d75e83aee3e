"""The extension in Notebook 7 (the ``notebook`` package's ``/notebooks/`` page, served by the
same server), in headless Chromium: the palette lists the sidebar once (issue 21 item 12: it
listed "Show Runtime Environments" and "Show Runtime environments"), the sidebar opens beside
the notebook and groups its named envs under it, a stopped worker's task says it was stopped
from the sidebar (item 11), the environments are saved to the notebook with their names
(item 3) and the badge shows them. Screenshots: ``tests/lab/screenshots/nb7-*.png``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from labserver import NAP_CELL, Lab, Page, needs_browser, notebook, toast

pytest.importorskip("notebook", minversion="7")
pytestmark = needs_browser()

CELLS = [
    "%load_ext jupyter_runtimeenv",
    "%runtime_env --env-var MODE=nb7 --no-widget",
    "%runtime_env --name slow --env-var SPEED=slow --no-widget",
    NAP_CELL,
    "try:\n"
    "    running.result(timeout=120)\n"
    "except Exception as exc:\n"
    "    print(type(exc).__name__, exc)",
]


def test_notebook7_lists_the_sidebar_once_and_shows_the_notebooks_envs(
    lab: Lab, new_page: Callable[[str], Page]
) -> None:
    from playwright.sync_api import expect

    (lab.root / "nb7.ipynb").write_text(notebook(CELLS))
    view = new_page("nb7")
    page = view.page
    view.open_in("notebook7", lab, "nb7.ipynb")

    # The palette: one entry that shows the sidebar (Notebook 7 lists each side panel).
    view.command("apputils:activate-command-palette")
    search = page.locator(".lm-CommandPalette-input")
    search.fill("Runtime Environments")
    items = page.locator(".lm-CommandPalette-item")
    expect(items.first).to_be_visible(timeout=10_000)
    labels = [t.strip() for t in items.locator(".lm-CommandPalette-itemLabel").all_inner_texts()]
    shows = [t for t in labels if t.lower() == "show runtime environments"]
    assert len(shows) == 1, labels
    view.shot("01-palette")
    items.filter(has_text="Show Runtime Environments").first.click()
    panel = page.locator("#jupyter-runtimeenv-panel")
    expect(panel).to_be_visible(timeout=20_000)
    expect(panel.locator(".jp-RuntimeEnv-live")).to_have_text("live", timeout=20_000)

    for i in range(4):
        view.run_cell(i)
    expect(page.locator(".jp-OutputArea-output").filter(has_text="first 0")).to_have_count(
        1, timeout=180_000
    )
    group = panel.locator('.jp-RuntimeEnv-group[data-group="nb7.ipynb"]')
    names = group.locator(".jp-RuntimeEnv-card .jp-RuntimeEnv-name")
    expect(names).to_have_text(["(default)", "slow"], timeout=60_000)
    worker = group.locator(".jp-RuntimeEnv-worker").filter(has_text="busy")
    expect(worker).to_have_count(1, timeout=60_000)
    expect(worker).to_contain_text("nap")
    view.shot("02-sidebar-light")
    view.theme("JupyterLab Dark")
    view.shot("03-sidebar-dark")
    view.theme("JupyterLab Light")

    # Stop the busy worker: the notebook is told it was stopped from the sidebar.
    pid = worker.get_attribute("data-pid")
    worker.get_by_role("button", name="Stop").click()
    expect(toast(page, f"Stopped worker {pid}")).to_be_visible(timeout=30_000)
    view.run_cell(4)
    said = page.locator(".jp-OutputArea-output").filter(has_text="BrokenWorker")
    expect(said).to_contain_text(f"worker pid {pid} was stopped from the sidebar", timeout=60_000)
    assert "SIGKILL" not in said.inner_text()

    # Save both envs to the notebook; the badge says what it carries.
    view.command("runtimeenv:save-to-notebook")
    path = lab.root / "nb7.ipynb"
    deadline = time.monotonic() + 30
    while "runtime_env" not in json.loads(path.read_text())["metadata"]:
        assert time.monotonic() < deadline, "the metadata was not saved"
        time.sleep(0.2)
    meta = json.loads(path.read_text())["metadata"]["runtime_env"]
    assert meta["spec"] == {"env_vars": {"MODE": "nb7"}}
    assert meta["named"]["slow"]["spec"] == {"env_vars": {"SPEED": "slow"}}
    badge = page.locator(".jp-RuntimeEnv-badge")
    expect(badge).to_contain_text("env: cached (+1 named)", timeout=30_000)
    view.shot("04-saved-badge")
    for kernel in lab.request("GET", "api/kernels"):
        lab.request("DELETE", f"api/kernels/{kernel['id']}")
    assert not view.own_errors(), view.own_errors()
