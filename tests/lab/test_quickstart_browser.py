"""The README's quickstart notebook (``notebooks/quickstart.ipynb``) run cell by cell in
JupyterLab in headless Chromium, the sidebar open, as a new user runs it (session 14).

Every cell runs without an error; while it runs, the sidebar groups the notebook's two envs
under it by their names, the notebook's path shown whole; its last cell, ``shutdown()`` ("stop
the workers and release their environments"), leaves nothing held by the notebook: before
session 14 the envs stayed under the notebook, unnamed, held by the references of the
``%runtime_env`` builds, which only ``--clear`` dropped, so GC could not take them until the
kernel died.
Screenshots: ``tests/lab/screenshots/quickstart-*.png``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable

from labserver import ROOT, Lab, Page, needs_browser, open_panel

pytestmark = needs_browser()

PATH = "notebooks/quickstart.ipynb"


def test_the_quickstart_cell_by_cell_and_shutdown_lets_its_envs_go(
    lab: Lab, new_page: Callable[[str], Page]
) -> None:
    from playwright.sync_api import expect

    shutil.copytree(ROOT / "notebooks", lab.root / "notebooks")
    view = new_page("quickstart")
    page = view.page
    panel = open_panel(view, lab)
    view.open_notebook(lab, PATH, goto=False)
    cells = page.evaluate(
        "() => window.jupyterapp.shell.currentWidget.content.widgets.map(w => w.model.type)"
    )
    code = [i for i, kind in enumerate(cells) if kind == "code"]
    group = panel.locator(f'.jp-RuntimeEnv-group[data-group="{PATH}"]')
    for i in code:
        page.evaluate(
            "i => { window.jupyterapp.shell.currentWidget.content.activeCellIndex = i; }", i
        )
        view.command("notebook:run-cell", wait=False)
        page.wait_for_function(
            "i => { const w = window.jupyterapp.shell.currentWidget;"
            " return w.content.widgets[i].model.executionCount !== null"
            " && w.sessionContext.session?.kernel?.status === 'idle'; }",
            arg=i,
            timeout=180_000,
        )
        if i == code[-2]:  # before shutdown(): both envs under the notebook, by name
            expect(group.locator(".jp-RuntimeEnv-name.jp-mod-named")).to_have_text(
                ["(default)", "slow"], timeout=30_000
            )
            # The notebook's path whole at the sidebar's default width (its counts showed it
            # as "noteb…"), and its counts too.
            title = group.locator(".jp-RuntimeEnv-groupTitle")
            assert title.evaluate("e => e.scrollWidth <= e.clientWidth"), title.inner_text()
            meta = group.locator(".jp-RuntimeEnv-groupHead .jp-RuntimeEnv-meta")
            expect(meta).to_contain_text("2 envs")
            assert meta.evaluate("e => e.scrollWidth <= e.clientWidth")
            view.shot("01-before-shutdown")
    errors = page.evaluate(
        "() => window.jupyterapp.shell.currentWidget.content.widgets"
        ".flatMap(w => w.model.type === 'code' ? w.model.outputs.toJSON() : [])"
        ".filter(o => o.output_type === 'error').map(o => `${o.ename}: ${o.evalue}`)"
    )
    assert errors == [], errors

    # shutdown(): the notebook holds nothing; both envs are in the cache, held by nobody.
    expect(group).to_have_count(0, timeout=30_000)
    cache = panel.locator('.jp-RuntimeEnv-group[data-group="cache"] .jp-RuntimeEnv-card')
    expect(cache).to_have_count(2)
    deadline = time.monotonic() + 30
    while any(env["holders"] for env in lab.api("GET", "envs")["envs"]):
        assert time.monotonic() < deadline, lab.api("GET", "envs")["envs"]
        time.sleep(0.3)
    view.shot("02-after-shutdown")
    assert not view.faults(), view.faults()
