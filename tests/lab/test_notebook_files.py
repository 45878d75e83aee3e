"""What users do to a notebook's file while its kernel runs envs and workers, in JupyterLab
(headless Chromium, a real ``jupyter lab``): rename it and move it into a folder (its group
follows the new path, its envs and workers stay its own, it runs again there), duplicate it
from the file browser (the copy carries the saved env and gets its own group when it runs;
the original keeps its own), and delete it from the file browser while its kernel runs
(JupyterLab shuts the kernel down with it: its group goes, its envs are held by nobody).
Screenshots: ``tests/lab/screenshots/files-*``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from labserver import NAP_CELL, Lab, Page, needs_browser, notebook, open_panel

pytestmark = needs_browser()

CELLS = [
    "%load_ext jupyter_runtimeenv",
    "%runtime_env --env-var MODE=files --no-widget",
    NAP_CELL,
]


def _kernels(lab: Lab) -> dict[str, dict[str, Any]]:
    return {k["path"]: k for k in lab.api("GET", "kernels")["kernels"]}


def _holders(lab: Lab) -> dict[str, list[str]]:
    envs = lab.api("GET", "overview")["envs"]
    return {e["env_id"]: [h["label"] for h in e["holders"]] for e in envs}


def _file_item(page: Any, name: str) -> Any:
    return page.locator(".jp-DirListing-item").filter(
        has=page.locator(".jp-DirListing-itemText", has_text=name)
    )


def _context_menu(page: Any, item: Any, entry: str | re.Pattern[str]) -> None:
    item.click(button="right")
    label = page.locator(".lm-Menu-itemLabel", has_text=entry)
    page.locator(".lm-Menu-item").filter(has=label).first.click()


def test_rename_move_duplicate_and_delete_a_notebook_whose_kernel_runs(
    lab: Lab, new_page: Callable[[str], Page]
) -> None:
    from playwright.sync_api import expect

    (lab.root / "demo.ipynb").write_text(notebook(CELLS))
    (lab.root / "sub").mkdir()
    view = new_page("files")
    page = view.page
    panel = open_panel(view, lab)
    view.open_notebook(lab, "demo.ipynb", goto=False)
    view.command("notebook:run-all-cells", wait=False)
    outputs = page.locator(".jp-OutputArea-output")
    expect(outputs.filter(has_text="first 0")).to_have_count(1, timeout=180_000)
    deadline = time.monotonic() + 60  # the kernel's report of its envs reached the server
    while not _kernels(lab).get("demo.ipynb", {}).get("declared"):
        assert time.monotonic() < deadline, "the kernel never reported its envs"
        time.sleep(0.3)
    view.command("runtimeenv:save-to-notebook")
    deadline = time.monotonic() + 30
    while "runtime_env" not in json.loads((lab.root / "demo.ipynb").read_text())["metadata"]:
        assert time.monotonic() < deadline, "the env was not saved to the notebook"
        time.sleep(0.2)
    (env_id,) = [d["env_id"] for d in _kernels(lab)["demo.ipynb"]["declared"]]
    group = panel.locator('.jp-RuntimeEnv-group[data-group="demo.ipynb"]')
    expect(group.locator(".jp-RuntimeEnv-worker")).to_have_count(1, timeout=30_000)

    # Renamed, then moved into a folder: the group follows; the envs stay the kernel's.
    page.evaluate(
        "() => window.jupyterapp.serviceManager.contents.rename('demo.ipynb', 'renamed.ipynb')"
    )
    expect(panel.locator('.jp-RuntimeEnv-group[data-group="renamed.ipynb"]')).to_have_count(
        1, timeout=30_000
    )
    page.evaluate(
        "() => window.jupyterapp.serviceManager.contents.rename('renamed.ipynb', 'sub/moved.ipynb')"
    )
    moved = panel.locator('.jp-RuntimeEnv-group[data-group="sub/moved.ipynb"]')
    expect(moved).to_have_count(1, timeout=30_000)
    expect(moved.locator(".jp-RuntimeEnv-worker")).to_have_count(1)
    expect(panel.locator(".jp-RuntimeEnv-group.jp-mod-kernel")).to_have_count(1)
    assert all(label.startswith("sub/moved.ipynb") for label in _holders(lab)[env_id])
    view.run_cell(1)  # runs again where it is now
    expect(outputs.filter(has_text="ready: python")).to_have_count(1, timeout=60_000)
    view.shot("01-moved", panel)

    # Duplicated from the file browser: the copy carries the env and, once it runs, has a
    # group of its own; the original keeps its envs and worker.
    view.command("filebrowser:activate")
    view.command("filebrowser:go-to-path", {"path": "sub"})
    _context_menu(page, _file_item(page, "moved.ipynb"), "Duplicate")
    copy = lab.root / "sub" / "moved-Copy1.ipynb"
    deadline = time.monotonic() + 30
    while not copy.exists():
        assert time.monotonic() < deadline, "no copy"
        time.sleep(0.2)
    assert "runtime_env" in json.loads(copy.read_text())["metadata"]
    view.open_notebook(lab, "sub/moved-Copy1.ipynb", goto=False)
    view.command("runtimeenv:open-panel")
    badge = page.locator(".jp-NotebookPanel:visible .jp-RuntimeEnv-badge")
    expect(badge).to_have_attribute("data-state", "cached", timeout=30_000)
    badge.get_by_role("button", name="Declare").click()
    copied = panel.locator('.jp-RuntimeEnv-group[data-group="sub/moved-Copy1.ipynb"]')
    expect(copied.locator(".jp-RuntimeEnv-name.jp-mod-named")).to_have_text(
        ["(default)"], timeout=60_000
    )
    expect(moved.locator(".jp-RuntimeEnv-worker")).to_have_count(1)
    assert all(label.startswith("sub/moved.ipynb") for label in _holders(lab)[env_id])
    view.shot("02-duplicated", panel)

    # Deleted from the file browser while its kernel runs: JupyterLab shuts that kernel down
    # with it, so its group goes and its env is held by nobody (in the cache, for GC); the
    # copy's group stays as it was.
    view.command("filebrowser:activate")
    # "Move to Trash" where the server sends deleted files to the trash (its default).
    _context_menu(page, _file_item(page, "moved.ipynb"), re.compile("^(Delete|Move to Trash)$"))
    page.locator(".jp-Dialog .jp-mod-accept").click()
    view.command("runtimeenv:open-panel")
    expect(moved).to_have_count(0, timeout=30_000)
    cache = panel.locator('.jp-RuntimeEnv-group[data-group="cache"]')
    expect(cache.locator(f'.jp-RuntimeEnv-card[data-env-id="{env_id}"]')).to_have_count(1)
    deadline = time.monotonic() + 30
    while _holders(lab)[env_id]:
        assert time.monotonic() < deadline, _holders(lab)
        time.sleep(0.3)
    assert list(_kernels(lab)) == ["sub/moved-Copy1.ipynb"]
    expect(copied.locator(".jp-RuntimeEnv-worker")).to_have_count(1)
    view.shot("03-deleted", panel)
    assert not view.own_errors(), view.own_errors()
