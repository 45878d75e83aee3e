"""``ServerClient`` against a real server: results, holders scoped to the kernel, typed errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jupyter_runtimeenv.errors import AgentUnavailable, BuildError, EnvNotFound, SpecError
from jupyter_runtimeenv.server.client import ServerClient
from tests.server.jupyter_fixtures import API
from tests.server.plugins import SCRIPT, script


@pytest.fixture
def url(jp_serverapp: Any, jp_fetch: Any) -> str:
    ext = jp_serverapp.web_app.settings["jupyter_runtimeenv"]
    return str(ext.kernel_url())


@pytest.fixture
def token(jp_serverapp: Any) -> str:
    return str(jp_serverapp.identity_provider.token)


async def test_acquire_and_release_scoped_to_the_kernel(
    url: str, token: str, jp_fetch: Any
) -> None:
    client = ServerClient(url, token, kernel_id="k1")
    ctx = await client.acquire({"env_vars": {"X": "1"}, **script("c")}, "pool/a")
    assert ctx.env_vars["X"] == "1"
    env = json.loads((await jp_fetch(*API, "envs", ctx.env_id)).body)
    assert env["holders"] == ["kernel:k1/pool/a"]
    assert [e["env_id"] for e in await client.status()] == [ctx.env_id]
    assert "script line 0" in await client.log(ctx.env_id)

    await client.release(ctx.env_id, "pool/a")
    assert json.loads((await jp_fetch(*API, "envs", ctx.env_id)).body)["holders"] == []
    assert ServerClient(url, token).scoped("h") == "h"  # not in a kernel
    assert client.scoped("kernel:k1") == "kernel:k1"


async def test_errors_come_back_typed(url: str, token: str) -> None:
    client = ServerClient(url, token)
    with pytest.raises(SpecError) as spec_error:
        await client.acquire({"env_vars": {"A": 1}}, "h")
    assert spec_error.value.field == "env_vars.A"
    with pytest.raises(BuildError) as build_error:
        await client.acquire(script("broken", fail=True), "h")
    assert build_error.value.step.startswith(SCRIPT)
    with pytest.raises(EnvNotFound):
        await client.release("0" * 64, "h")
    with pytest.raises(AgentUnavailable, match="403"):
        await ServerClient(url, "wrong").status()
    with pytest.raises(AgentUnavailable, match="cannot reach"):
        await ServerClient("http://127.0.0.1:9/nothing/", token, timeout=2).status()
