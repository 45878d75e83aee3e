"""The provisioner without a server (embedded agent), the kernelspec helper, and the command."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

from jupyter_runtimeenv.client import EmbeddedClient, set_client
from jupyter_runtimeenv.context import EnvContext
from jupyter_runtimeenv.errors import RuntimeEnvError, SpecError
from jupyter_runtimeenv.kernels import PROVISIONER_NAME, install_kernelspec
from jupyter_runtimeenv.kernels.command import BOOTSTRAP, kernel_command
from jupyter_runtimeenv.kernels.kernelspec import with_ipykernel
from jupyter_runtimeenv.kernels.provisioner import spec_for_kernel


@pytest.fixture
def embedded(cache_dir: Path) -> Iterator[EmbeddedClient]:
    """The process-wide client is an embedded agent on this test's cache (no server here)."""
    from jupyter_runtimeenv.agent import RuntimeEnvAgent

    client = EmbeddedClient(RuntimeEnvAgent(cache_dir))
    old = set_client(client)
    yield client
    set_client(old)
    client.close()


def manager_for(prefix: Path, name: str) -> AsyncKernelManager:
    kernels = KernelSpecManager(kernel_dirs=[str(prefix / "share" / "jupyter" / "kernels")])
    return AsyncKernelManager(kernel_name=name, kernel_spec_manager=kernels)


async def execute(km: AsyncKernelManager, code: str) -> str:
    client = km.client()
    client.start_channels()
    out: list[str] = []
    try:
        await client.wait_for_ready(timeout=60)
        reply = await client.execute_interactive(
            code,
            output_hook=lambda m: out.append(m["content"].get("text", "")),
            timeout=60,
        )
    finally:
        client.stop_channels()
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(out)


async def test_a_kernel_starts_in_its_env_through_an_embedded_agent(
    embedded: EmbeddedClient, tmp_path: Path
) -> None:
    install_kernelspec("plain-rte", {"env_vars": {"IN_ENV": "42"}}, prefix=str(tmp_path))
    km = manager_for(tmp_path, "plain-rte")
    await km.start_kernel()
    try:
        out = await execute(km, "import os; print(os.environ['IN_ENV'])")
        assert out.strip() == "42"
        (env,) = await embedded.status()
        assert env["holders"] == [f"kernel:{km.kernel_id}"]
    finally:
        await km.shutdown_kernel()
    (env,) = await embedded.status()
    assert env["holders"] == []  # the provisioner's cleanup released it


async def test_an_interpreter_without_ipykernel_is_refused_with_the_remedy(
    embedded: EmbeddedClient, tmp_path: Path
) -> None:
    bare = tmp_path / "bare"
    made = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "venv", "--without-pip", str(bare)
    )
    assert await made.wait() == 0
    python = str(bare / "bin" / "python")
    install_kernelspec("bare-rte", {"py_executable": python}, prefix=str(tmp_path))
    km = manager_for(tmp_path, "bare-rte")
    with pytest.raises(RuntimeEnvError, match="add 'ipykernel'"):
        await km.start_kernel(env={"PATH": "/usr/bin:/bin"})
    await km.cleanup_resources()


def test_install_kernelspec_writes_the_provisioner_and_refuses_bad_specs(tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("env_vars:\n  A: '1'\n")
    path = install_kernelspec("from-file", spec_file, prefix=str(tmp_path / "p"))
    kernel = json.loads((Path(path) / "kernel.json").read_text())
    provisioner = kernel["metadata"]["kernel_provisioner"]
    assert provisioner["provisioner_name"] == PROVISIONER_NAME
    assert provisioner["config"]["runtime_env"]["env_vars"] == {"A": "1"}
    assert kernel["argv"][:3] == ["python", "-m", "ipykernel_launcher"]

    with pytest.raises(SpecError) as info:
        install_kernelspec("bad", {"env_vars": {"A": 1}}, prefix=str(tmp_path / "p"))
    assert info.value.field == "env_vars.A"
    with pytest.raises(SpecError):
        install_kernelspec("bad name!", {}, prefix=str(tmp_path / "p"))


def test_isolated_specs_get_ipykernel() -> None:
    isolated: dict[str, Any] = {"config": {"isolated": True}, "pip": {"packages": ["alpha"]}}
    assert with_ipykernel(isolated)["pip"]["packages"] == ["alpha", "ipykernel"]
    assert with_ipykernel({"config": {"isolated": True}})["pip"] == {"packages": ["ipykernel"]}
    pinned = {"config": {"isolated": True}, "pip": {"packages": ["ipykernel==6.29"]}}
    assert with_ipykernel(pinned)["pip"]["packages"] == ["ipykernel==6.29"]
    layered = {"pip": {"packages": ["alpha"]}}
    assert with_ipykernel(layered) == layered


def test_kernel_command_uses_the_env_interpreter_prefix_and_bootstrap() -> None:
    argv = ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    plain = EnvContext(python="/env/bin/python", command_prefix=("nice", "-n", "5"))
    assert kernel_command(plain, argv) == ["nice", "-n", "5", "/env/bin/python", *argv[1:]]
    with_path = plain.replace(extra_paths=["/code"])
    assert kernel_command(with_path, argv) == [
        "nice", "-n", "5", "/env/bin/python", "-c", BOOTSTRAP, "ipykernel_launcher",
        "-f", "{connection_file}",
    ]  # fmt: skip
    with pytest.raises(RuntimeEnvError, match="Python interpreter"):
        kernel_command(plain, ["node", "kernel.js"])


def test_the_kernel_interpreter_is_the_driver_python() -> None:
    env = {"pip": ["alpha"]}
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    assert spec_for_kernel(env, argv) == {**env, "driver_python": sys.executable}
    # A bare command name, an explicit choice or conda: left as they are.
    assert spec_for_kernel(env, ["python3", "-m", "ipykernel"]) == env
    given = {**env, "driver_python": "/opt/py/bin/python"}
    assert spec_for_kernel(given, argv) == given
    assert "driver_python" not in spec_for_kernel({"conda": "base"}, argv)


async def test_a_kernel_in_an_env_with_a_working_dir_writes_its_own_copy(
    embedded: EmbeddedClient, tmp_path: Path, cache_dir: Path
) -> None:
    """Issue 16 item 4 for kernels started in an env: the kernel's working dir is its env's
    copy, linked to the content store; a chmod and a rewrite in place in the kernel reach
    neither the store nor another env (the bootstrap installs the copy-on-write guard)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "data.txt").write_text("original")
    install_kernelspec("wd-rte", {"working_dir": str(project)}, prefix=str(tmp_path))
    km = manager_for(tmp_path, "wd-rte")
    await km.start_kernel()
    try:
        code = (
            "import os; os.chmod('data.txt', 0o644)\n"
            "with open('data.txt', 'r+') as f: f.write('EDITED!!')\n"
            "print(open('data.txt').read(), os.stat('data.txt').st_nlink)"
        )
        assert (await execute(km, code)).split() == ["EDITED!!", "1"]
    finally:
        await km.shutdown_kernel()
    blobs = [p for p in (cache_dir / "shared" / "blobs").rglob("*") if p.is_file()]
    assert [b.read_text() for b in blobs] == ["original"]


def test_the_kernel_bootstrap_names_the_guard() -> None:
    from jupyter_runtimeenv.kernels import command
    from jupyter_runtimeenv.plugins._sources import TREES_VAR

    assert command.TREES_VAR == TREES_VAR
    assert Path(command._COW).is_file()
