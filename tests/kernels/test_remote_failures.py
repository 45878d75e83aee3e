"""Kernels on a Dask node that cannot start, or die: each is one clear line naming the node
(or the scheduler, before there is a node), never a hang, and nothing is left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

from jupyter_runtimeenv.errors import KernelStartError
from jupyter_runtimeenv.kernels import install_kernelspec
from tests.kernels.dask_nodes import DaskNodes, alive, wait_until
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


def install(prefix: Path, name: str, spec: dict[str, Any], address: str, **config: Any) -> None:
    """A ``--dask`` kernelspec, with provisioner ``config`` (timeouts) and argv changed."""
    path = Path(install_kernelspec(name, spec, prefix=str(prefix), dask=address))
    kernel = json.loads((path / "kernel.json").read_text())
    argv = config.pop("argv", None)
    if argv is not None:
        kernel["argv"] = argv
    kernel["metadata"]["kernel_provisioner"]["config"].update(config)
    (path / "kernel.json").write_text(json.dumps(kernel))


def start_fails(prefix: Path, name: str, nodes: DaskNodes | None = None) -> KernelStartError:
    """The one-line error of a start that fails; with ``nodes``, also that nothing of the
    kernel is left on them (no process, no env reference, no directory)."""
    specs = KernelSpecManager(kernel_dirs=[str(prefix / "share" / "jupyter" / "kernels")])
    km = KernelManager(kernel_name=name, kernel_spec_manager=specs)
    try:
        with pytest.raises(KernelStartError) as failed:
            km.start_kernel()
    finally:
        if km.has_kernel:
            km.shutdown_kernel(now=True)
        # No cleanup_resources(): the provisioner must leave nothing without it (a kernel
        # manager does not clean up after a start that raised).
    message = str(failed.value)
    assert "\n" not in message, message
    if nodes is not None:
        holder = f"kernel:{km.kernel_id}"
        assert all(km.kernel_id not in known for known in nodes.node_kernels().values())
        envs = [e for each in nodes.node_envs().values() for e in each]
        assert all(holder not in e["holders"] for e in envs), envs
        assert not any(
            (root / "kernels" / str(km.kernel_id)).exists() for root in nodes.cache_roots
        )
    return failed.value


def no_kernels_running(nodes: DaskNodes) -> bool:
    return not any(k["running"] for each in nodes.node_kernels().values() for k in each.values())


def test_a_scheduler_that_cannot_be_reached(tmp_path: Path, closed_port: int) -> None:
    address = f"tcp://127.0.0.1:{closed_port}"
    install(tmp_path, "nowhere", {}, address, connect_timeout=2)
    error = start_fails(tmp_path, "nowhere")
    assert str(error).startswith(f"cannot reach the Dask scheduler {address} within 2 s")


def test_a_scheduler_without_workers(tmp_path: Path) -> None:
    (tmp_path / "lonely-root").mkdir()
    lonely = DaskNodes(tmp_path / "lonely-root", worker_hosts=())
    try:
        install(tmp_path, "lonely", {}, lonely.address)
        error = start_fails(tmp_path, "lonely")
        assert str(error) == f"the Dask scheduler {lonely.address} has no workers"
    finally:
        lonely.stop()


def test_a_failed_build_names_the_node_the_step_and_the_installer(
    nodes: DaskNodes, tmp_path: Path
) -> None:
    install(tmp_path, "broken", {"pip": ["no-such-package-anywhere==1.0"]}, nodes.address)
    error = start_fails(tmp_path, "broken", nodes)
    text = str(error)
    assert error.node in nodes.worker_pids()
    assert text.startswith(f"building the kernel's environment failed on Dask worker {error.node}:")
    assert "pip" in text
    assert "no-such-package-anywhere" in text
    assert error.detail  # the installer's tail, for the server's log
    assert no_kernels_running(nodes)


def test_a_kernel_that_does_not_come_up_in_time_is_killed(nodes: DaskNodes, tmp_path: Path) -> None:
    marker = f"never-binds-{os.getpid()}"
    argv = ["python", "-c", f"import time; time.sleep(600)  # {marker}", "{connection_file}"]
    install(tmp_path, "silent", {}, nodes.address, argv=argv, start_timeout=3)
    error = start_fails(tmp_path, "silent", nodes)
    assert str(error).startswith(
        f"the kernel did not come up within 3 s on Dask worker {error.node}"
    )
    assert not _processes_with(marker)
    assert no_kernels_running(nodes)


def test_a_kernel_that_exits_at_start_shows_its_last_line(nodes: DaskNodes, tmp_path: Path) -> None:
    argv = ["python", "-c", "raise SystemExit('no kernel today')", "{connection_file}"]
    install(tmp_path, "quits", {}, nodes.address, argv=argv)
    error = start_fails(tmp_path, "quits", nodes)
    assert str(error) == (
        f"the kernel exited with code 1 while starting on Dask worker {error.node}: no kernel today"
    )


def test_a_killed_node_makes_its_kernel_dead_with_one_message(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    cluster = DaskNodes(tmp_path / "root")
    try:
        install(tmp_path, "doomed", {}, cluster.address)
        specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "share" / "jupyter" / "kernels")])
        km = KernelManager(kernel_name="doomed", kernel_spec_manager=specs)
        km.start_kernel()
        try:
            node = km.provisioner.node  # type: ignore[union-attr]
            kernel_pid = cluster.node_kernels()[node][km.kernel_id]["pid"]
            cluster.kill_worker(node)
            wait_until(lambda: not km.is_alive(), 60, "the kernel manager to see the kernel dead")
            failure = km.provisioner.failure  # type: ignore[union-attr]
            assert (
                failure
                == f"kernel {km.kernel_id} is dead: its Dask worker {node} left the cluster (lost)"
            )
            # The kernel noticed its parent (the Dask worker) is gone and ended itself.
            wait_until(lambda: not alive(kernel_pid), 30, "the orphaned kernel to end")
        finally:
            km.shutdown_kernel(now=True)  # quick: its node is known to be gone
    finally:
        cluster.stop()


def test_a_killed_scheduler_makes_its_kernel_dead_with_one_message(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    cluster = DaskNodes(tmp_path / "root")
    try:
        install(tmp_path, "orphan", {}, cluster.address)
        specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "share" / "jupyter" / "kernels")])
        km = KernelManager(kernel_name="orphan", kernel_spec_manager=specs)
        km.start_kernel()
        try:
            node = km.provisioner.node  # type: ignore[union-attr]
            kernel_pid = cluster.node_kernels()[node][km.kernel_id]["pid"]
            cluster.kill_scheduler()
            # Dask workers close when they lose their scheduler, and take their kernels.
            wait_until(lambda: not alive(kernel_pid), 60, "the kernel to end with its node")
            # The client gives up reconnecting after its timeout (30 s): then the kernel
            # is dead, once, by name (until then it may only be unreachable).
            wait_until(lambda: not km.is_alive(), 120, "the kernel manager to see it dead")
            failure = km.provisioner.failure  # type: ignore[union-attr]
            assert failure == (
                f"kernel {km.kernel_id} is dead: its Dask worker {node} was lost with the"
                f" Dask scheduler {cluster.address} (it cannot be reached)"
            )
        finally:
            km.shutdown_kernel(now=True)  # quick: nothing to ask
    finally:
        cluster.stop()


def _processes_with(marker: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in proc.info["cmdline"] or ()):
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    return found


BUILT_ONLY = """
import json, sys, time
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
specs = KernelSpecManager(kernel_dirs=[sys.argv[1]])
km = KernelManager(kernel_name="leased", kernel_spec_manager=specs)
km.pre_start_kernel()  # placed, env built on the node; ipykernel not started yet
print(json.dumps({"kernel_id": km.kernel_id, "node": km.provisioner.node}), flush=True)
time.sleep(3600)
"""


def test_a_server_that_died_before_its_kernel_ran_leaves_no_env_reference(
    nodes: DaskNodes, tmp_path: Path
) -> None:
    install(tmp_path, "leased", {"env_vars": {"BUILT": "only"}}, nodes.address, lease_timeout=6)
    server = subprocess.Popen(
        [sys.executable, "-c", BUILT_ONLY, str(tmp_path / "share" / "jupyter" / "kernels")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        started = json.loads(server.stdout.readline())
        kernel_id, node = started["kernel_id"], started["node"]
        holder = f"kernel:{kernel_id}"
        assert any(holder in e["holders"] for e in nodes.node_envs()[node])
        server.kill()  # dies between the build and the kernel's start
        server.wait(timeout=30)
        wait_until(lambda: kernel_id not in nodes.node_kernels()[node], 60, "the lease to end")
        assert all(holder not in e["holders"] for e in nodes.node_envs()[node])
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)


SERVER = """
import json, sys, time
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
specs = KernelSpecManager(kernel_dirs=[sys.argv[1]])
km = KernelManager(kernel_name="leased", kernel_spec_manager=specs)
km.start_kernel()
print(json.dumps({"kernel_id": km.kernel_id, "node": km.provisioner.node}), flush=True)
time.sleep(3600)
"""


def test_a_kernel_whose_server_died_is_stopped_when_its_lease_runs_out(
    nodes: DaskNodes, tmp_path: Path
) -> None:
    install(tmp_path, "leased", {}, nodes.address, lease_timeout=9)
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(tmp_path / "share" / "jupyter" / "kernels")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        started = json.loads(server.stdout.readline())
        kernel_id, node = started["kernel_id"], started["node"]
        pid = nodes.node_kernels()[node][kernel_id]["pid"]
        # Alive past its lease while the server renews it (every 3 s, a third of it).
        time.sleep(12)
        assert nodes.node_kernels()[node][kernel_id]["running"]
        server.kill()  # the server dies without shutting its kernel down
        server.wait(timeout=30)
        wait_until(lambda: kernel_id not in nodes.node_kernels()[node], 60, "the lease to end")
        wait_until(lambda: not alive(pid), 30, "the kernel process to end")
        # The node drops the kernel's env reference after the process ended (a step of its
        # own): looked at until it is gone, not once.
        wait_until(
            lambda: all(f"kernel:{kernel_id}" not in e["holders"] for e in nodes.node_envs()[node]),
            60,
            "the kernel's env reference to be released",
        )
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)
