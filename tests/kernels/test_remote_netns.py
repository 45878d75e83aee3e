"""A kernel on a node that is not this machine's network: each ``dask worker`` runs in a
network namespace of its own, on a private /24 made (and removed) by the test, joined to
this namespace by a veth on a bridge. The kernel binds its node's address (not the server's,
not 127.0.0.1) and the kernel manager here reaches it across the veth, as across a network.
Root only (``ip netns``); skipped elsewhere."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

from jupyter_runtimeenv.kernels import install_kernelspec
from tests.kernels import netns
from tests.kernels.dask_nodes import DaskNodes, alive, ancestors, listening, wait_until

pytest.importorskip("distributed")
pytestmark = pytest.mark.timeout(300)


def test_a_kernel_in_another_network_namespace_is_reached_across_the_veth(tmp_path: Path) -> None:
    why = netns.available()
    if why is not None:
        pytest.skip(why)
    net = netns.PrivateNet(2)
    cluster: DaskNodes | None = None
    try:
        (tmp_path / "cluster").mkdir()
        cluster = DaskNodes(
            tmp_path / "cluster",
            scheduler_host=net.gateway,
            worker_hosts=net.addresses,
            wrap=net.wrap,
        )
        install_kernelspec(
            "far", {"env_vars": {"K": "far"}}, prefix=str(tmp_path), dask=cluster.address
        )
        specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "share" / "jupyter" / "kernels")])
        km = KernelManager(kernel_name="far", kernel_spec_manager=specs)
        km.start_kernel()
        client = km.blocking_client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=120)
            node = km.provisioner.node  # type: ignore[union-attr]
            node_ip = node.split("://", 1)[1].rsplit(":", 1)[0]
            assert node_ip in net.addresses
            info = json.loads(Path(km.connection_file).read_text())
            assert info["ip"] == node_ip  # the node's own address, across the veth

            out: list[str] = []
            reply = client.execute_interactive(
                "import os; print(os.environ['K'], os.getpid())",
                output_hook=lambda m: out.append(m["content"].get("text", "")),
                timeout=120,
            )
            assert reply["content"]["status"] == "ok"
            value, pid_text = "".join(out).split()
            assert value == "far"
            pid = int(pid_text)
            assert ancestors(pid)[0] == cluster.worker_pids()[node]
            bound = listening(pid)
            channels = [km.shell_port, km.iopub_port, km.stdin_port, km.control_port, km.hb_port]
            assert {(node_ip, port) for port in channels} <= bound
            # Nothing else faces the network: ipykernel's own IOPub pipe (for forked
            # subprocesses) is on the node's loopback, and nothing binds 0.0.0.0.
            assert {ip for ip, _ in bound} == {node_ip, "127.0.0.1"}, bound
            # Not reachable on this namespace's loopback: it is bound to the node's address.
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", km.shell_port), 1).close()

            km.interrupt_kernel()  # through the node agent, in the node's namespace
            reply = client.execute_interactive("1 + 1", timeout=60)
            assert reply["content"]["status"] in ("ok", "aborted")
        finally:
            client.stop_channels()
            km.shutdown_kernel()
        wait_until(lambda: not alive(pid), 30, "the kernel to end")
        assert km.kernel_id not in cluster.node_kernels()[node]
    finally:
        if cluster is not None:
            cluster.stop()
        net.close()
    assert net.leftovers() == []
