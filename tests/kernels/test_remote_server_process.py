"""Kernels on a Dask node started by a ``jupyter server`` in its own process (the way people
run it), across the server's own lifecycle: a restart of the kernel through REST gives a
fresh kernel on the same node; a server stopped as usual (SIGTERM) shuts its cluster
kernels down on their nodes (no process, no env reference, no directory left); the same
server started again starts kernels on the cluster as before.

A server killed without a word is in ``test_remote_failures.py`` (the kernel's lease)."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.kernels import install_kernelspec
from tests.jupyter_process import JupyterProcess
from tests.kernels.dask_nodes import DaskNodes, alive, ancestors, wait_until

pytest.importorskip("distributed")
pytestmark = pytest.mark.timeout(400)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[DaskNodes]:
    (tmp_path / "cluster").mkdir()
    cluster = DaskNodes(tmp_path / "cluster")
    try:
        yield cluster
    finally:
        cluster.stop()


def serve(tmp_path: Path) -> JupyterProcess:
    """``jupyter server`` finding the test's kernelspecs; a second call on the same
    ``tmp_path`` is the same server started again."""
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "JUPYTER_PATH": str(tmp_path / "share" / "jupyter"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTER_RUNTIMEENV_CACHE": str(tmp_path / "server-cache"),
    }
    log = tmp_path / f"server-{len(list(tmp_path.glob('server-*.log')))}.log"
    return JupyterProcess("jupyter_server", root, log, env=env)


def call(server: JupyterProcess, method: str, path: str, body: Any = None) -> Any:
    """A REST call with room for a kernel's start (its env is built on a node first)."""
    request = urllib.request.Request(
        server.url + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"token {server.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=240) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def kernel_on_nodes(nodes: DaskNodes, kernel_id: str) -> tuple[str, dict[str, Any]] | None:
    """(node, the node's record of the kernel) for a kernel some node knows."""
    for node, kernels in nodes.node_kernels().items():
        if isinstance(kernels, dict) and kernel_id in kernels:
            return node, kernels[kernel_id]
    return None


def test_a_server_restarts_its_kernel_on_the_node_and_shuts_it_down_when_it_stops(
    nodes: DaskNodes, tmp_path: Path
) -> None:
    install_kernelspec("crunch", {"env_vars": {"K": "v"}}, prefix=str(tmp_path), dask=nodes.address)
    server = serve(tmp_path)
    try:
        kernel_id = call(server, "POST", "api/kernels", {"name": "crunch"})["id"]
        found = kernel_on_nodes(nodes, kernel_id)
        assert found is not None
        assert found[1]["running"]
        node, first = found
        assert nodes.worker_pids()[node] == ancestors(first["pid"])[0]

        # A restart through REST: a fresh kernel, on the same node, the old one gone.
        call(server, "POST", f"api/kernels/{kernel_id}/restart")
        wait_until(lambda: not alive(first["pid"]), 60, "the old kernel to end")
        again = kernel_on_nodes(nodes, kernel_id)
        assert again is not None
        assert again[0] == node
        assert again[1]["running"]
        assert again[1]["pid"] != first["pid"]
        assert nodes.worker_pids()[node] == ancestors(again[1]["pid"])[0]

        # The server stops as usual (SIGTERM): it shuts its kernels down, on the node too.
        server.stop()
        assert kernel_on_nodes(nodes, kernel_id) is None
        assert not alive(again[1]["pid"])
        holder = f"kernel:{kernel_id}"
        assert all(holder not in e["holders"] for e in nodes.node_envs()[node])
        assert not any((root / "kernels" / kernel_id).exists() for root in nodes.cache_roots)

        # Started again, the server starts kernels on the cluster as before.
        server = serve(tmp_path)
        second = call(server, "POST", "api/kernels", {"name": "crunch"})["id"]
        found = kernel_on_nodes(nodes, second)
        assert found is not None
        assert found[1]["running"]
        call(server, "DELETE", f"api/kernels/{second}")
        wait_until(lambda: not alive(found[1]["pid"]), 60, "the second kernel to end")
        assert kernel_on_nodes(nodes, second) is None
    finally:
        server.stop()
