"""Kernels and the server's agent: real kernels, started by a real Jupyter server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.kernels import install_kernelspec
from tests.server.jupyter_fixtures import API
from tests.wheelhouse import make_wheelhouse, offline_installers


@pytest.fixture
def extension_config() -> dict[str, Any]:
    return {"kernel_sweep_interval": 0.2}


async def start_kernel(jp_fetch: Any, name: str) -> str:
    body = json.dumps({"name": name})
    response = await jp_fetch("api", "kernels", method="POST", body=body, request_timeout=120)
    kernel_id: str = json.loads(response.body)["id"]
    return kernel_id


async def run(jp_serverapp: Any, kernel_id: str, code: str) -> str:
    """Execute ``code`` in the kernel; its stdout (an error in the kernel fails the test)."""
    client = jp_serverapp.kernel_manager.get_kernel(kernel_id).client()
    client.start_channels()
    out: list[str] = []
    errors: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            errors.append("\n".join(msg["content"]["traceback"]))

    try:
        await client.wait_for_ready(timeout=60)
        await client.execute_interactive(code, output_hook=hook, timeout=120)
    finally:
        client.stop_channels()
    assert not errors, errors[0]
    return "".join(out)


async def holders(jp_fetch: Any, env_id: str) -> list[str]:
    response = await jp_fetch(*API, "envs", env_id)
    found: list[str] = json.loads(response.body)["holders"]
    return found


async def until_released(jp_fetch: Any, env_id: str) -> list[str]:
    for _ in range(100):
        if not (held := await holders(jp_fetch, env_id)):
            return held
        await asyncio.sleep(0.1)
    return await holders(jp_fetch, env_id)


ACQUIRE = """
import os
from jupyter_runtimeenv.client import get_client
client = get_client()
ctx = client.acquire_sync({"env_vars": {"FROM_KERNEL": "yes"}}, "mine")
url = os.environ["JUPYTER_RUNTIMEENV_URL"]
print(type(client).__name__, url, ctx.env_vars["FROM_KERNEL"], ctx.env_id)
"""


async def test_a_kernel_reaches_the_servers_agent_and_is_released_at_shutdown(
    jp_fetch: Any, jp_serverapp: Any, jp_base_url: str
) -> None:
    kernel_id = await start_kernel(jp_fetch, "python3")
    kind, url, value, env_id = (await run(jp_serverapp, kernel_id, ACQUIRE)).split()
    assert kind == "ServerClient"
    assert url.endswith(f"{jp_base_url}jupyter-runtimeenv/api/")
    assert value == "yes"
    assert await holders(jp_fetch, env_id) == [f"kernel:{kernel_id}/mine"]

    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    assert await until_released(jp_fetch, env_id) == []


async def test_references_of_a_kernel_that_died_are_released(
    jp_fetch: Any, jp_serverapp: Any
) -> None:
    kernel_id = await start_kernel(jp_fetch, "python3")
    env_id = (await run(jp_serverapp, kernel_id, ACQUIRE)).split()[-1]
    assert await holders(jp_fetch, env_id) == [f"kernel:{kernel_id}/mine"]

    # Dies without a shutdown request: killed, then dropped by the kernel manager.
    manager = jp_serverapp.kernel_manager
    kernel = manager.get_kernel(kernel_id)
    kernel.stop_restarter()
    await kernel.provisioner.kill()
    await kernel.provisioner.wait()
    manager.remove_kernel(kernel_id)
    assert await until_released(jp_fetch, env_id) == []


@pytest.mark.slow
async def test_a_kernelspec_with_the_provisioner_starts_in_its_env(
    jp_fetch: Any, jp_serverapp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheelhouse = make_wheelhouse(tmp_path / "wheelhouse")
    offline_installers(monkeypatch, wheelhouse)
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    (code_dir / "helper_mod.py").write_text("WHERE = 'driver path'\n")
    spec = {
        "pip": {"packages": ["alpha==2.0"]},
        "env_vars": {"RTE_FLAG": "on"},
        "driver_sys_path": [str(code_dir)],
    }
    path = install_kernelspec("rte-test", spec, display_name="RTE test")
    assert json.loads((Path(path) / "kernel.json").read_text())["display_name"] == "RTE test"

    kernel_id = await start_kernel(jp_fetch, "rte-test")
    code = (
        "import os, sys, alpha, helper_mod\n"
        "print(alpha.__version__, os.environ['RTE_FLAG'], helper_mod.WHERE == 'driver path',"
        f" sys.path.index({str(code_dir)!r}) < sys.path.index(os.path.dirname(os.__file__)),"
        " sys.executable)"
    )
    version, flag, imported, first, python = (await run(jp_serverapp, kernel_id, code)).split()
    assert (version, flag, imported, first) == ("2.0", "on", "True", "True")

    (summary,) = json.loads((await jp_fetch(*API, "envs")).body)["envs"]  # summaries
    env = json.loads((await jp_fetch(*API, "envs", summary["env_id"])).body)
    assert env["context"]["python"] == python  # the env's venv, not the server's interpreter
    assert env["holders"] == [f"kernel:{kernel_id}"]
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    assert await until_released(jp_fetch, env["env_id"]) == []
