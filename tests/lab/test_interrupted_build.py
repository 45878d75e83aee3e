"""The stop button and the restart button while ``%runtime_env`` waits for a build, in
JupyterLab and Notebook 7 in headless Chromium (session 14: a user pressed stop on a slow build
and got 40 lines of the package's own frames, a widget saying BUILDING forever, and a reference
the notebook held on an env it never declared; after a restart the widget said BUILDING for
ever too when the kernel died, and "model not found" once the page was reloaded).

What a user must see after stop: one line saying the notebook keeps what it had and the build
goes on; the widget ended (INTERRUPTED, saying the same) and still so once the build ended; the
env held by nobody (in the sidebar's Cache, not under the notebook); the kernel usable. When
the kernel dies: the widget replaced by a line that stays true (the kernel restarted while it
was building; the build goes on), kept in the saved notebook.
Screenshots: ``tests/lab/screenshots/interrupted-*.png``, ``restarted-*.png``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from labserver import Lab, Page, needs_browser, notebook, open_panel

from tests.server.plugins import SCRIPT

pytestmark = needs_browser()

CELLS = [
    "%load_ext jupyter_runtimeenv",
    # About 40 s of installer lines: the stop button comes long before the end.
    "%%runtime_env --name slow\n"
    + json.dumps({"plugins": {SCRIPT: {"name": "slowbuild", "lines": 400, "sleep": 0.1}}}),
    "print('the kernel goes on')",
]


def _kernel_pid(kernel_id: str) -> int:
    """The pid of the kernel process started with ``kernel-<id>.json``."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                args = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(a.endswith(f"kernel-{kernel_id}.json".encode()) for a in args):
                return int(proc.name)
    raise AssertionError(f"no process of kernel {kernel_id}")


def _slow_env(lab: Lab) -> dict[str, object] | None:
    for env in lab.api("GET", "envs")["envs"]:
        if "plugins" in env["fields"]:
            return dict(env)
    return None


@pytest.mark.parametrize("app", ["lab", "notebook7"])
def test_the_stop_button_while_a_build_runs_says_one_line_and_lets_the_env_go(
    lab: Lab, new_page: Callable[[str], Page], app: str
) -> None:
    from playwright.sync_api import expect

    (lab.root / "interrupt.ipynb").write_text(notebook(CELLS))
    view = new_page(f"interrupted-{app}")
    page = view.page
    if app == "lab":
        panel = open_panel(view, lab)
    view.open_in(app, lab, "interrupt.ipynb", goto=False)
    outputs = page.locator(".jp-OutputArea-output")

    def run(index: int) -> None:
        view.run_cell(index, "notebook:run-cell")

    run(0)
    page.wait_for_function(
        "() => window.jupyterapp.shell.currentWidget.content.widgets[0].model.executionCount"
    )
    run(1)
    widget = outputs.filter(has_text="runtime env ")
    expect(widget).to_contain_text("script line 3", timeout=120_000)
    expect(widget).to_contain_text("BUILDING")
    view.shot("01-building")

    # The notebook's own stop button (its toolbar's), as a user presses it.
    page.locator('.jp-Toolbar [data-command="notebook:interrupt-kernel"]').first.click()
    said = outputs.filter(has_text="KeyboardInterrupt")
    expect(said).to_have_count(1, timeout=60_000)
    env = _slow_env(lab)
    assert env is not None
    env_id = str(env["env_id"])
    expect(said).to_have_text(
        f"KeyboardInterrupt: runtime_env: stopped waiting for the build of {env_id[:12]};"
        " the env 'slow' stays as it was (the build goes on in the background: run the cell"
        " again to use it)"
    )
    expect(widget).to_contain_text("INTERRUPTED")
    expect(widget).to_contain_text("the build goes on in the background")
    expect(widget).not_to_contain_text("BUILDING")
    view.shot("02-interrupted")

    # The build went on and ended, held by nobody; the widget did not go back to BUILDING.
    deadline = time.monotonic() + 180
    while (env := _slow_env(lab)) is None or env["state"] != "READY" or env["holders"]:
        assert time.monotonic() < deadline, env
        time.sleep(0.5)
    expect(widget).to_contain_text("INTERRUPTED")
    if app == "lab":
        cache = panel.locator('.jp-RuntimeEnv-group[data-group="cache"]')
        expect(cache.locator(f'.jp-RuntimeEnv-card[data-env-id="{env_id}"]')).to_have_count(
            1, timeout=30_000
        )
        expect(panel.locator('.jp-RuntimeEnv-group[data-group="interrupt.ipynb"]')).to_have_count(0)
    run(2)
    expect(outputs.filter(has_text="the kernel goes on")).to_have_count(1, timeout=60_000)
    view.shot("03-after")
    assert not view.own_errors(), view.own_errors()


@pytest.mark.parametrize("app", ["lab", "notebook7"])
def test_a_build_widget_whose_kernel_dies_says_so_and_stays_readable(
    lab: Lab, new_page: Callable[[str], Page], app: str
) -> None:
    from playwright.sync_api import expect

    (lab.root / "restart.ipynb").write_text(notebook(CELLS))
    view = new_page(f"restarted-{app}")
    page = view.page
    view.open_in(app, lab, "restart.ipynb")
    outputs = page.locator(".jp-OutputArea-output")
    view.command("notebook:run-all-cells", wait=False)
    widget = outputs.filter(has_text="runtime env ")
    expect(widget).to_contain_text("script line 3", timeout=120_000)
    view.shot("01-building")

    # The kernel dies (SIGKILL: the OOM killer's way; a restart from the toolbar interrupts
    # the cell first, and the widget ends INTERRUPTED as above); the server starts a new one.
    (kernel,) = lab.request("GET", "api/kernels")
    os.kill(_kernel_pid(kernel["id"]), signal.SIGKILL)
    expect(widget).to_contain_text("the kernel restarted while it was building", timeout=60_000)
    expect(widget).to_contain_text("the build goes on in the server")
    expect(widget).not_to_contain_text("BUILDING")
    view.shot("02-restarted")

    # Saved and reopened: the same line, no "model not found".
    view.command("docmanager:save")
    page.wait_for_timeout(500)
    page.reload()
    page.locator(".jp-NotebookPanel").wait_for(timeout=90_000)
    expect(widget).to_contain_text("the kernel restarted while it was building", timeout=60_000)
    expect(page.locator(".jp-Notebook")).not_to_contain_text("model not found")
    view.shot("03-reopened")
    assert not view.own_errors(), view.own_errors()
