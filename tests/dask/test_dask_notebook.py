"""``notebooks/dask.ipynb`` runs headless in a real kernel against its own ``LocalCluster``,
offline, on a fresh cache (through the quickstart runner, which runs any notebook)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

pytest.importorskip("distributed")

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "dask.ipynb"


def test_the_notebook_is_valid_and_cleared() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == []
            assert cell.execution_count is None


def test_the_dask_notebook_runs(tmp_path: Path) -> None:
    env = {**os.environ, "JUPYTER_RUNTIMEENV_CACHE": str(tmp_path / "cache"), "UV_OFFLINE": "1"}
    env.pop("JUPYTER_RUNTIMEENV_URL", None)
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    result = subprocess.run(
        [sys.executable, "-m", "jupyter_runtimeenv.quickstart", "--notebook", str(NOTEBOOK)],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "workers: 2" in out
    # Plain %runtime_env built on both nodes: a line per node (the widget's text form in
    # a kernel), then the summary; each file left the notebook once.
    lines = [line.strip() for line in out.splitlines()]
    assert (
        sum(line.startswith("tcp://127.0.0.1:") and "  READY  env " in line for line in lines) == 2
    )
    assert any(" ready on 2/2 nodes (" in line for line in lines)
    assert "shipped " in out
    assert "shipped 0 files" not in out
    assert "(crunch node=127.0.0.1:" in out
    assert "crunching data.csv: 3 rows, MODE=cluster" in out
    assert "{'greeting': 'hello, cluster!', 'doubled_total': 30}" in out
    assert "[0, 1, 8, 27, 64, 125, 216, 343]" in out
    assert "caught RemoteTaskError[FileNotFoundError]" in out
    assert out.strip().splitlines()[-1].startswith("quickstart: OK, 8 code cells run in ")
