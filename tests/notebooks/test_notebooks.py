"""Every notebook in ``notebooks/``, executed by nbclient in two modes:

- ``embedded``: a kernel of this interpreter started by nbclient, with the agent embedded in
  the kernel (no server);
- ``server``: a real ``jupyter server`` (a subprocess, on a free port, token auth) whose
  extension hosts the agent; the kernel is started by that server (``POST /api/kernels``),
  inherits the agent's URL and token from it, and nbclient executes the notebook through the
  kernel's connection file. The envs are then the server's (``GET envs``).

Each run is on a copy of the notebooks directory (the kernel's cwd), offline (uv may not
reach an index), and asserts on the cells' text outputs.

(pytest-jupyter's in-process server is not used here: nbclient's client and the in-process
server share one event loop, and a kernel's synchronous requests to the agent then wait on
a loop that waits for the kernel.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_process import JupyterProcess
from kernel_process import kernel_manager
from nbclient import NotebookClient

from jupyter_runtimeenv.quickstart import text_outputs

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
PLUGINS = ["nb_plugins.LowPriority", "nb_plugins.InjectVars"]
MODES = ["embedded", "server"]


def copy_notebooks(into: Path) -> Path:
    target = into / "notebooks"
    shutil.copytree(
        NOTEBOOKS, target, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    )
    return target


class Server(JupyterProcess):
    """A ``jupyter server`` subprocess with the extension, its root a copy of ``notebooks/``."""

    def __init__(self, root: Path) -> None:
        self.runtime = root / "runtime"
        self.folder = copy_notebooks(root)
        config = root / "config"
        config.mkdir()
        settings = {"RuntimeEnvExtension": {"allowed_plugins": PLUGINS}}
        (config / "jupyter_server_config.json").write_text(json.dumps(settings))
        env = {
            **os.environ,
            "JUPYTER_RUNTIME_DIR": str(self.runtime),
            "JUPYTER_DATA_DIR": str(root / "data"),
            "JUPYTER_CONFIG_DIR": str(config),
            "JUPYTER_RUNTIMEENV_CACHE": str(root / "cache"),
            # The server imports the notebook's plugins (named by import path) too.
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(self.folder), os.environ.get("PYTHONPATH")])
            ),
        }
        extensions = "{'jupyter_runtimeenv': True, 'jupyter_server_terminals': False}"
        super().__init__(
            "jupyter_server",
            root,
            root / "server.log",
            env=env,
            args=[f"--ServerApp.jpserver_extensions={extensions}"],
        )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path / "server")
    try:
        yield running
    finally:
        running.stop()


def connect(connection_file: Path) -> BlockingKernelClient:
    """A client of a kernel someone else started. A fresh client's heartbeat check may call a
    kernel that is still starting dead: try again until it answers (60 s at most)."""
    deadline = time.monotonic() + 60
    while True:
        kc = BlockingKernelClient(connection_file=str(connection_file))
        kc.load_connection_file()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=max(1.0, deadline - time.monotonic()))
            return kc
        except RuntimeError:
            kc.stop_channels()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run_in_server(server: Server, name: str) -> nbformat.NotebookNode:
    kernel = server.request("POST", "api/kernels", {"name": "python3", "path": "notebooks"})
    try:
        kc = connect(server.runtime / f"kernel-{kernel['id']}.json")
        try:
            nb = nbformat.read(server.folder / name, as_version=4)
            client = NotebookClient(nb, timeout=240)
            client.kc = kc  # the server's kernel: nbclient neither starts nor stops it
            client.reset_execution_trackers()
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)
            return nb
        finally:
            kc.stop_channels()
    finally:
        server.request("DELETE", f"api/kernels/{kernel['id']}")


def run_embedded(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> nbformat.NotebookNode:
    folder = copy_notebooks(tmp_path)
    monkeypatch.setenv("JUPYTER_RUNTIMEENV_CACHE", str(tmp_path / "cache"))
    nb = nbformat.read(folder / name, as_version=4)
    with kernel_manager() as km:  # stopped after (nbclient leaves a given manager's kernel)
        NotebookClient(
            nb,
            km=km,
            timeout=240,
            kernel_name="python3",
            resources={"metadata": {"path": str(folder)}},
        ).execute()
    return nb


def execute(name: str, mode: str, request: pytest.FixtureRequest) -> list[str]:
    """Run notebook ``name`` in ``mode``; the text outputs of each code cell. In server mode,
    the envs that reached READY must be the server's."""
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setenv("UV_OFFLINE", "1")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    if mode == "server":
        server: Server = request.getfixturevalue("server")
        nb = run_in_server(server, name)
        envs = server.api("GET", "envs")["envs"]
        assert [e for e in envs if e["state"] == "READY"], envs
    else:
        nb = run_embedded(request.getfixturevalue("tmp_path"), name, monkeypatch)
    return ["\n".join(text_outputs(cell)) for cell in nb.cells if cell.cell_type == "code"]


@pytest.mark.parametrize("mode", MODES)
def test_quickstart(mode: str, request: pytest.FixtureRequest) -> None:
    text = "\n".join(execute("quickstart.ipynb", mode, request))
    assert "crunching data.csv: 3 rows, MODE=fast" in text
    assert "{'greeting': 'hello, fast!', 'doubled_total': 30}" in text
    assert "computed in worker True" in text
    assert "{'hello': 'hello, fast!', 'double': 8}" in text
    assert "MODE is slow" in text
    assert re.search(r"^\(default\) +[0-9a-f]{12}  READY$", text, re.MULTILINE)
    assert re.search(r"^slow +[0-9a-f]{12}  READY$", text, re.MULTILINE)
    assert "tasks: 20/20 finished (20 done, 0 failed" in text


@pytest.mark.parametrize("mode", MODES)
def test_plugins(mode: str, request: pytest.FixtureRequest) -> None:
    text = "\n".join(execute("plugins.ipynb", mode, request))
    assert 'ctx.command_prefix[:0] = ["nice", "-n"' in text
    assert "niceness 10" in text  # the worker runs under nice -n 10
    assert re.search(r"^STAGE demo built by \S+@\S+$", text, re.MULTILINE)
    found = re.search(r"^kernel (\d+) worker (\d+)$", text, re.MULTILINE)
    assert found is not None
    assert int(found.group(2)) == int(found.group(1)) + 10
    assert (
        "UsageError: runtime_env: invalid spec: plugins.nb_plugins.LowPriority.niceness:"
        " expected an integer from 1 to 19, got 99"
    ) in text


@pytest.mark.parametrize("mode", MODES)
def test_kernels(mode: str, request: pytest.FixtureRequest) -> None:
    cells = execute("kernels.ipynb", mode, request)
    assert '"provisioner_name": "runtime-env-provisioner"' in cells[0]
    assert cells[1].splitlines() == ["hello, kernel!", "True"]
    assert "/resources/pip/" in cells[2]  # the kernel runs on the env's own venv
    assert cells[3].strip() == "kernel stopped"
