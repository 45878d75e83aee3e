"""End to end: the sidebar in a real headless Chromium against a real ``jupyter lab``
(``conftest.py``: the server subprocess and the browser). Screenshots of each state, in the
light and the dark theme at the sidebar's default width, go to ``tests/lab/screenshots/``.

What a user sees and does: environments grouped by the notebook that declared them and titled
by their names, the cache below; a build's steps and output live (the output box on its newest
line), a failure in one line with "View log"; what a busy worker runs and for how long; Stop;
GC that lists what it removes; Release that says why it cannot; holders that follow kernels
(shut down, renamed) without a refresh; expanded cards that stay expanded while live updates
come in.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import tomllib
from labserver import Lab, Page, needs_browser, notebook, open_panel, toast

from tests.server.plugins import script
from tests.wheelhouse import make_wheelhouse, offline_installers

pytestmark = needs_browser()

CELLS = [
    "%load_ext jupyter_runtimeenv",
    "%runtime_env --env-var MODE=e2e --no-widget",
    "%runtime_env --name slow --env-var SPEED=slow --no-widget",
    "@remote\n"
    "def crunch(seconds):\n"
    "    import time\n"
    "    end = time.time() + seconds\n"
    "    while time.time() < end:\n"
    "        pass\n"
    "    return seconds\n"
    "print('first', crunch.remote(0).result(timeout=120))\n"
    "running = crunch.remote(600)",
]


def test_builds_failures_logs_and_gc(lab: Lab, new_page: Callable[[str], Page]) -> None:
    from playwright.sync_api import expect

    view = new_page("sidebar")
    page = view.page
    panel = open_panel(view, lab)
    expect(panel.locator(".jp-RuntimeEnv-empty")).to_contain_text("No environments yet")
    view.shot("01-empty-light", panel)

    # A build: its steps by label, its output live, the box on its newest line.
    env = lab.api("POST", "envs", script("e2e", lines=80, sleep=0.05))
    card = panel.locator(f'.jp-RuntimeEnv-card[data-env-id="{env["env_id"]}"]')
    expect(card).to_have_attribute("data-state", "BUILDING", timeout=20_000)
    log = card.locator(".jp-RuntimeEnv-log")
    expect(log).to_contain_text("script line 3", timeout=20_000)
    expect(card.locator(".jp-RuntimeEnv-stepName")).to_contain_text("script")
    view.shot("02-building-light", panel)
    page.wait_for_timeout(500)
    if card.get_attribute("data-state") == "BUILDING":
        at_end = log.evaluate("e => e.scrollTop + e.clientHeight >= e.scrollHeight - 4")
        assert at_end, "the live output box is not on its newest line"
    expect(card).to_have_attribute("data-state", "READY", timeout=60_000)
    expect(panel.locator('.jp-RuntimeEnv-group[data-group="cache"]')).to_contain_text(
        env["env_id"][:12]
    )

    # Expanded: holders and actions; the expansion survives live updates.
    card.locator(".jp-RuntimeEnv-cardHead").click()
    expect(card.locator(".jp-RuntimeEnv-holders")).to_contain_text("REST (user)")
    head = card.locator(".jp-RuntimeEnv-cardHead")
    expect(head).to_have_attribute("aria-expanded", "true")
    view.shot("03-ready-expanded-light", panel)

    # A failure: one line naming the step by its label, and its whole log one click away.
    bad = lab.api("POST", "envs", script("broken", lines=5, fail=True))
    bad_card = panel.locator(f'.jp-RuntimeEnv-card[data-env-id="{bad["env_id"]}"]')
    expect(bad_card).to_have_attribute("data-state", "FAILED", timeout=60_000)
    error = bad_card.locator(".jp-RuntimeEnv-error")
    expect(error).to_contain_text("failed at script")
    expect(error).to_contain_text("exit code 1")
    expect(head).to_have_attribute("aria-expanded", "true")  # kept through the updates
    view.shot("04-failed-light", panel)
    bad_card.get_by_role("button", name="View log").click()
    logview = page.locator(f'.jp-RuntimeEnv-logView[data-env-id="{bad["env_id"]}"]')
    expect(logview).to_contain_text("script line 4", timeout=20_000)
    view.shot("05-log-tab-light")
    view.command("application:close-all")

    # Rebuild of a failed env says what happened.
    bad_card.locator(".jp-RuntimeEnv-cardHead").click()
    bad_card.get_by_role("button", name="Rebuild").click()
    expect(toast(page, "failed at script")).to_be_visible(timeout=60_000)

    # Release: only what REST holds; it says so, and then GC lists what it removes.
    card.get_by_role("button", name="Release").click()
    expect(toast(page, "Released the REST reference")).to_be_visible(timeout=20_000)
    expect(card.locator(".jp-RuntimeEnv-holders")).to_contain_text("held by nobody")
    release = card.get_by_role("button", name="Release")
    expect(release).to_be_disabled()
    panel.locator(".jp-RuntimeEnv-gc").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("Remove every environment nobody holds")
    expect(dialog.locator("li")).to_have_count(2)
    expect(dialog).to_contain_text(env["env_id"][:12])
    expect(dialog).to_contain_text(bad["env_id"][:12])
    view.shot("06-gc-dialog-light")
    dialog.get_by_role("button", name="Remove").click()
    expect(toast(page, "GC removed 2 environments")).to_be_visible(timeout=20_000)
    expect(card).to_have_count(0, timeout=20_000)
    expect(bad_card).to_have_count(0)
    assert lab.api("GET", "envs")["total"] == 0
    panel.locator(".jp-RuntimeEnv-gc").click()
    expect(toast(page, "Nothing to collect")).to_be_visible(timeout=20_000)
    assert not view.faults(), view.faults()


def test_named_envs_grouped_by_notebook_busy_workers_and_holders_that_follow_kernels(
    lab: Lab, new_page: Callable[[str], Page]
) -> None:
    from playwright.sync_api import expect

    (lab.root / "demo.ipynb").write_text(notebook(CELLS))
    view = new_page("sidebar-kernel")
    page = view.page
    panel = open_panel(view, lab)
    view.open_notebook(lab, "demo.ipynb", goto=False)
    view.command("notebook:run-all-cells", wait=False)
    expect(page.locator(".jp-OutputArea-output").filter(has_text="first 0")).to_have_count(
        1, timeout=180_000
    )

    # The notebook's group: its envs by the names they were declared with.
    group = panel.locator('.jp-RuntimeEnv-group[data-group="demo.ipynb"]')
    expect(group.locator(".jp-RuntimeEnv-name.jp-mod-named")).to_have_text(
        ["(default)", "slow"], timeout=30_000
    )
    # What the busy worker runs, for how long, and its CPU.
    busy = group.locator(".jp-RuntimeEnv-worker").filter(
        has=page.locator(".jp-RuntimeEnv-workerState.jp-mod-busy")
    )
    expect(busy.locator(".jp-RuntimeEnv-task")).to_contain_text("crunch", timeout=30_000)
    # Its CPU from the first report that shows it busy (CpuMeter: since the worker started).
    expect(busy.locator(".jp-RuntimeEnv-workerOf")).to_contain_text(
        re.compile(r"CPU \d+%"), timeout=20_000
    )
    view.shot("07-notebook-group-light", panel)
    view.shot("07-notebook-group-light-page")
    view.theme("JupyterLab Dark")
    view.shot("08-notebook-group-dark", panel)

    # Used N ago counts tasks: the default env was used just now.
    default = group.locator(".jp-RuntimeEnv-card").filter(has_text="(default)")
    expect(default.locator(".jp-RuntimeEnv-age")).to_contain_text(re.compile(r"^\d+ s ago$"))

    # Release on a kernel-held env says why it does nothing.
    default.locator(".jp-RuntimeEnv-cardHead").click()
    release = default.get_by_role("button", name="Release")
    expect(release).to_be_disabled()
    assert "demo.ipynb" in (release.get_attribute("title") or "")

    # Stop the busy worker: it goes, and the notification says what its task gets.
    pid = busy.get_attribute("data-pid")
    busy.get_by_role("button", name="Stop").click()
    expect(toast(page, f"Stopped worker {pid}")).to_be_visible(timeout=20_000)
    expect(group.locator(f'.jp-RuntimeEnv-worker[data-pid="{pid}"]')).to_have_count(
        0, timeout=30_000
    )
    view.shot("09-worker-stopped-dark", panel)

    # A rename renames the group; a shut-down kernel's holders go without a refresh.
    page.evaluate(
        "() => window.jupyterapp.serviceManager.contents.rename('demo.ipynb', 'renamed.ipynb')"
    )
    renamed = panel.locator('.jp-RuntimeEnv-group[data-group="renamed.ipynb"]')
    expect(renamed).to_have_count(1, timeout=30_000)
    expect(group).to_have_count(0)
    for kernel in lab.request("GET", "api/kernels"):
        lab.request("DELETE", f"api/kernels/{kernel['id']}")
    expect(renamed).to_have_count(0, timeout=30_000)
    expect(panel.locator('.jp-RuntimeEnv-group[data-group="cache"]')).to_contain_text(
        "env_vars: 1", timeout=30_000
    )
    view.theme("JupyterLab Light")
    view.shot("10-after-shutdown-light", panel)
    assert not view.own_errors(), view.own_errors()


def test_save_environment_to_notebook_and_the_badge_on_reopen(
    lab_factory: Callable[..., Lab],
    new_page: Callable[[str], Page],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from playwright.sync_api import expect

    # The named env installs alpha (2.0, the newest) from the tests' wheelhouse, never PyPI.
    offline_installers(monkeypatch, make_wheelhouse(tmp_path / "wheelhouse"))
    lab = lab_factory()
    cells = [
        CELLS[0],
        CELLS[1],
        "%runtime_env --name slow --env-var SPEED=slow --pip alpha --no-widget",
    ]
    (lab.root / "demo.ipynb").write_text(notebook(cells))
    view = new_page("sidebar-save")
    page = view.page
    view.open_notebook(lab, "demo.ipynb")
    view.command("notebook:run-all-cells", wait=False)
    deadline = time.monotonic() + 120
    while not any(len(k.get("declared", [])) == 2 for k in lab.api("GET", "kernels")["kernels"]):
        assert time.monotonic() < deadline, "the kernel never reported its envs"
        time.sleep(0.3)

    view.command("runtimeenv:save-to-notebook")
    path = lab.root / "demo.ipynb"
    deadline = time.monotonic() + 30
    while "runtime_env" not in json.loads(path.read_text())["metadata"]:
        assert time.monotonic() < deadline, "the metadata was not saved"
        time.sleep(0.2)
    meta = json.loads(path.read_text())["metadata"]["runtime_env"]
    assert meta["spec"] == {"env_vars": {"MODE": "e2e"}}
    assert "lock" not in meta  # no packages, nothing to lock
    # The named env too, each under the id the kernel shows (issue 21 item 3), with the
    # versions it has as a PEP 751 lock.
    (kernel,) = lab.api("GET", "kernels")["kernels"]
    ids = {d["name"]: d["env_id"] for d in kernel["declared"]}
    assert meta["env_id"] == ids[None]
    slow = meta["named"]["slow"]
    assert slow["env_id"] == ids["slow"]
    assert slow["spec"]["env_vars"] == {"SPEED": "slow"}
    assert slow["spec"]["pip"]["packages"] == ["alpha"]
    locked = tomllib.loads(slow["lock"])
    assert [(p["name"], p["version"]) for p in locked["packages"]] == [("alpha", "2.0")]
    assert not any("lock_error" in e for e in (meta, slow))  # a server note, never saved
    expect(
        toast(page, "Saved (default), slow to demo.ipynb (versions locked: slow)")
    ).to_be_visible(timeout=10_000)
    view.command("application:close-all")
    page.wait_for_timeout(500)
    view.command("docmanager:open", {"path": "demo.ipynb"})
    badge = page.locator(".jp-RuntimeEnv-badge")
    expect(badge).to_have_attribute("data-state", "cached", timeout=30_000)
    expect(badge).to_contain_text("env: cached (+1 named)")
    expect(badge).to_have_attribute("data-lock", "ok")
    expect(badge.locator(".jp-RuntimeEnv-upgrade")).to_be_visible()
    title = badge.get_attribute("title") or ""
    assert f"(default) {ids[None][:12]}: cached" in title, title
    assert f"slow {ids['slow'][:12]}: cached, the lock's versions" in title, title
    view.shot("11-badge-light-page")

    # A notebook saved when alpha 1.0 was the newest: the badge says the kernel's env differs.
    view.command("application:close-all")
    page.wait_for_timeout(500)
    data = json.loads(path.read_text())
    old = data["metadata"]["runtime_env"]["named"]["slow"]["lock"].replace("2.0", "1.0")
    data["metadata"]["runtime_env"]["named"]["slow"]["lock"] = old
    path.write_text(json.dumps(data))
    view.command("docmanager:open", {"path": "demo.ipynb"})
    expect(badge).to_have_attribute("data-lock", "differs", timeout=30_000)
    expect(badge).to_contain_text("env: cached (+1 named) · lock differs (1)")
    title = badge.get_attribute("title") or ""
    assert "slow: alpha: 1.0 in the lock, 2.0 in the env" in title, title
    view.shot("12-badge-lock-differs-light-page")
    assert not view.faults(), view.faults()
