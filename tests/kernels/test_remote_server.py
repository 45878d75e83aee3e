"""Kernels on a Dask node started by a real Jupyter server (pytest-jupyter, in this process):
the build's progress in the server's event stream naming the node, the server's own kernel
manager talking ZMQ to the node, culling of an idle kernel, and a node's death shown as the
kernel's, once, without a restart elsewhere."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.kernels import install_kernelspec
from jupyter_runtimeenv.kernels.cluster import KERNEL_SCHEMA_ID
from tests.kernels.dask_nodes import DaskNodes, alive
from tests.wheelhouse import make_wheelhouse

pytest.importorskip("distributed")
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaskNodes]:
    root = tmp_path_factory.mktemp("cluster")
    wheelhouse = make_wheelhouse(root / "wheelhouse")
    offline = {"UV_NO_INDEX": "1", "UV_FIND_LINKS": str(wheelhouse), "UV_OFFLINE": "1"}
    cluster = DaskNodes(root, env=offline)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def jp_server_config(tmp_path: Path) -> dict[str, Any]:
    return {
        "ServerApp": {
            "jpserver_extensions": {"jupyter_runtimeenv": True, "jupyter_server_terminals": False},
            "allow_unauthenticated_access": False,
        },
        "RuntimeEnvExtension": {"cache_dir": str(tmp_path / "server-cache")},
        # Idle kernels are culled after 4 s (checked every second).
        "MappingKernelManager": {"cull_idle_timeout": 4, "cull_interval": 1},
    }


class Recorder:
    """The kernel events the server's event logger emits."""

    def __init__(self, serverapp: Any) -> None:
        self.events: list[dict[str, Any]] = []
        serverapp.event_logger.add_listener(schema_id=KERNEL_SCHEMA_ID, listener=self.listen)

    async def listen(self, logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        self.events.append(dict(data))

    def kinds(self, kernel_id: str) -> list[str]:
        return [e["kind"] for e in self.events if e["kernel_id"] == kernel_id]


async def eventually(predicate: Any, timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.1)


async def start(jp_fetch: Any, name: str) -> str:
    # A start builds the env on a node first: minutes on a loaded machine, not 20 s.
    body = json.dumps({"name": name})
    response = await jp_fetch("api", "kernels", method="POST", body=body, request_timeout=240)
    return str(json.loads(response.body)["id"])


async def run_in(km: Any, code: str) -> str:
    client = km.client()
    client.start_channels()
    out: list[str] = []
    try:
        await client.wait_for_ready(timeout=120)
        reply = await client.execute_interactive(
            code, output_hook=lambda m: out.append(m["content"].get("text", "")), timeout=120
        )
    finally:
        client.stop_channels()
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(out)


async def test_the_build_shows_in_the_event_stream_and_the_server_talks_to_the_node(
    nodes: DaskNodes, jp_serverapp: Any, jp_fetch: Any
) -> None:
    recorder = Recorder(jp_serverapp)
    install_kernelspec(
        "crunch", {"pip": ["alpha==1.0"], "env_vars": {"K": "v"}}, dask=nodes.address
    )
    specs = json.loads((await jp_fetch("api", "kernelspecs")).body)["kernelspecs"]
    assert specs["crunch"]["spec"]["display_name"] == "crunch (cluster)"

    kernel_id = await start(jp_fetch, "crunch")
    km = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    node = km.provisioner.node
    out = await run_in(km, "import os, alpha; print(os.environ['K'], alpha.__version__)")
    assert out.split() == ["v", "1.0"]

    mine = [e for e in recorder.events if e["kernel_id"] == kernel_id]
    kinds = [e["kind"] for e in mine]
    for expected in ("placing", "placed", "staging", "state", "step", "log", "started"):
        assert expected in kinds, kinds
    assert kinds.index("placed") < kinds.index("staging") < kinds.index("started")
    assert all(e["node"] == node for e in mine if e["kind"] != "placing")
    pip_steps = [e for e in mine if e["kind"] == "step" and e["step"].startswith("pip")]
    assert {e["status"] for e in pip_steps} >= {"running", "done"}
    assert any("alpha" in line for e in mine if e["kind"] == "log" for line in e["lines"])
    ready = [e for e in mine if e["kind"] == "state" and e.get("state") == "READY"]
    assert ready
    assert all("key" not in json.dumps(e) for e in mine)

    await jp_fetch("api", "kernels", kernel_id, method="DELETE", request_timeout=120)
    await eventually(lambda: "stopped" in recorder.kinds(kernel_id), 30, "the stopped event")


async def test_an_idle_cluster_kernel_is_culled_and_leaves_nothing(
    nodes: DaskNodes, jp_serverapp: Any, jp_fetch: Any
) -> None:
    install_kernelspec("idle", {"env_vars": {"I": "1"}}, dask=nodes.address)
    kernel_id = await start(jp_fetch, "idle")
    km = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    node = km.provisioner.node
    pid = nodes.node_kernels()[node][kernel_id]["pid"]
    await eventually(
        lambda: kernel_id not in jp_serverapp.kernel_manager.list_kernel_ids(), 60, "the cull"
    )
    await eventually(lambda: not alive(pid), 30, "the culled kernel's process to end")
    await eventually(
        lambda: kernel_id not in nodes.node_kernels()[node], 30, "the node to forget it"
    )
    held = [e for e in nodes.node_envs()[node] if f"kernel:{kernel_id}" in e["holders"]]
    assert held == []


async def test_a_lost_node_shows_the_kernel_dead_once_and_it_is_not_restarted(
    jp_serverapp: Any, jp_fetch: Any, tmp_path: Path
) -> None:
    (tmp_path / "lost").mkdir()
    cluster = await asyncio.to_thread(DaskNodes, tmp_path / "lost")
    try:
        recorder = Recorder(jp_serverapp)
        install_kernelspec("fragile", {}, dask=cluster.address)
        kernel_id = await start(jp_fetch, "fragile")
        manager = jp_serverapp.kernel_manager
        node = manager.get_kernel(kernel_id).provisioner.node
        pid = cluster.node_kernels()[node][kernel_id]["pid"]
        await asyncio.to_thread(cluster.kill_worker, node)
        # The restarter declares it dead; the server forgets it (as for any dead kernel).
        await eventually(lambda: kernel_id not in manager.list_kernel_ids(), 60, "the dead kernel")
        await eventually(lambda: not alive(pid), 30, "the orphaned kernel to end")
        kinds = recorder.kinds(kernel_id)
        assert kinds.count("lost") == 1
        assert kinds.count("started") == 1  # never restarted on the other node
        (lost,) = [e for e in recorder.events if e["kind"] == "lost"]
        assert lost["message"] == (
            f"kernel {kernel_id} is dead: its Dask worker {node} left the cluster (lost)"
        )
    finally:
        await asyncio.to_thread(cluster.stop)
