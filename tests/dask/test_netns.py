"""The cluster as real machines: each Dask worker in a network namespace of its own (a private
/24 the test makes and removes, one veth each on a bridge) and a mount namespace of its own in
which the driver's directories are hidden under a tmpfs. So nothing reaches a node through
127.0.0.1 (each node's loopback is its own) or through the driver's disk: the working_dir and
the module a task needs get there only as blobs, sent once by the driver and copied between
the nodes across the veths.

Root only (``ip netns``, ``unshare --mount``); skipped elsewhere. Names carry the test
process's pid; everything is deleted in a ``finally`` (``netns.PrivateNet.close``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

import jupyter_runtimeenv as jre
from jupyter_runtimeenv import api
from tests.kernels import netns
from tests.kernels.dask_nodes import DaskNodes

pytest.importorskip("distributed")
pytestmark = pytest.mark.timeout(600)


def _hidden_mount(net: netns.PrivateNet, hidden: Path) -> Any:
    """Worker ``i``'s command prefix: its network namespace, then a private mount namespace
    with a tmpfs over the driver's directory."""
    script = f'mount -t tmpfs -o size=1m,mode=0700 jre-hidden "{hidden}" && exec "$@"'

    def wrap(i: int) -> list[str]:
        unshare = ["unshare", "--mount", "--propagation", "private"]
        return [*net.wrap(i), *unshare, "sh", "-c", script, "jre-node"]

    return wrap


def test_nodes_on_their_own_network_and_disk_get_everything_as_blobs(tmp_path: Path) -> None:
    why = netns.available()
    if why is None and shutil.which("unshare") is None:
        why = "needs util-linux (unshare)"
    if why is not None:
        pytest.skip(why)
    hidden = tmp_path / "driver"
    work = hidden / "D"
    (work / "sub").mkdir(parents=True)
    (work / "data.txt").write_text("from the driver\n")
    (work / "sub" / "big.bin").write_bytes(os.urandom(300_000))
    modules = hidden / "mods"
    modules.mkdir()
    (modules / "helper.py").write_text("VALUE = 'shipped, not mounted'\n")
    tree_bytes = 300_000 + len("from the driver\n")

    net = netns.PrivateNet(2)
    cluster: DaskNodes | None = None
    executor: Any = None
    shell = InteractiveShell.instance(config=_config())
    try:
        (tmp_path / "cluster").mkdir()
        cluster = DaskNodes(
            tmp_path / "cluster",
            scheduler_host=net.gateway,
            worker_hosts=net.addresses,
            wrap=_hidden_mount(net, hidden),
        )
        nodes = cluster.worker_pids()
        # Each node is at its own address, and sees an empty tmpfs where the driver's files are.
        assert {a.split("://")[1].rsplit(":", 1)[0] for a in nodes} == set(net.addresses)
        # (os.listdir is pickled by reference: the nodes import it, not this test module.)
        seen = cluster.client.run(os.listdir, str(hidden))
        assert all(listing == [] for listing in seen.values()), seen
        namespaces = set()
        for pid in nodes.values():
            net_ns, mount_ns = (os.readlink(f"/proc/{pid}/ns/{kind}") for kind in ("net", "mnt"))
            # Its own network and mount namespaces: not this process's, not the other node's.
            assert net_ns != os.readlink("/proc/self/ns/net")
            assert mount_ns != os.readlink("/proc/self/ns/mnt")
            namespaces.add((net_ns, mount_ns))
        assert len(namespaces) == len(nodes)

        from jupyter_runtimeenv.dask import DaskExecutor

        executor = DaskExecutor(cluster.client, driver_cache_dir=hidden / "cache")
        api.init(executor=executor)
        shell.run_line_magic("load_ext", "jupyter_runtimeenv")
        out = _run(
            shell,
            f"--env-var K=V --working-dir {work} --py-module {modules / 'helper.py'}"
            " --no-widget --no-driver-sys-path",
        )
        lines = out.strip().splitlines()
        for address in nodes:
            assert any(line.startswith(f"{address}  READY  env ") for line in lines), out
        assert " ready on 2/2 nodes (" in lines[-1]
        # Each blob left the driver once; the other node copied it across the veths.
        assert executor.bytes_sent >= tree_bytes
        assert executor.bytes_sent < 2 * tree_bytes
        assert executor.peer_bytes >= tree_bytes

        shutil.rmtree(work)  # gone here too: the nodes have their own copies

        @jre.remote
        def task() -> tuple[str, list[str], str, str, str]:
            import helper

            with open("data.txt") as f:
                data = f.read()
            return os.environ["K"], sorted(os.listdir(".")), helper.VALUE, data, os.getcwd()

        results = jre.get([task.remote() for _ in range(4)], timeout=180)
        roots = [str(root) for root in cluster.cache_roots]
        for k, listing, value, data, cwd in results:
            assert (k, listing, value, data) == (
                "V",
                ["data.txt", "sub"],
                "shipped, not mounted",
                "from the driver\n",
            )
            assert any(cwd.startswith(root + os.sep) for root in roots)  # the node's cache
    finally:
        api.shutdown()
        if executor is not None:
            executor.shutdown()
        if cluster is not None:
            cluster.stop()
        net.close()
    assert net.leftovers() == []


def _config() -> Config:
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    return config


def _run(shell: InteractiveShell, line: str) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        shell.run_line_magic("runtime_env", line)
    return out.getvalue()
