"""``python -m jupyter_runtimeenv.quickstart``: the quickstart notebook, headless, in a real
kernel of this interpreter, on a fresh cache, offline (uv may not reach any index)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat

from jupyter_runtimeenv.quickstart import default_notebook


def run_quickstart(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JUPYTER_RUNTIMEENV_CACHE": str(cache), "UV_OFFLINE": "1"}
    env.pop("JUPYTER_RUNTIMEENV_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "jupyter_runtimeenv.quickstart", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )


def test_the_notebook_is_small_valid_and_cleared() -> None:
    nb = nbformat.read(default_notebook(), as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == []
            assert cell.execution_count is None
    assert (default_notebook().parent / "wheels" / "greeting-1.0-py3-none-any.whl").is_file()


def test_quickstart_runs_end_to_end(tmp_path: Path) -> None:
    result = run_quickstart(tmp_path / "cache")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "[1/15] %load_ext jupyter_runtimeenv" in out
    # The eager build: its steps, the offline install, then the summary line.
    assert "building runtime env" in out
    assert "installing greeting==1.0 with uv" in out
    assert "+ greeting==1.0" in out
    # crunch: the data file of the working dir, mymodule, greeting and MODE, with its
    # print forwarded from the worker.
    assert "crunching data.csv: 3 rows, MODE=fast" in out
    assert "{'greeting': 'hello, fast!', 'doubled_total': 30}" in out
    assert "[0, 1, 8, 27, 64, 125, 216, 343]" in out
    # The remote exception, caught as its own type, with the worker's traceback.
    assert "caught RemoteTaskError[FileNotFoundError]" in out
    assert "No such file or directory: 'missing.csv'" in out
    # A %%remote cell: its print streamed without a task prefix, --out brought back.
    assert "[8/15] %%remote --out summary\n    computed in worker True\n" in out
    assert "{'hello': 'hello, fast!', 'double': 8}" in out
    # A named env, used by a cell and by .options, listed with its id and state.
    assert "    MODE is slow\n" in out
    assert '[12/15] cube.options(runtime_env="slow").remote(5).result()\n    125\n' in out
    assert re.search(r"^    slow +[0-9a-f]{12}  READY$", out, re.MULTILINE)
    assert "tasks: 20/20 finished (20 done, 0 failed, 0 running, 0 queued)" in out
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("quickstart: OK, 15 code cells run in ")
    assert "envs built: " in summary
    assert "none" not in summary.split("envs built: ")[1].split(";")[0]
    # The checkout's notebook was not written to.
    assert all(c.get("outputs", []) == [] for c in nbformat.read(default_notebook(), 4).cells)


def test_a_failing_cell_fails_the_run(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("print('first')"),
            nbformat.v4.new_code_cell("%load_ext jupyter_runtimeenv\n%runtime_env --env-var X"),
            nbformat.v4.new_code_cell("print('never')"),
        ]
    )
    path = tmp_path / "broken.ipynb"
    nbformat.write(nb, path)

    result = run_quickstart(tmp_path / "cache", "--notebook", str(path))

    assert result.returncode == 1
    assert "first" in result.stdout
    assert "never" not in result.stdout
    assert "FAILED in the cell starting '%load_ext jupyter_runtimeenv'" in result.stderr
    assert "env_vars: expected KEY=VALUE" in result.stderr


def test_a_missing_notebook_is_one_clear_line(tmp_path: Path) -> None:
    result = run_quickstart(tmp_path / "cache", "--notebook", str(tmp_path / "no-such.ipynb"))
    assert result.returncode == 2
    assert "source checkout" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_line_split_across_stream_outputs_is_one_line() -> None:
    from jupyter_runtimeenv.quickstart import text_outputs

    cell = {
        "outputs": [
            {"output_type": "stream", "name": "stdout", "text": "caught"},
            {"output_type": "stream", "name": "stdout", "text": " it\nnext\n"},
            {"output_type": "stream", "name": "stderr", "text": "warned\n"},
            {"output_type": "execute_result", "data": {"text/plain": "42"}},
            {"output_type": "error", "ename": "E", "evalue": "v"},
        ]
    }
    assert text_outputs(cell) == ["caught it", "next", "warned", "42", "E: v"]
