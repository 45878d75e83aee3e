"""The Jupyter server stopped and started again (same port, same root) while a notebook that
runs a task in a worker is open, in JupyterLab and in Notebook 7, in headless Chromium.

While the server is down the sidebar says it does not answer and since when, shows its last
rows greyed as what the server said last (``was busy``, a task's time no longer counting)
with their buttons disabled, never as live rows; when it is back the panel follows it again
(the kernel and its workers died with the old server: the env is in the cache), and the
notebook's cell runs again on a new kernel. A notebook saved while its build widget was live
(the server stopped mid-build) opens after the restart with one line saying what became of
that build, not "model not found". Screenshots: ``tests/lab/screenshots/restart-*``.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from labserver import NAP_CELL, Lab, Page, needs_browser, notebook

from tests.server.plugins import SCRIPT

pytestmark = needs_browser()

CELLS = [
    "%load_ext jupyter_runtimeenv",
    "%runtime_env --env-var MODE=restart --no-widget",
    NAP_CELL,
]


@pytest.mark.parametrize("app", ["lab", "notebook7"])
def test_the_sidebar_says_the_server_does_not_answer_and_follows_it_when_back(
    app: str, lab_factory: Callable[..., Lab], new_page: Callable[[str], Page]
) -> None:
    from playwright.sync_api import expect

    lab = lab_factory()
    (lab.root / "demo.ipynb").write_text(notebook(CELLS))
    view = new_page(f"restart-{app}")
    page = view.page
    view.open_in(app, lab, "demo.ipynb")
    view.command("runtimeenv:open-panel")
    panel = page.locator("#jupyter-runtimeenv-panel")
    expect(panel.locator(".jp-RuntimeEnv-live")).to_have_text("live", timeout=20_000)
    view.command("notebook:run-all-cells", wait=False)
    outputs = page.locator(".jp-OutputArea-output")
    expect(outputs.filter(has_text="first 0")).to_have_count(1, timeout=180_000)
    group = panel.locator('.jp-RuntimeEnv-group[data-group="demo.ipynb"]')
    busy = group.locator(".jp-RuntimeEnv-worker").filter(has_text="nap")
    expect(busy.locator(".jp-RuntimeEnv-workerState")).to_have_text("busy", timeout=30_000)
    view.command("docmanager:save")

    lab.stop()
    live = panel.locator(".jp-RuntimeEnv-live")
    expect(live).to_have_text("offline", timeout=30_000)
    expect(panel.locator(".jp-RuntimeEnv-unreachable")).to_contain_text(
        "The Jupyter server does not answer since"
    )
    expect(panel.locator(".jp-RuntimeEnv-list")).to_have_class("jp-RuntimeEnv-list jp-mod-stale")
    # Its last word, not a live row: "was busy", the task's time stopped, Stop and GC off.
    expect(busy.locator(".jp-RuntimeEnv-workerState")).to_have_text("was busy")
    expect(busy.get_by_role("button", name="Stop")).to_be_disabled()
    expect(panel.locator(".jp-RuntimeEnv-gc")).to_be_disabled()
    task = busy.locator(".jp-RuntimeEnv-task").inner_text()
    page.wait_for_timeout(2500)
    assert busy.locator(".jp-RuntimeEnv-task").inner_text() == task
    view.shot("01-server-down", panel)

    again = lab_factory(restart_of=lab)
    expect(live).to_have_text("live", timeout=60_000)
    expect(panel.locator(".jp-RuntimeEnv-unreachable")).to_have_count(0)
    expect(panel.locator(".jp-RuntimeEnv-list")).to_have_class("jp-RuntimeEnv-list")
    # The kernel and its workers ended with the old server; the env stays in the cache.
    expect(group).to_have_count(0, timeout=30_000)
    cache = panel.locator('.jp-RuntimeEnv-group[data-group="cache"]')
    expect(cache).to_contain_text("env_vars: 1")
    view.shot("02-server-back", panel)

    # The notebook runs again on a new kernel (the old one died with the server). The page
    # may keep asking for the old session ("Session not found": Notebook 7 always, JupyterLab
    # at times) until it is reloaded: their own doing, so the user reloads it.
    view.open_in(app, again, "demo.ipynb")
    view.command("notebook:clear-all-cell-outputs")
    view.command("runtimeenv:open-panel")
    expect(panel.locator(".jp-RuntimeEnv-live")).to_have_text("live", timeout=20_000)
    view.command("notebook:run-all-cells", wait=False)
    expect(outputs.filter(has_text="first 0")).to_have_count(1, timeout=180_000)
    (kernel,) = again.request("GET", "api/sessions")
    assert kernel["path"] == "demo.ipynb"
    expect(panel.locator('.jp-RuntimeEnv-group[data-group="demo.ipynb"]')).to_have_count(
        1, timeout=30_000
    )
    view.shot("03-ran-again")
    assert not view.own_errors(), view.own_errors()


@pytest.mark.parametrize("app", ["lab", "notebook7"])
def test_a_build_widget_saved_mid_build_says_what_became_of_it_after_a_restart(
    app: str, lab_factory: Callable[..., Lab], new_page: Callable[[str], Page]
) -> None:
    from playwright.sync_api import expect

    lab = lab_factory()
    slow = {"plugins": {SCRIPT: {"name": "slow", "lines": 600, "sleep": 0.1}}}
    cells = ["%load_ext jupyter_runtimeenv", f"%%runtime_env\n{json.dumps(slow)}"]
    (lab.root / "demo.ipynb").write_text(notebook(cells))
    view = new_page(f"restart-saved-{app}")
    page = view.page
    view.open_in(app, lab, "demo.ipynb")
    view.command("notebook:run-all-cells", wait=False)
    outputs = page.locator(".jp-OutputArea-output")
    expect(outputs.filter(has_text="script line 3")).to_have_count(1, timeout=120_000)
    view.command("docmanager:save")
    (env,) = lab.api("GET", "envs")["envs"]
    saved = json.loads((lab.root / "demo.ipynb").read_text())["cells"][1]["outputs"]
    assert "application/vnd.jupyter.widget-view+json" in saved[0]["data"]  # saved live
    page.close()
    lab.stop()  # the build is cancelled with the server

    again = lab_factory(restart_of=lab)
    view = new_page(f"restart-saved-{app}-reopened")
    page = view.page
    view.open_in(app, again, "demo.ipynb")
    cell = page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea")
    expect(cell).to_have_text(
        f"runtime env {env['env_id'][:12]} — the kernel that showed it stopped before its"
        " build ended (run the cell again)",
        timeout=60_000,
    )
    expect(page.locator(".jp-Notebook")).not_to_contain_text("model not found")
    view.shot("01-reopened")
    assert not view.own_errors(), view.own_errors()
