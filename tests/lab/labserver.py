"""The browser tests' parts: a real ``jupyter lab`` subprocess and a headless Chromium page.

Debian's chromium is driven by Playwright through ``executable_path`` (browser downloads are
not possible here; ``.ci/run`` installs chromium with apt-get when it is missing). The server
is a ``jupyter lab`` subprocess on 127.0.0.1 with the extension as installed in this
environment (``./dev`` builds and links it). Screenshots go to ``tests/lab/screenshots/``
(git-ignored).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from jupyter_process import JupyterProcess

from tests.server.plugins import SCRIPT

ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(__file__).parent / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
BUILT = Path(sys.prefix, "share", "jupyter", "labextensions", "jupyter-runtimeenv", "package.json")


#: A cell that shows a first remote call's result, then leaves a long one running (a busy
#: worker for the sidebar to show, stop or lose).
NAP_CELL = (
    "import time\n"
    "@remote\n"
    "def nap(seconds):\n"
    "    time.sleep(seconds)\n"
    "    return seconds\n"
    "print('first', nap.remote(0).result(timeout=120))\n"
    "running = nap.remote(600)"
)


def needs_browser() -> list[pytest.MarkDecorator]:
    """The marks of a browser test: skipped without chromium, bounded in time."""
    return [
        pytest.mark.skipif(
            not os.path.exists(CHROMIUM), reason="no chromium (apt-get install chromium)"
        ),
        pytest.mark.timeout(400),
    ]


class Lab(JupyterProcess):
    """A ``jupyter lab`` subprocess serving ``tmp/root`` and REST calls to it. A second
    ``Lab`` on the same ``tmp`` is the same server restarted: same root, cache, settings;
    with ``restart_of`` (a stopped ``Lab``) on its port with its token too, so the pages
    open on it reconnect."""

    def __init__(self, tmp: Path, *extra: str, restart_of: Lab | None = None) -> None:
        root = tmp / "root"
        root.mkdir(exist_ok=True)
        # No "get notified about Jupyter news?" toast over the screenshots.
        settings = tmp / "settings" / "@jupyterlab"
        for extension, name, value in [
            ("apputils-extension", "notification", {"fetchNews": "false"}),
        ]:
            (settings / extension).mkdir(parents=True, exist_ok=True)
            (settings / extension / f"{name}.jupyterlab-settings").write_text(json.dumps(value))
        own = _own_build(tmp / "own")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "JUPYTER_PATH": os.pathsep.join([str(own), os.environ.get("JUPYTER_PATH", "")]),
            "JUPYTER_CONFIG_DIR": str(tmp / "config"),
            "JUPYTER_DATA_DIR": str(tmp / "data"),
            "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
            "JUPYTER_RUNTIMEENV_CACHE": str(tmp / "cache"),
        }
        super().__init__(
            "jupyterlab",
            root,
            tmp / f"lab-{len(list(tmp.glob('lab*.log')))}.log",
            env=env,
            args=[
                f"--LabApp.user_settings_dir={tmp / 'settings'}",
                f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
                "--LabApp.expose_app_in_browser=True",
                "--JupyterNotebookApp.expose_app_in_browser=True",  # Notebook 7's pages
                "--RuntimeEnvExtension.kernel_sweep_interval=0.5",
                f"--RuntimeEnvExtension.allowed_plugins={SCRIPT}",
                *extra,
            ],
            port=restart_of.port if restart_of else None,
            token=restart_of.token if restart_of else None,
        )


def _own_build(data: Path) -> Path:
    """A data directory holding this checkout's build of the extension, for ``JUPYTER_PATH``,
    which comes before the environment's directory (where ``./dev`` links the build of the
    checkout it ran in): a worktree sharing another checkout's ``.venv`` tests its own
    frontend, as its kernels and servers import its own package (PYTHONPATH). JupyterLab takes
    an extension from the first labextensions directory that has it."""
    own = ROOT / "jupyter_runtimeenv" / "labextension"
    link = data / "labextensions" / "jupyter-runtimeenv"
    if (own / "package.json").exists() and not link.is_symlink():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(own)
    return data


class Page:
    """A browser page on a server, with the helpers every browser test uses."""

    def __init__(self, browser: Any, prefix: str) -> None:
        self.page = browser.new_page(viewport={"width": 1280, "height": 800})
        self.prefix = prefix
        #: Uncaught errors' messages; ``stacks`` their stacks (where they were thrown).
        self.errors: list[str] = []
        self.stacks: list[str] = []
        self.page.on("pageerror", self._error)
        SHOTS.mkdir(exist_ok=True)
        for old in SHOTS.glob(f"{prefix}-*.png"):
            old.unlink()

    def _error(self, exc: Any) -> None:
        self.errors.append(str(exc))
        self.stacks.append(f"{exc}\n{exc.stack}")

    def own_errors(self) -> list[str]:
        """The page's uncaught errors, less those whose stack shows only other code than this
        extension's (its scripts are served under ``.../extensions/jupyter-runtimeenv/``):
        Notebook 7.6 throws one of its own at every page load ("reading 'schema'" in its
        shortcuts plugin, with or without this extension), and JupyterLab's own requests may
        fail while a kernel is deleted under load ("Failed to fetch"). An error without a
        stack counts as ours."""
        return [
            e
            for e in self.stacks
            if "jupyter-runtimeenv" in e
            or not any(line.strip().startswith("at ") for line in e.splitlines())
        ]

    def faults(self) -> list[str]:
        """The page's uncaught errors but one of JupyterLab's own that no code of ours causes:
        closing a notebook (``application:close-all``) or its kernel's connection while a
        request of JupyterLab's is pending (4.4+ asks a new kernel for a subshell) rejects
        that request's future ("Canceled future for create_subshell_request message before
        replies were done"), seen once at load 5 in session 11; @jupyterlab/services itself
        treats that message as expected at a kernel's dispose (``kernel/default.js``). Any
        other error counts, and that one too when its stack passes through this extension's
        scripts."""
        return [
            m
            for m, stack in zip(self.errors, self.stacks, strict=True)
            if "Canceled future for " not in m or "jupyter-runtimeenv" in stack
        ]

    def shot(self, name: str, target: Any = None) -> Path:
        path = SHOTS / f"{self.prefix}-{name}.png"
        (target or self.page).screenshot(path=str(path))
        return path

    def command(self, command: str, args: dict[str, Any] | None = None, wait: bool = True) -> None:
        """Run a JupyterLab command; ``wait=False`` returns at once (``run-all-cells``
        resolves only when every cell ran)."""
        # The command's result is not returned: it may not be serializable (a widget).
        script = "async ([c, a]) => { await window.jupyterapp.commands.execute(c, a); }"
        if not wait:
            script = "([c, a]) => { void window.jupyterapp.commands.execute(c, a); }"
        self.page.evaluate(script, [command, args or {}])

    def open_in(self, app: str, server: Lab, path: str, *, goto: bool = True) -> None:
        """Open notebook ``path`` in ``app``: ``"lab"`` (``open_notebook``, with ``goto``) or
        ``"notebook7"`` (its ``/notebooks/`` page: the test is skipped without notebook>=7),
        and wait until its kernel is idle."""
        if app == "lab":
            self.open_notebook(server, path, goto=goto)
            return
        pytest.importorskip("notebook", minversion="7")
        self.page.goto(f"{server.url}notebooks/{path}?token={server.token}")
        self.page.locator(".jp-NotebookPanel").wait_for(timeout=90_000)
        self.page.wait_for_function(
            "() => { const s = window.jupyterapp?.shell?.currentWidget?.sessionContext;"
            " return !!(s && s.isReady && s.session?.kernel?.status === 'idle'); }",
            timeout=120_000,
        )

    def run_cell(self, index: int, command: str = "notebook:run-cell-and-select-next") -> None:
        """Select cell ``index`` of the current notebook and run it with ``command``."""
        self.page.evaluate(
            "i => { window.jupyterapp.shell.currentWidget.content.activeCellIndex = i; }", index
        )
        self.command(command, wait=False)

    def open_notebook(self, server: Lab, path: str, *, goto: bool = True) -> None:
        """Open notebook ``path`` (in JupyterLab on ``server`` first, with ``goto``) and wait
        until its kernel is idle. JupyterLab may ask which kernel to start, sometimes late
        (when the kernel specs were not loaded as the notebook opened): the dialog, whenever
        it comes, is answered with the notebook's own kernel."""
        page = self.page
        if goto:
            page.goto(f"{server.url}lab?token={server.token}")
            page.locator(".jp-LabShell").wait_for(timeout=90_000)
        page.wait_for_function(
            "() => Object.keys(window.jupyterapp?.serviceManager?.kernelspecs?.specs"
            "?.kernelspecs ?? {}).length > 0",
            timeout=90_000,
        )
        self.command("docmanager:open", {"path": path})
        select = page.locator(".jp-Dialog-button.jp-mod-accept")
        ready = (
            "() => { const s = window.jupyterapp.shell.currentWidget?.sessionContext;"
            " return !!(s && s.isReady && s.session?.kernel?.status === 'idle'); }"
        )
        deadline = time.monotonic() + 120
        calm = 0  # consecutive looks with the kernel idle and no dialog
        while calm < 3:
            assert time.monotonic() < deadline, f"the kernel of {path} never became idle"
            if select.count():
                select.first.click()
                calm = 0
            elif page.evaluate(ready):
                calm += 1
            else:
                calm = 0
            page.wait_for_timeout(300)

    def theme(self, name: str) -> None:
        self.command("apputils:change-theme", {"theme": name})
        self.page.wait_for_timeout(800)


