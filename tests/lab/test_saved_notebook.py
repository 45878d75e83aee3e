"""A saved notebook's build and progress widgets still read after the server restarts
(issue 21 item 1), in a real JupyterLab and headless Chromium.

The notebook builds an env in the foreground, shows a ``progress()`` bar, and builds one in
the background; it is closed while that build runs and reopened after it ended (JupyterLab
drops the final update: only the extension, asking the kernel, replaces that output); it is saved,
the server is stopped and started again (no kernel and no widget model survive), and the
reopened notebook must show each build's steps and outcome and the bar's counts, with no
"model not found".
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from labserver import Lab, Page, needs_browser

from tests.server.plugins import SCRIPT

pytestmark = needs_browser()

#: A build widget's header (``has_text`` is case-insensitive: not the summary line's ready).
READY = re.compile("— READY")

CELLS = [
    "%load_ext jupyter_runtimeenv",
    "%runtime_env --working-dir data --env-var MODE=saved",
    "from jupyter_runtimeenv import progress\n"
    "@remote\n"
    "def square(x):\n"
    "    return x * x\n"
    "print(get(progress([square.remote(i) for i in range(4)])))",
    # Last, and eight seconds of installer lines: this build ends after every cell did.
    "%%runtime_env --background --name later\n"
    f'{{"plugins": {{"{SCRIPT}": {{"name": "bg", "lines": 80, "sleep": 0.1}}}},'
    ' "working_dir": "more"}',
]


def _notebook() -> dict[str, Any]:
    return {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "source": src,
                "outputs": [],
                "execution_count": None,
            }
            for src in CELLS
        ],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def _saved_outputs(lab: Lab) -> list[list[dict[str, Any]]]:
    cells = json.loads((lab.root / "saved.ipynb").read_text())["cells"]
    return [cell.get("outputs", []) for cell in cells]


def _all_static(outputs: list[list[dict[str, Any]]]) -> bool:
    """Every display output of the saved notebook is static, and the three are there."""
    shown = [o for cell in outputs for o in cell if o["output_type"] == "display_data"]
    static = [o for o in shown if "text/html" in o["data"]]
    return len(static) == 3 and all(
        "application/vnd.jupyter.widget-view+json" not in o["data"] for o in shown
    )


def test_build_and_progress_widgets_read_after_a_server_restart(
    lab_factory: Callable[..., Lab], new_page: Callable[[str], Page]
) -> None:
    from playwright.sync_api import expect

    lab = lab_factory()
    (lab.root / "data").mkdir()
    (lab.root / "data" / "rows.csv").write_text("a,b\n1,2\n")
    (lab.root / "more").mkdir()
    for i in range(150):
        (lab.root / "more" / f"part{i}.txt").write_text("x" * 20_000)
    (lab.root / "saved.ipynb").write_text(json.dumps(_notebook()))

    view = new_page("saved")
    page = view.page
    view.open_notebook(lab, "saved.ipynb")
    view.command("notebook:run-all-cells", wait=False)
    outputs = page.locator(".jp-Notebook .jp-OutputArea-output")
    expect(outputs.filter(has_text="tasks: 4/4 finished")).to_have_count(1, timeout=180_000)
    expect(outputs.filter(has_text="script line")).not_to_have_count(0, timeout=60_000)
    # Closed while the background build still runs: its end reaches no open view.
    view.command("docmanager:save")
    view.command("application:close-all")
    deadline = time.monotonic() + 120
    while any(e["state"] != "READY" for e in lab.api("GET", "envs")["envs"]):
        assert time.monotonic() < deadline, lab.api("GET", "envs")
        time.sleep(0.3)
    view.command("docmanager:open", {"path": "saved.ipynb"})
    expect(outputs.filter(has_text=READY)).to_have_count(2, timeout=60_000)
    view.shot("01-live")

    # Saved once every widget became static (the background one by the extension's swap).
    deadline = time.monotonic() + 60
    while True:
        view.command("docmanager:save")
        if _all_static(_saved_outputs(lab)):
            break
        assert time.monotonic() < deadline, _saved_outputs(lab)
        page.wait_for_timeout(500)

    view.command("application:close-all")
    page.close()
    lab.stop()

    again = lab_factory()  # the same root and cache: the server restarted
    view = new_page("saved-reopened")
    page = view.page
    view.open_notebook(again, "saved.ipynb")
    notebook = page.locator(".jp-Notebook")
    outputs = page.locator(".jp-Notebook .jp-OutputArea-output")
    # The foreground build: header, its steps by label with their status, the summary line.
    expect(outputs.filter(has_text="working_dir: data/ (1 file")).to_have_count(1, timeout=30_000)
    expect(outputs.filter(has_text=READY)).to_have_count(2)
    expect(outputs.filter(has_text="working_dir: more/ (150 files")).to_have_count(1)
    expect(outputs.filter(has_text="script line 79")).to_have_count(1)  # its installer's tail
    expect(outputs.filter(has_text="tasks: 4/4 finished (4 done")).to_have_count(1)
    expect(notebook).not_to_contain_text("model not found")
    expect(notebook).not_to_contain_text("Error displaying widget")
    view.shot("02-reopened-light")
    view.theme("JupyterLab Dark")
    view.shot("03-reopened-dark")
    assert not view.faults(), view.faults()
