"""A holder's reference lives exactly as long as its holder (issue 21 item 4, issue 16 item
12), against a real Jupyter server and real kernels: a rebuild or a forced delete keeps the
holders' claims, a rebuild takes no reference of its own, a kernel restart (asked for, or
automatic after the kernel was killed) releases what the old process took, and every change
of holders is on the event stream for the sidebar."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any

import pytest

from jupyter_runtimeenv.server.events import SCHEMA_ID
from tests.kernels.test_kernels import run, start_kernel
from tests.server.plugins import script
from tests.server.test_panel import call, refused

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def extension_config() -> dict[str, Any]:
    return {"kernel_sweep_interval": 0.2}


async def holders_of(jp_fetch: Any, env_id: str) -> list[str]:
    found: list[str] = (await call(jp_fetch, "GET", "envs", env_id))["holders"]
    return found


async def until(check: Any, what: str, timeout: float = 60) -> Any:
    """Poll the coroutine function ``check`` until it returns something true."""
    deadline = time.monotonic() + timeout
    while True:
        found = await check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def ready(jp_fetch: Any, env_id: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        env: dict[str, Any] = await call(jp_fetch, "GET", "envs", env_id)
        return env if env["state"] in ("READY", "FAILED") else None

    found: dict[str, Any] = await until(check, f"{env_id[:12]} to end its build")
    return found


async def test_a_rebuild_keeps_the_holders_and_takes_no_reference(
    jp_fetch: Any, jp_serverapp: Any
) -> None:
    spec = script("kept")
    env = await call(jp_fetch, "POST", "envs", body=spec, params={"holder": "cli", "wait": "1"})
    magic = "kernel:abc/runtime_env-magic:4242:1"
    await call(jp_fetch, "POST", "envs", body=spec, params={"holder": magic})
    code, _ = await refused(jp_fetch, "POST", "envs", env["env_id"], "rebuild")
    assert code == 409  # held by others than the caller
    await call(jp_fetch, "POST", "envs", env["env_id"], "rebuild", params={"force": "true"})
    assert (await ready(jp_fetch, env["env_id"]))["state"] == "READY"
    assert await holders_of(jp_fetch, env["env_id"]) == ["cli", magic]  # no "user"

    # Nobody holds it: the rebuild holds it while it builds, then nobody does.
    await call(jp_fetch, "DELETE", "envs", env["env_id"], "holders", "cli")
    # (jp_fetch cannot send a '/' inside a path segment: the kernel's holder goes directly.)
    await jp_serverapp.web_app.settings["jupyter_runtimeenv"].agent.release(env["env_id"], magic)
    await call(jp_fetch, "POST", "envs", env["env_id"], "rebuild")
    assert (await ready(jp_fetch, env["env_id"]))["state"] == "READY"

    async def unheld() -> bool:
        return await holders_of(jp_fetch, env["env_id"]) == []

    await until(unheld, "the rebuild to let go")


async def test_a_failed_env_retried_from_the_sidebar_is_held_by_nobody(jp_fetch: Any) -> None:
    failed = await call(
        jp_fetch, "POST", "envs", body=script("flaky2", fail=True), params={"wait": "1"}
    )
    assert failed["state"] == "FAILED"
    again = await call(jp_fetch, "POST", "envs", failed["env_id"], "rebuild")
    assert again["holders"] in ([], ["rebuild"])
    assert (await ready(jp_fetch, failed["env_id"]))["state"] == "FAILED"

    async def unheld() -> bool:
        return await holders_of(jp_fetch, failed["env_id"]) == []

    await until(unheld, "the retry to let go")


async def test_a_forced_delete_keeps_the_holders_claims_for_the_rebuild(jp_fetch: Any) -> None:
    spec = script("deleted")
    magic = "kernel:abc/runtime_env-magic:4242:1"
    env = await call(jp_fetch, "POST", "envs", body=spec, params={"holder": magic, "wait": "1"})
    await call(jp_fetch, "DELETE", "envs", env["env_id"], params={"force": "true"})
    code, _ = await refused(jp_fetch, "GET", "envs", env["env_id"])
    assert code == 404  # deleted: gone from the list
    # The holder uses it again (a pool of the same kernel): built anew, held by both.
    pool = "kernel:abc/pool:4242:1:0123456789ab"
    again = await call(jp_fetch, "POST", "envs", body=spec, params={"holder": pool, "wait": "1"})
    assert again["state"] == "READY"
    assert await holders_of(jp_fetch, env["env_id"]) == sorted([magic, pool])


async def test_every_change_of_holders_is_an_event(jp_fetch: Any, jp_serverapp: Any) -> None:
    seen: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def listener(logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        if data["kind"] == "holders":
            seen.put_nowait(data)

    jp_serverapp.event_logger.add_listener(schema_id=SCHEMA_ID, listener=listener)
    env = await call(jp_fetch, "POST", "envs", body=script("evented"), params={"wait": "1"})
    assert (await asyncio.wait_for(seen.get(), 30))["env_id"] == env["env_id"]
    await call(jp_fetch, "POST", "envs", body=script("evented"), params={"holder": "cli"})
    assert (await asyncio.wait_for(seen.get(), 30))["env_id"] == env["env_id"]
    await call(jp_fetch, "POST", "envs", body=script("evented"), params={"holder": "cli"})
    await call(jp_fetch, "DELETE", "envs", env["env_id"], "holders", "cli")
    # Asking again as a holder it already is changes nothing: the next event is the release.
    assert (await asyncio.wait_for(seen.get(), 30))["env_id"] == env["env_id"]
    assert seen.empty()


DECLARE = "%load_ext jupyter_runtimeenv\n%runtime_env --env-var HELD=1 --no-widget\nprint('ok')"


async def _magic_holders(jp_fetch: Any, kernel_id: str) -> dict[str, list[str]]:
    """env id -> the kernel's %runtime_env holders on it."""
    out: dict[str, list[str]] = {}
    for env in (await call(jp_fetch, "GET", "envs"))["envs"]:
        mine = [h for h in env["holders"] if h.startswith(f"kernel:{kernel_id}/runtime_env-")]
        if mine:
            out[env["env_id"]] = mine
    return out


