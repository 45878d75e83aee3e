"""Threat: GC or DELETE during a build removes resources that build already chose.

A build that reuses a cached resource of another, unheld env A (found in the cache), then
goes on with its slow steps; a ``gc`` or a ``DELETE`` of A in between (from the REST API, or
the CLI in another process) evicted the resource, and the build turned READY with a cwd
that no longer existed (found with a ``working_dir`` tree, shared between envs then).

Rule under test (``Cache.pin``, ``RuntimeEnvAgent._need_pinned``): a resource a build chose
is referenced from that moment (in the shared index, checked and recorded in one
transaction) until the build ends; an eviction before the pin makes the build get it again.
Since each env has its own ``working_dir`` copy (issue 16 item 4), the resources envs share
are the installers' (a pip/uv venv, a conda env, keyed by what they install); the shared
resource here is a plugin of this test keyed by its value alone, which sets the cwd as
``working_dir`` does (a real venv build would only add minutes). The slow step is another
plugin of this test that waits for a file the test creates.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jupyter_runtimeenv.agent import RuntimeEnvAgent
from jupyter_runtimeenv.errors import EnvNotFound
from jupyter_runtimeenv.plugins import BuildContext, PluginRegistry, RuntimeEnvPlugin
from jupyter_runtimeenv.plugins.env_vars import EnvVarsPlugin

MakeAgent = Callable[..., Any]


class Gate(RuntimeEnvPlugin):
    """A slow step: its resource is done once the file named by its value exists."""

    name = "gate"
    priority = 80

    def uris(self, value: Any, spec: Any) -> list[str]:
        return [f"gate://{value}"]

    async def create(self, uri: str, value: Any, build: BuildContext) -> int:
        while not os.path.exists(value):
            await asyncio.sleep(0.05)
        (build.target / "opened").write_text("yes")
        return 3


class Shared(RuntimeEnvPlugin):
    """A resource envs share (keyed by its value alone, as a venv is by its requirements):
    a directory holding ``main.py``, made the env's cwd."""

    name = "shared"
    priority = 30

    def uris(self, value: Any, spec: Any) -> list[str]:
        return [f"shared://{value}"]

    async def create(self, uri: str, value: Any, build: BuildContext) -> int:
        build.target.mkdir(parents=True, exist_ok=True)
        (build.target / "main.py").write_text("print('hello')\n")
        return 15

    def modify_context(self, uris: Sequence[str], value: Any, ctx: Any) -> None:
        ctx.cwd = ctx.resource_path(uris[0])


def _registry() -> PluginRegistry:
    return PluginRegistry([Shared(), EnvVarsPlugin(), Gate()])


async def _chosen(agent: RuntimeEnvAgent, env_id: str, field: str) -> None:
    """Wait (bounded) until the build of ``env_id`` found its ``field`` resource cached."""
    steps: dict[str, Any] = {}
    for _ in range(1200):
        with contextlib.suppress(EnvNotFound):  # the request has not reached the agent yet
            steps = (await agent.env_status(env_id))["steps"]
        if any(k.startswith(field) and s.get("status") == "cached" for k, s in steps.items()):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the build never chose its {field} resource: {steps}")


async def _build_a_then_start_b(
    make_agent: MakeAgent, tmp_path: Path
) -> tuple[RuntimeEnvAgent, Any, Any, asyncio.Task[Any], Path]:
    agent = await make_agent(registry=_registry())
    a = agent.parse({"shared": "code", "env_vars": {"WHO": "a"}})
    await agent.get_or_create(a, "holder-a")
    await agent.release(a.env_id, "holder-a")  # A is cached, unheld: its tree is evictable
    gate = tmp_path / "open"
    b = agent.parse({"shared": "code", "env_vars": {"WHO": "b"}, "gate": str(gate)})
    building = asyncio.create_task(agent.get_or_create(b, "holder-b"))
    await _chosen(agent, b.env_id, "shared")
    return agent, a, b, building, gate


async def _pins(agent: RuntimeEnvAgent) -> list[tuple[str, str]]:
    with agent.cache._lock:
        return list(agent.cache._db.execute("SELECT uri, env_id FROM pins"))


async def test_a_gc_between_choice_and_ready_keeps_what_the_build_chose(
    make_agent: MakeAgent, tmp_path: Path
) -> None:
    agent, _a, b, building, gate = await _build_a_then_start_b(make_agent, tmp_path)
    evicted = await agent.gc(0)  # evict every unreferenced resource
    assert not [e for e in evicted if e["plugin"] == "shared"], evicted
    gate.touch()
    ctx = await asyncio.wait_for(building, 120)
    assert Path(ctx.cwd, "main.py").read_text() == "print('hello')\n"
    assert await _pins(agent) == []  # the pin ended with the build
    # Held now the ordinary way; released, it is evictable again.
    assert not [e for e in await agent.gc(0) if e["plugin"] == "shared"]
    await agent.release(b.env_id, "holder-b")
    assert [e["plugin"] for e in await agent.gc(0) if e["plugin"] == "shared"]


async def test_a_delete_of_the_other_env_during_the_build_keeps_what_the_build_chose(
    make_agent: MakeAgent, tmp_path: Path
) -> None:
    agent, a, _b, building, gate = await _build_a_then_start_b(make_agent, tmp_path)
    await agent.remove(a.env_id)
    gate.touch()
    ctx = await asyncio.wait_for(building, 120)
    assert Path(ctx.cwd, "main.py").is_file()


async def test_a_gc_from_another_process_during_the_build_keeps_what_the_build_chose(
    make_agent: MakeAgent, tmp_path: Path, cache_dir: Path
) -> None:
    _agent, _a, _b, building, gate = await _build_a_then_start_b(make_agent, tmp_path)
    cli = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "jupyter_runtimeenv", "--cache-dir", str(cache_dir)),
        *("gc", "--max-bytes", "0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(cli.communicate(), 120)
    assert cli.returncode == 0, out
    gate.touch()
    ctx = await asyncio.wait_for(building, 120)
    assert Path(ctx.cwd, "main.py").is_file(), out


async def test_pins_of_a_build_killed_midway_are_dropped(
    make_agent: MakeAgent, tmp_path: Path
) -> None:
    agent, _a, b, building, _gate = await _build_a_then_start_b(make_agent, tmp_path)
    assert [env for _, env in await _pins(agent)] == [b.env_id]
    # A pin whose owner is gone (pid 1's start time is not ours) is dropped by the next GC.
    with agent.cache._tx() as db:
        db.execute("UPDATE pins SET owner_pid = 1, owner_started = 1.0")
    assert [e["plugin"] for e in await agent.gc(0)] == ["shared"]
    building.cancel()
