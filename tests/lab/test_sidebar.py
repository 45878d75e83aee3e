"""End to end: the sidebar in a real headless Chromium against a real ``jupyter lab``
(``conftest.py``: the server subprocess and the browser). Screenshots of each state, in the
light and the dark theme at the sidebar's default width, go to ``tests/lab/screenshots/``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from labserver import Lab, Page, needs_browser

from tests.server.plugins import script

pytestmark = needs_browser()

NOTEBOOK_CODE = """%load_ext jupyter_runtimeenv
%runtime_env --env-var MODE=e2e --no-widget
@remote
def pid():
    import os
    return os.getpid()
print("worker", pid.remote().result(timeout=120))"""


def test_the_sidebar_follows_envs_workers_and_notebook_envs(
    lab: Lab, new_page: Callable[[str], Page]
) -> None:
    from playwright.sync_api import expect

    notebook = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "source": NOTEBOOK_CODE,
                "outputs": [],
                "execution_count": None,
            }
        ],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (lab.root / "demo.ipynb").write_text(json.dumps(notebook))

    view = new_page("sidebar")
    page, shot, theme, errors = view.page, view.shot, view.theme, view.errors

    page.goto(f"{lab.url}lab?token={lab.token}")
    tab = page.locator('.lm-TabBar-tab[data-id="jupyter-runtimeenv-panel"]')
    tab.wait_for(timeout=90_000)
    tab.click()
    panel = page.locator("#jupyter-runtimeenv-panel")
    expect(panel).to_be_visible()
    expect(panel.locator(".jp-RuntimeEnv-live")).to_have_text("live", timeout=20_000)
    expect(panel.locator(".jp-RuntimeEnv-empty")).to_contain_text("No environments yet")
    shot("01-empty-light", panel)

    # An env created through REST appears, builds with its log streaming, turns READY.
    env = lab.api("POST", "envs", script("e2e", lines=40, sleep=0.1))
    card = panel.locator(f'[data-env-id="{env["env_id"]}"]')
    expect(card).to_have_attribute("data-state", "BUILDING", timeout=20_000)
    expect(card.locator(".jp-RuntimeEnv-log")).to_contain_text("script line", timeout=20_000)
    shot("02-building-light", panel)
    expect(card).to_have_attribute("data-state", "READY", timeout=60_000)
    expect(card.locator(".jp-RuntimeEnv-holders")).to_contain_text("REST (user)")
    shot("03-ready-light", panel)

    # A failing one shows its error, its failing step and its output's tail.
    bad = lab.api("POST", "envs", script("broken", lines=5, fail=True))
    bad_card = panel.locator(f'[data-env-id="{bad["env_id"]}"]')
    expect(bad_card).to_have_attribute("data-state", "FAILED", timeout=60_000)
    expect(bad_card.locator(".jp-RuntimeEnv-error")).to_contain_text("failed at step")
    expect(bad_card.locator(".jp-RuntimeEnv-log")).to_contain_text("script line 4")
    shot("04-failed-light", panel)

    # A kernel's remote worker appears under its env; Stop makes it go away.
    page.evaluate("window.jupyterapp.commands.execute('docmanager:open', {path: 'demo.ipynb'})")
    page.locator(".jp-Notebook").first.wait_for(timeout=60_000)
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=90_000)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    expect(page.locator(".jp-OutputArea-output").first).to_contain_text("worker", timeout=120_000)
    pid = page.locator(".jp-OutputArea-output").first.inner_text().split()[-1]
    worker = panel.locator(f'.jp-RuntimeEnv-worker[data-pid="{pid}"]')
    expect(worker).to_be_visible(timeout=30_000)
    expect(worker).to_contain_text("1 done")
    worker_card = panel.locator(
        ".jp-RuntimeEnv-card", has=page.locator(f'.jp-RuntimeEnv-worker[data-pid="{pid}"]')
    )
    expect(worker_card.locator(".jp-RuntimeEnv-holders")).to_contain_text("demo.ipynb")
    shot("05-worker-light", panel)
    shot("05-worker-light-page")
    theme("JupyterLab Dark")
    shot("06-worker-dark", panel)
    worker.locator("button").click()
    expect(worker).to_have_count(0, timeout=30_000)
    shot("07-worker-stopped-dark", panel)

    # Save environment to notebook writes the metadata; on reopen the badge shows it.
    page.evaluate("window.jupyterapp.commands.execute('runtimeenv:save-to-notebook')")
    path = lab.root / "demo.ipynb"
    deadline = time.monotonic() + 30
    while "runtime_env" not in json.loads(path.read_text())["metadata"]:
        assert time.monotonic() < deadline, "the metadata was not saved"
        time.sleep(0.2)
    meta = json.loads(path.read_text())["metadata"]["runtime_env"]
    assert meta["version"] == 1
    assert meta["spec"] == {"env_vars": {"MODE": "e2e"}}
    page.evaluate("window.jupyterapp.commands.execute('application:close-all')")
    page.wait_for_timeout(500)
    page.evaluate("window.jupyterapp.commands.execute('docmanager:open', {path: 'demo.ipynb'})")
    badge = page.locator(".jp-RuntimeEnv-badge")
    expect(badge).to_have_attribute("data-state", "cached", timeout=30_000)
    expect(badge).to_contain_text("env: cached")
    shot("08-badge-dark-page")
    theme("JupyterLab Light")
    shot("09-badge-light-page")
    shot("10-panel-light", panel)
    assert not errors, errors
