"""Kernels on a Dask node, end to end: a real scheduler and two ``dask worker`` subprocesses
on 127.0.0.1 (each with its own cache root), a kernelspec made with ``--dask``, driven
through ``jupyter_client.KernelManager`` like any kernel.

Proves issue 18's lifecycle: the kernel is a descendant of a Dask worker process (not of
this process), runs in the env built on that node, streams stdout/stderr and rich output,
is interrupted through the node agent, restarts on its node, leaves no process at shutdown
and releases its env there; its ports, files and key are kept to the node and its owner.
"""

from __future__ import annotations

import asyncio
import json
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

from jupyter_runtimeenv.kernels import install_kernelspec
from tests.dask.helpers import assert_no_env_workers, node_pids
from tests.kernels.dask_nodes import DaskNodes, alive, ancestors, listening, wait_until
from tests.wheelhouse import make_wheelhouse

pytest.importorskip("distributed")
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaskNodes]:
    root = tmp_path_factory.mktemp("cluster")
    wheelhouse = make_wheelhouse(root / "wheelhouse")
    offline = {
        "UV_NO_INDEX": "1",
        "UV_FIND_LINKS": str(wheelhouse),
        "UV_OFFLINE": "1",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheelhouse),
    }
    cluster = DaskNodes(root, env=offline)
    try:
        yield cluster
    finally:
        cluster.stop()


def kernel_manager(prefix: Path, name: str) -> KernelManager:
    specs = KernelSpecManager(kernel_dirs=[str(prefix / "share" / "jupyter" / "kernels")])
    return KernelManager(kernel_name=name, kernel_spec_manager=specs)


