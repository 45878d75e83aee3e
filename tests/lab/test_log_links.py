"""Issue 21 item 6: a failed build's log is one click away in a notebook, through our "View
log", never through a path. JupyterLab's output linkifier turns an absolute path in a cell's
output into a link that opens the path as debugger source ("Start debugger?"): a build
error's text used to end in "(full log: /…/logs/<id>.log)" and "the whole log: /…".

Three ways a build fails in a cell, in a real JupyterLab with a real failing uv install from
the tests' wheelhouse: ``%runtime_env`` without the widget, with it, and a remote call whose
own env fails (its BuildError in the traceback). Every output names the log by a command
(``jupyter runtimeenv logs <id>``), no output links to a log file, and "View log" opens the
whole log in a tab without any dialog.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from labserver import Lab, Page, needs_browser, notebook

from tests.wheelhouse import make_wheelhouse, offline_installers

pytestmark = needs_browser()

CELLS = [
    "%load_ext jupyter_runtimeenv",
    "%runtime_env --pip no-such-one --no-widget",
    "%runtime_env --pip no-such-two",
    "@remote(runtime_env={'pip': ['no-such-three']})\n"
    "def f():\n"
    "    return 1\n"
    "f.remote().result(timeout=120)",
]


@pytest.mark.parametrize("app", ["lab", "notebook7"])
def test_a_failed_builds_log_opens_from_view_log_and_no_output_links_a_log_path(
    lab_factory: Callable[..., Lab],
    new_page: Callable[[str], Page],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    app: str,
) -> None:
    from playwright.sync_api import expect

    offline_installers(monkeypatch, make_wheelhouse(tmp_path / "wheelhouse"))
    lab = lab_factory()
    (lab.root / "failing.ipynb").write_text(notebook(CELLS, tags=["raises-exception"]))
    view = new_page(f"log-links-{app}")
    page = view.page
    view.open_in(app, lab, "failing.ipynb")
    view.command("notebook:run-all-cells", wait=False)
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    expect(errors).to_have_count(3, timeout=180_000)
    texts = errors.all_inner_texts()
    assert texts[0].startswith("UsageError: runtime_env: build failed"), texts[0]
    assert "no-such-one" in texts[0], texts[0]
    assert "UsageError: runtime_env: build failed at pip: no-such-two:" in texts[1], texts[1]
    assert "BuildError" in texts[2], texts[2]
    for text in texts:
        # The log by a command that prints it, not by its path.
        assert "jupyter runtimeenv logs " in text, text
        assert ".log" not in text, text
    # No output links to a log file (JupyterLab's linkifier would make one of a path).
    hrefs = page.locator(".jp-Cell-outputArea a").evaluate_all(
        "links => links.map(a => a.getAttribute('href') || '')"
    )
    assert not [h for h in hrefs if h.endswith(".log")], hrefs
    view.shot("01-failed-builds")

    # Each "View log" (ours: above the no-widget error, and in the widget) opens the log.
    # The notebook may detach cells out of view (windowing): each cell is scrolled to first.
    for i, cell in enumerate([1, 2]):
        page.evaluate(
            "async i => { await window.jupyterapp.shell.currentWidget.content"
            ".scrollToItem(i, 'center'); }",
            cell,
        )
        link = page.locator(f'.jp-Cell[data-windowed-list-index="{cell}"]').get_by_text(
            "View log", exact=True
        )
        link.click(timeout=30_000)
        logview = page.locator(".jp-RuntimeEnv-logView").last
        expect(logview).to_contain_text("no-such-", timeout=20_000)
        assert page.locator(".jp-Dialog").count() == 0, page.locator(".jp-Dialog").all_inner_texts()
        view.shot(f"02-log-tab-{i}")
        if app == "lab":
            page.locator(".lm-TabBar-tab", has_text="failing.ipynb").click()
        else:  # the log is the page's right panel: closed, the notebook has its width back
            page.evaluate("() => window.jupyterapp.shell.collapseRight()")
    assert not view.own_errors(), view.own_errors()
