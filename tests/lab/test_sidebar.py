"""End to end: the sidebar in a real headless Chromium against a real ``jupyter lab``.

Debian's chromium is driven by Playwright through ``executable_path`` (browser downloads are
not possible here; ``.ci/run`` installs chromium with apt-get when it is missing). The server
is a ``jupyter lab`` subprocess on 127.0.0.1 with the extension as installed in this
environment (``./dev`` builds and links it). Screenshots of each state, in the light and the
dark theme at the sidebar's default width, go to ``tests/lab/screenshots/`` (git-ignored).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_process import JupyterProcess

from tests.server.plugins import SCRIPT, script

ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(__file__).parent / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
BUILT = Path(sys.prefix, "share", "jupyter", "labextensions", "jupyter-runtimeenv", "package.json")

pytestmark = [
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="no chromium (apt-get install chromium)"
    ),
    pytest.mark.timeout(280),
]

NOTEBOOK_CODE = """%load_ext jupyter_runtimeenv
%runtime_env --env-var MODE=e2e --no-widget
@remote
def pid():
    import os
    return os.getpid()
print("worker", pid.remote().result(timeout=120))"""


class Lab(JupyterProcess):
    """A ``jupyter lab`` subprocess and REST calls to it."""

    def __init__(self, tmp: Path) -> None:
        root = tmp / "root"
        root.mkdir()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "JUPYTER_CONFIG_DIR": str(tmp / "config"),
            "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
            "JUPYTER_RUNTIMEENV_CACHE": str(tmp / "cache"),
        }
        super().__init__(
            "jupyterlab",
            root,
            tmp / "lab.log",
            env=env,
            args=[
                f"--LabApp.user_settings_dir={tmp / 'settings'}",
                f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
                "--LabApp.expose_app_in_browser=True",
                "--RuntimeEnvExtension.kernel_sweep_interval=0.5",
                f"--RuntimeEnvExtension.allowed_plugins={SCRIPT}",
            ],
        )


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    if not BUILT.exists():
        pytest.skip(f"the JupyterLab extension is not built/linked ({BUILT}): run ./dev")
    server = Lab(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def test_the_sidebar_follows_envs_workers_and_notebook_envs(lab: Lab) -> None:
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(exist_ok=True)
    for old in SHOTS.glob("*.png"):
        old.unlink()
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

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,  # Playwright gives it a fresh temporary user-data-dir
        )
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))

        def shot(name: str, target: Any = None) -> None:
            (target or page).screenshot(path=str(SHOTS / f"{name}.png"))

        def theme(name: str) -> None:
            page.evaluate(
                "name => window.jupyterapp.commands.execute('apputils:change-theme',"
                " {theme: name})",
                name,
            )
            page.wait_for_timeout(800)

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
        expect(page.locator(".jp-OutputArea-output").first).to_contain_text(
            "worker", timeout=120_000
        )
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
        browser.close()
