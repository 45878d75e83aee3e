"""A resource's creation is claimed under its cross-process lock: at once where the lock is
free, after the holder is done where another process holds it; given back if cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fakes import CountingPlugin, pid_file

from jupyter_runtimeenv.agent.flock import FileLock
from jupyter_runtimeenv.errors import BuildError, EnvNotFound
from jupyter_runtimeenv.plugins import PluginRegistry

MakeAgent = Callable[..., Any]


@pytest.fixture
def creates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "creates.txt"
    monkeypatch.setenv("FAKE_CREATES", str(path))
    return path


def _spec(name: str) -> dict[str, Any]:
    return {"counting": {"name": name, "bytes": 10}}


def _other_process_lock(agent: Any, uri: str) -> FileLock:
    """The resource's lock as another process takes it: its own descriptor (flock)."""
    return FileLock(agent.cache.lock_for(uri).lock_file)


async def test_a_free_lock_is_claimed_and_given_back(make_agent: MakeAgent, creates: Path) -> None:
    agent = await make_agent(registry=PluginRegistry([CountingPlugin()]))
    ctx = await agent.get_or_create(agent.parse(_spec("free")), "h")
    assert Path(ctx.env_vars["COUNTING_FREE"], "payload").exists()
    assert len(pid_file(creates)) == 1
    assert not list((agent.cache.root / "tmp").iterdir())  # the build's tmp went
    other = _other_process_lock(agent, "counting://free")
    other.acquire(timeout=0)  # our lock was released
    other.release()


async def test_a_lock_another_process_holds_is_waited_for(
    make_agent: MakeAgent, creates: Path
) -> None:
    agent = await make_agent(registry=PluginRegistry([CountingPlugin()]))
    other = _other_process_lock(agent, "counting://held")
    other.acquire(timeout=0)
    build = asyncio.create_task(agent.get_or_create(agent.parse(_spec("held")), "h"))
    await asyncio.sleep(0.5)
    assert not build.done()
    assert not pid_file(creates)  # nothing created while the other holds it
    other.release()
    ctx = await asyncio.wait_for(build, 30)
    assert Path(ctx.env_vars["COUNTING_HELD"], "payload").exists()
    assert len(pid_file(creates)) == 1


async def test_a_build_cancelled_while_it_waits_leaves_the_lock_free(
    make_agent: MakeAgent, creates: Path
) -> None:
    agent = await make_agent(registry=PluginRegistry([CountingPlugin()]))
    other = _other_process_lock(agent, "counting://gone")
    other.acquire(timeout=0)
    spec = agent.parse(_spec("gone"))
    build = asyncio.create_task(agent.get_or_create(spec, "h"))
    await asyncio.sleep(0.3)
    await agent.remove(spec.env_id, force=True)  # cancels its build
    with pytest.raises((BuildError, EnvNotFound)):  # cancelled, then forgotten
        await build
    other.release()
    await asyncio.sleep(0.5)  # a waiting acquire in a thread gives up within 0.2 s
    other.acquire(timeout=0)  # nobody else holds it
    other.release()
    assert not pid_file(creates)
