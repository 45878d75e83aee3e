"""The JupyterLab extension as installed: listed enabled and OK, and its TypeScript model's
unit tests (vitest), run here so that ``./dev test`` runs them too."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LABEXTENSION = Path(__file__).resolve().parents[2] / "labextension"
LINKED = Path(sys.prefix, "share", "jupyter", "labextensions", "jupyter-runtimeenv")


def test_jupyter_labextension_list_shows_it_enabled_and_ok() -> None:
    if not (LINKED / "package.json").exists():
        pytest.skip(f"the extension is not built/linked ({LINKED}): run ./dev")
    jupyter = Path(sys.executable).with_name("jupyter")
    result = subprocess.run(
        [str(jupyter), "labextension", "list"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
    )
    lines = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if "jupyter-runtimeenv" in line
    ]
    assert lines, result.stdout + result.stderr
    text = lines[0].replace("\x1b[32m", "").replace("\x1b[0m", "")
    assert "enabled" in text
    assert "OK" in text


@pytest.mark.timeout(200)
def test_the_typescript_model_unit_tests_pass() -> None:
    npx = shutil.which("npx")
    if npx is None or not (LABEXTENSION / "node_modules").is_dir():
        pytest.skip("node/npm or labextension/node_modules missing: run ./dev")
    result = subprocess.run(
        [npx, "vitest", "run", "--reporter=verbose"],
        cwd=LABEXTENSION,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "CI": "1", "NO_COLOR": "1"},
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