def notebook(cells: list[str], tags: Sequence[str] = ()) -> str:
    """A notebook of code ``cells`` for the ``python3`` kernel, as JSON; each cell carries
    ``tags`` (``raises-exception``: Run All goes on past its error)."""
    metadata = {"tags": list(tags)} if tags else {}
    return json.dumps(
        {
            "cells": [
                {"cell_type": "code", "metadata": dict(metadata), "source": c, "outputs": []}
                | {"execution_count": None}
                for c in cells
            ],
            "metadata": {
                "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
            },
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


def open_panel(view: Page, lab: Lab) -> Any:
    """JupyterLab on ``lab`` with the Environments panel open and live; the panel."""
    from playwright.sync_api import expect

    page = view.page
    page.goto(f"{lab.url}lab?token={lab.token}")
    tab = page.locator('.lm-TabBar-tab[data-id="jupyter-runtimeenv-panel"]')
    tab.wait_for(timeout=90_000)
    tab.click()
    panel = page.locator("#jupyter-runtimeenv-panel")
    expect(panel).to_be_visible()
    expect(panel.locator(".jp-RuntimeEnv-live")).to_have_text("live", timeout=20_000)
    return panel


def toast(page: Any, text: str | re.Pattern[str]) -> Any:
    """The notification saying ``text``."""
    return page.locator(".jp-toast-message, .Toastify__toast").filter(has_text=text).first
