"""Issue 17's first done-when, word for word, in a real kernel: a notebook on
``LocalCluster(n_workers=2, processes=True, host="127.0.0.1")``, each node its own cache root
(``DaskExecutor(client, node_cache_dir=...)``), runs ``%runtime_env --env-var K=V
--working-dir D --no-widget``: a line per node naming its address, then the ready summary; a
task then sees ``K`` and the files of ``D``, with ``D`` deleted on the driver first.

The notebook runs headless through the quickstart runner (nbclient, an ipykernel of this
interpreter). Every process it started carries a marker in its environment; none may be left
once the runner is done.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import nbformat
import psutil
import pytest

from tests.processes import cmdline, kill, wait_gone

pytest.importorskip("distributed")

SETUP = """\
%load_ext jupyter_runtimeenv
import os, pathlib, shutil
from distributed import Client, LocalCluster
from jupyter_runtimeenv import init
from jupyter_runtimeenv.dask import DaskExecutor

cluster = LocalCluster(
    n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
    dashboard_address="127.0.0.1:0",
)
client = Client(cluster)
executor = DaskExecutor(client, node_cache_dir={nodes!r} + "/node-{{name}}")
init(executor=executor)
print("nodes:", " ".join(sorted(client.scheduler_info()["workers"])))
"""

BUILD = "%runtime_env --env-var K=V --working-dir D --no-widget"

TASK = """\
shutil.rmtree("D")  # the driver's copy is gone before the task
print("D on the driver:", pathlib.Path("D").exists())

@remote
def look():
    return os.environ["K"], sorted(os.listdir(".")), open("sub/more.txt").read().strip()

print("seen:", get([look.remote() for _ in range(4)], timeout=120))
"""

TEARDOWN = """\
from jupyter_runtimeenv import shutdown
shutdown()
executor.shutdown()
client.close()
cluster.close()
print("closed")
"""


def _marked(marker: str) -> list[int]:
    """Pids of live processes whose environment carries ``marker`` (vanishing ones skipped)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("JRE_TEST_MARKER") == marker:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    return found


def test_runtime_env_in_a_kernel_prints_a_line_per_node_and_tasks_see_it(tmp_path: Path) -> None:
    work = tmp_path / "nb"
    (work / "D" / "sub").mkdir(parents=True)
    (work / "D" / "data.txt").write_text("on the driver only\n")
    (work / "D" / "sub" / "more.txt").write_text("shipped by content\n")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(source)
        for source in (SETUP.format(nodes=str(tmp_path / "nodes")), BUILD, TASK, TEARDOWN)
    ]
    notebook = work / "done_when.ipynb"
    nbformat.write(nb, notebook)
    marker = f"{os.getpid()}-{uuid.uuid4().hex}"
    env = {
        **os.environ,
        "JUPYTER_RUNTIMEENV_CACHE": str(tmp_path / "cache"),
        "UV_OFFLINE": "1",
        "JRE_TEST_MARKER": marker,
    }
    env.pop("JUPYTER_RUNTIMEENV_URL", None)
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "jupyter_runtimeenv.quickstart", "--notebook", str(notebook)],
            env=env,
            capture_output=True,
            text=True,
            timeout=280,
            check=False,
        )
        out = result.stdout
        assert result.returncode == 0, out + result.stderr
        lines = [line.strip() for line in out.splitlines()]
        nodes = next(line for line in lines if line.startswith("nodes: ")).split()[1:]
        assert len(nodes) == 2, out
        assert all(n.startswith("tcp://127.0.0.1:") for n in nodes), out
        # One line per node naming its address, then the summary.
        built = lines[lines.index(f"[2/4] {BUILD}") + 1 :]
        for node in nodes:
            assert sum(line.startswith(f"{node}  READY  env ") for line in built) == 1, out
        summary = next(line for line in built if line.startswith("runtime env "))
        assert " ready on 2/2 nodes (" in summary, out
        assert "D on the driver: False" in out
        seen = "seen: " + repr([("V", ["data.txt", "sub"], "shipped by content")] * 4)
        assert seen in lines, out
        assert "closed" in lines, out
    finally:
        # Nothing the notebook started (kernel, Dask nanny and workers, env workers) is left.
        left = wait_gone(_marked(marker), timeout=60)
        for pid in left:
            kill(pid)
    assert not left, [cmdline(pid) for pid in left]