def _kernel_pid(jp_serverapp: Any, kernel_id: str) -> int:
    pid: int = jp_serverapp.kernel_manager.get_kernel(kernel_id).provisioner.pid
    return pid


@pytest.mark.parametrize("how", ["restart", "killed"])
async def test_a_restarted_kernel_keeps_nothing_of_its_old_process(
    jp_fetch: Any, jp_serverapp: Any, how: str
) -> None:
    kernel_id = await start_kernel(jp_fetch, "python3")
    old_pid = _kernel_pid(jp_serverapp, kernel_id)
    assert "ok" in await run(jp_serverapp, kernel_id, DECLARE)
    held = await _magic_holders(jp_fetch, kernel_id)
    [(env_id, [holder])] = held.items()
    assert f":{old_pid}:" in holder

    if how == "restart":
        await jp_fetch("api", "kernels", kernel_id, "restart", method="POST", body=b"{}")
    else:  # the kernel dies; the server's restarter starts it again under the same id
        os.kill(old_pid, signal.SIGKILL)

    async def restarted() -> bool:
        pid = _kernel_pid(jp_serverapp, kernel_id)
        return pid is not None and pid != old_pid

    await until(restarted, "the kernel to come back", timeout=120)

    async def released() -> bool:
        return await _magic_holders(jp_fetch, kernel_id) == {}

    await until(released, "the old process's reference to be released")
    # The kernel itself lives on, and its new process holds what it declares.
    assert "ok" in await run(jp_serverapp, kernel_id, DECLARE)
    [(again, [new_holder])] = (await _magic_holders(jp_fetch, kernel_id)).items()
    assert again == env_id
    assert f":{_kernel_pid(jp_serverapp, kernel_id)}:" in new_holder
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    assert json.loads((await jp_fetch("api", "kernels")).body) == []