def run(
    client: BlockingKernelClient, code: str, timeout: float = 120
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    messages: list[dict[str, Any]] = []
    reply = client.execute_interactive(code, output_hook=messages.append, timeout=timeout)
    return reply["content"], messages


def stream(messages: list[dict[str, Any]], name: str) -> str:
    return "".join(
        m["content"]["text"]
        for m in messages
        if m["msg_type"] == "stream" and m["content"]["name"] == name
    )


@pytest.fixture
def started(
    nodes: DaskNodes, tmp_path: Path
) -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    install_kernelspec(
        "on-cluster", {"env_vars": {"K": "from-the-spec"}}, prefix=str(tmp_path), dask=nodes.address
    )
    km = kernel_manager(tmp_path, "on-cluster")
    km.start_kernel()
    client = km.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        yield km, client
    finally:
        client.stop_channels()
        if km.has_kernel:
            km.shutdown_kernel(now=True)


def test_the_kernel_runs_on_a_node_in_its_env_and_shutdown_leaves_nothing(
    nodes: DaskNodes, started: tuple[KernelManager, BlockingKernelClient]
) -> None:
    km, client = started
    reply, messages = run(client, 'import os, sys; print(os.environ["K"], os.getpid())')
    assert reply["status"] == "ok", reply
    value, pid_text = stream(messages, "stdout").split()
    assert value == "from-the-spec"
    pid = int(pid_text)
    workers = nodes.worker_pids()
    node = km.provisioner.node  # type: ignore[union-attr]
    assert node in workers
    assert ancestors(pid)[0] == workers[node]  # a child of that Dask worker, not of this
    assert km.connection_file
    assert json.loads(Path(km.connection_file).read_text())["ip"] == "127.0.0.1"

    # The env was built on that node, with the kernel as its holder there.
    held = [e for e in nodes.node_envs()[node] if f"kernel:{km.kernel_id}" in e["holders"]]
    assert len(held) == 1
    assert held[0]["state"] == "READY"

    km.shutdown_kernel()
    wait_until(lambda: not alive(pid), 30, "the kernel process to end")
    assert km.kernel_id not in nodes.node_kernels()[node]
    envs = nodes.node_envs()[node]
    assert all(f"kernel:{km.kernel_id}" not in e["holders"] for e in envs)


def test_local_code_reaches_the_node_by_content(nodes: DaskNodes, tmp_path: Path) -> None:
    """The spec's working_dir and py_modules travel to the node as blobs (the node has no
    path of the server's): the kernel imports them from its node's cache and runs there."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "helper.py").write_text("VALUE = 'from-the-working-dir'\n")
    (code / "data.txt").write_text("beside the code\n")
    lib = tmp_path / "lib" / "shipped"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("NAME = 'from-py-modules'\n")
    spec = {"working_dir": str(code), "py_modules": [str(lib)]}
    install_kernelspec("with-code", spec, prefix=str(tmp_path), dask=nodes.address)
    km = kernel_manager(tmp_path, "with-code")
    km.start_kernel()
    client = km.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        cell = (
            "import os, helper, shipped\n"
            "print(helper.VALUE, shipped.NAME, open('data.txt').read().strip() == 'beside the"
            " code', os.getcwd(), helper.__file__, shipped.__file__, sep='|')"
        )
        reply, messages = run(client, cell)
        assert reply["status"] == "ok", reply
        value, name, beside, cwd, helper_file, shipped_file = (
            stream(messages, "stdout").strip().split("|")
        )
        assert (value, name, beside) == ("from-the-working-dir", "from-py-modules", "True")
        roots = [root.resolve() for root in nodes.cache_roots]
        # The node's copies, below a node's cache root, never the server's paths.
        for path in (cwd, helper_file, shipped_file):
            assert any(Path(path).resolve().is_relative_to(r) for r in roots), (path, roots)
            assert not path.startswith(str(tmp_path / "code"))
            assert not path.startswith(str(tmp_path / "lib"))
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=True)


def test_stdout_stderr_and_rich_output_come_back(
    started: tuple[KernelManager, BlockingKernelClient],
) -> None:
    _, client = started
    code = (
        "import sys\n"
        "from IPython.display import HTML, display\n"
        "print('to stdout'); print('to stderr', file=sys.stderr)\n"
        "display(HTML('<b>bold</b>'))\n"
        "6 * 7"
    )
    reply, messages = run(client, code)
    assert reply["status"] == "ok"
    assert stream(messages, "stdout") == "to stdout\n"
    assert stream(messages, "stderr") == "to stderr\n"
    displays = [m["content"]["data"] for m in messages if m["msg_type"] == "display_data"]
    assert displays == [
        {"text/html": "<b>bold</b>", "text/plain": "<IPython.core.display.HTML object>"}
    ]
    results = [m["content"]["data"] for m in messages if m["msg_type"] == "execute_result"]
    assert results == [{"text/plain": "42"}]


def test_interrupt_stops_a_sleep_through_the_node_agent(
    started: tuple[KernelManager, BlockingKernelClient],
) -> None:
    km, client = started
    msg_id = client.execute("import time; print('sleeping', flush=True); time.sleep(60)")
    wait_until(lambda: _printed(client, msg_id), 60, "the cell to start sleeping")
    started_at = time.monotonic()
    km.interrupt_kernel()
    # Bounded well under the sleep: only the interrupt can end the cell this soon. The
    # latency itself is measured in benchmarks/bench_remote_kernel.py.
    reply = client.get_shell_msg(timeout=30)
    while reply["parent_header"].get("msg_id") != msg_id:  # a late kernel_info reply
        reply = client.get_shell_msg(timeout=30)
    elapsed = time.monotonic() - started_at
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt", (reply["content"], elapsed)
    # The kernel lives on (ipykernel aborts requests that arrive just after an error).
    wait_until(lambda: run(client, "1 + 1")[0]["status"] == "ok", 30, "the kernel to answer")


def _printed(client: BlockingKernelClient, msg_id: str) -> bool:
    try:
        msg = client.get_iopub_msg(timeout=0.2)
    except Exception:
        return False
    return msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream"


def test_restart_starts_a_fresh_kernel_on_the_same_node(
    nodes: DaskNodes, started: tuple[KernelManager, BlockingKernelClient]
) -> None:
    km, client = started
    _reply, messages = run(client, "import os; x = 1; print(os.getpid())")
    first = int(stream(messages, "stdout"))
    node = km.provisioner.node  # type: ignore[union-attr]
    ports = [km.shell_port, km.iopub_port, km.stdin_port, km.control_port, km.hb_port]

    km.restart_kernel()
    wait_until(lambda: not alive(first), 30, "the old kernel to end")
    assert km.provisioner.node == node  # type: ignore[union-attr]
    fresh = km.blocking_client()
    fresh.start_channels()
    try:
        fresh.wait_for_ready(timeout=120)
        _reply, messages = run(fresh, "import os; print(os.getpid(), 'x' in globals())")
        pid, has_x = stream(messages, "stdout").split()
    finally:
        fresh.stop_channels()
    assert int(pid) != first
    assert has_x == "False"
    assert nodes.worker_pids()[node] in ancestors(int(pid))
    # Its ports were free again, so the restarted kernel took them (clients keep working).
    assert [km.shell_port, km.iopub_port, km.stdin_port, km.control_port, km.hb_port] == ports


def test_ports_files_and_key_stay_with_the_node_and_its_owner(
    nodes: DaskNodes,
    started: tuple[KernelManager, BlockingKernelClient],
    caplog: pytest.LogCaptureFixture,
) -> None:
    km, client = started
    _reply, messages = run(client, "import os; print(os.getpid())")
    pid = int(stream(messages, "stdout"))
    node = km.provisioner.node  # type: ignore[union-attr]
    bound = listening(pid)
    ports = {km.shell_port, km.iopub_port, km.stdin_port, km.control_port, km.hb_port}
    assert ports <= {port for _, port in bound}
    assert {ip for ip, _ in bound} == {"127.0.0.1"}  # the node's address, never 0.0.0.0

    directory = Path(nodes.node_kernels()[node][km.kernel_id]["directory"])
    # Owner-only (ipykernel adds the sticky bit to a connection file's directory).
    assert stat.S_IMODE(directory.stat().st_mode) & 0o777 == 0o700
    assert stat.S_IMODE(directory.parent.stat().st_mode) == 0o700
    connection = directory / "connection.json"
    assert stat.S_IMODE(connection.stat().st_mode) == 0o600
    key = json.loads(connection.read_text())["key"]
    assert key.encode() == km.session.key
    assert len(key) == 64

    logs = [p.read_text(errors="replace") for p in nodes.logs]
    logs.append((directory / "kernel.log").read_text(errors="replace"))
    logs.append(caplog.text)
    assert all(key not in text for text in logs)


def test_a_node_with_the_env_ready_is_picked_else_the_least_loaded(
    nodes: DaskNodes, tmp_path: Path
) -> None:
    install_kernelspec("env-a", {"env_vars": {"E": "a"}}, prefix=str(tmp_path), dask=nodes.address)
    install_kernelspec("env-b", {"env_vars": {"E": "b"}}, prefix=str(tmp_path), dask=nodes.address)
    managers = [kernel_manager(tmp_path, name) for name in ("env-a", "env-a", "env-b")]
    try:
        for km in managers:
            km.start_kernel()
        first, again, other = (km.provisioner.node for km in managers)  # type: ignore[union-attr]
        assert again == first  # env a is READY there
        assert other != first  # env b is READY nowhere: the node without kernels
        assert {first, other} == set(nodes.worker_pids())
    finally:
        for km in managers:
            if km.has_kernel:
                km.shutdown_kernel(now=True)


def test_inside_the_kernel_remote_calls_and_cells_go_to_the_same_cluster(
    nodes: DaskNodes, started: tuple[KernelManager, BlockingKernelClient]
) -> None:
    km, client = started
    setup = (
        "%load_ext jupyter_runtimeenv\n"
        "%runtime_env --env-var X=from-the-cell --no-widget\n"
        "import jupyter_runtimeenv.session as s"
    )
    reply, messages = run(client, setup, timeout=240)
    assert reply["status"] == "ok", reply

    call = (
        "import os\n"
        "@remote\n"
        "def where():\n"
        "    import os\n"
        "    return os.getpid(), os.environ['X']\n"
        "pid, x = where.remote().result(timeout=240)\n"
        "print(type(s.executor()).__name__, pid, x)"
    )
    reply, messages = run(client, call, timeout=300)
    assert reply["status"] == "ok", reply
    kind, pid, x = stream(messages, "stdout").split()[-3:]
    assert kind == "DaskExecutor"
    assert x == "from-the-cell"
    workers = set(nodes.worker_pids().values())
    assert workers & set(ancestors(int(pid)))  # a worker process on a node of the cluster

    cell = "%%remote --out y\nimport os\ny = os.environ['X'] + '!'\nprint('remote', os.getpid())"
    reply, messages = run(client, cell, timeout=300)
    assert reply["status"] == "ok", reply
    remote_pid = int(stream(messages, "stdout").split()[-1])
    assert workers & set(ancestors(remote_pid))
    reply, messages = run(client, "print(y)")
    assert stream(messages, "stdout").strip() == "from-the-cell!"

    # %driver_sys_path is the kernel's own sys.path on its node: its working directory there.
    reply, messages = run(client, "%driver_sys_path")
    node = km.provisioner.node  # type: ignore[union-attr]
    directory = nodes.node_kernels()[node][km.kernel_id]["directory"]
    assert f"{directory}/work" in stream(messages, "stdout")

    # Shutdown ends the kernel's workers on every node too, not only the kernel.
    assert node_pids(nodes.client)
    km.shutdown_kernel()
    assert_no_env_workers(nodes.client, timeout=30)


def test_transport_encryption_gives_the_kernel_curve_keys_made_on_its_node(
    nodes: DaskNodes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    install_kernelspec("sealed", {}, prefix=str(tmp_path), dask=nodes.address)
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "share" / "jupyter" / "kernels")])
    km = KernelManager(
        kernel_name="sealed", kernel_spec_manager=specs, transport_encryption="required"
    )
    km.start_kernel()
    client = km.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        _, messages = run(client, "print('sealed')")
        assert stream(messages, "stdout") == "sealed\n"
        node = km.provisioner.node  # type: ignore[union-attr]
        directory = Path(nodes.node_kernels()[node][km.kernel_id]["directory"])
        on_node = json.loads((directory / "connection.json").read_text())
        assert km.curve_publickey == on_node["curve_publickey"].encode()
        assert len(on_node["curve_secretkey"]) == 40
        # The heartbeat echoes only a CurveZMQ client that knows the kernel's public key.
        hb = f"tcp://{on_node['ip']}:{km.hb_port}"
        assert _echo(hb, None) is None
        assert _echo(hb, on_node["curve_publickey"].encode()) == b"ping"
        texts = [p.read_text(errors="replace") for p in nodes.logs] + [caplog.text]
        assert all(on_node["curve_secretkey"] not in text for text in texts)
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=True)


def _echo(address: str, server_key: bytes | None) -> bytes | None:
    """Ping a kernel's heartbeat (as a CurveZMQ client when ``server_key``); its echo, or
    ``None`` when none comes within 3 s."""
    import zmq

    context = zmq.Context()
    sock = context.socket(zmq.REQ)
    sock.linger = 0
    if server_key is not None:
        public, secret = zmq.curve_keypair()
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = (
            server_key,
            public,
            secret,
        )
    try:
        sock.connect(address)
        sock.send(b"ping")
        return sock.recv() if sock.poll(3000) else None
    finally:
        sock.close()
        context.term()


def test_a_kernel_that_dies_on_a_live_node_is_seen_dead_and_restarts_there(
    nodes: DaskNodes, started: tuple[KernelManager, BlockingKernelClient]
) -> None:
    km, client = started
    node = km.provisioner.node  # type: ignore[union-attr]
    _, messages = run(client, "import os; print(os.getpid())")
    pid = int(stream(messages, "stdout"))
    client.execute("import os; os._exit(3)")
    wait_until(lambda: not km.is_alive(), 30, "the kernel manager to see the death")
    assert km.provisioner._exit == 3  # type: ignore[union-attr]
    assert km.provisioner.failure is None  # type: ignore[union-attr]  # the node lives
    wait_until(lambda: not alive(pid), 10, "the process to be reaped")

    km.restart_kernel(now=True)  # what the server's restarter does
    assert km.provisioner.node == node  # type: ignore[union-attr]
    fresh = km.blocking_client()
    fresh.start_channels()
    try:
        fresh.wait_for_ready(timeout=120)
        _, messages = run(fresh, "import os; print(os.getpid())")
    finally:
        fresh.stop_channels()
    assert ancestors(int(stream(messages, "stdout")))[0] == nodes.worker_pids()[node]


async def test_another_provisioner_can_take_over_from_the_saved_info(
    nodes: DaskNodes, started: tuple[KernelManager, BlockingKernelClient]
) -> None:
    from jupyter_runtimeenv.kernels.remote import DaskKernelProvisioner

    km, _ = started
    info = await km.provisioner.get_provisioner_info()  # type: ignore[union-attr]
    assert info["node"] == km.provisioner.node  # type: ignore[union-attr]
    assert info["scheduler"] == nodes.address
    other = DaskKernelProvisioner(kernel_spec=km.kernel_spec)
    await other.load_provisioner_info(info)
    try:
        assert other.has_process
        assert await other.poll() is None
        km.shutdown_kernel(now=True)
        deadline = time.monotonic() + 30
        while await other.poll() is None:
            assert time.monotonic() < deadline, "the other provisioner never saw the end"
            await asyncio.sleep(0.2)
    finally:
        await other.cleanup()


def test_the_kernelspec_s_node_cache_dir_is_where_the_node_keeps_the_kernel(
    tmp_path: Path,
) -> None:
    """``--node-cache-dir`` (formatted with each Dask worker's name) is where the node builds
    the kernel's env and keeps its files; the kernel's own tasks use the same cache there."""
    (tmp_path / "cluster").mkdir()
    cluster = DaskNodes(tmp_path / "cluster")  # its own: the plugin's first registration wins
    try:
        install_kernelspec(
            "cached",
            {"env_vars": {"K": "v"}},
            prefix=str(tmp_path),
            dask=cluster.address,
            node_cache_dir=str(tmp_path / "jre-{name}"),
        )
        km = kernel_manager(tmp_path, "cached")
        km.start_kernel()
        client = km.blocking_client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=120)
            reply, messages = run(
                client, "import os; print(os.environ['JUPYTER_RUNTIMEENV_CACHE'])"
            )
            assert reply["status"] == "ok", reply
            node = km.provisioner.node  # type: ignore[union-attr]
            name = cluster.client.scheduler_info()["workers"][node]["name"]
            root = tmp_path / f"jre-{name}"
            assert stream(messages, "stdout").strip() == str(root)
            directory = Path(cluster.node_kernels()[node][km.kernel_id]["directory"])
            assert directory.is_relative_to(root)
            assert not any(r.joinpath("kernels").exists() for r in cluster.cache_roots)
        finally:
            client.stop_channels()
            km.shutdown_kernel(now=True)
    finally:
        cluster.stop()
