from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from fakes import (
    CountingPlugin,
    FailingPlugin,
    HangingPlugin,
    OtherPlugin,
    PrefixPlugin,
    SlowSyncPlugin,
    pid_file,
)

from jupyter_runtimeenv.agent import Event, RuntimeEnvAgent
from jupyter_runtimeenv.context import compose
from jupyter_runtimeenv.errors import BuildError, BuildTimeout, EnvInUse, EnvNotFound
from jupyter_runtimeenv.plugins import PluginRegistry
from jupyter_runtimeenv.plugins.env_vars import EnvVarsPlugin
from jupyter_runtimeenv.plugins.py_executable import PyExecutablePlugin

MakeAgent = Callable[..., Any]


def registry() -> PluginRegistry:
    return PluginRegistry(
        [
            EnvVarsPlugin(),
            PyExecutablePlugin(),
            CountingPlugin(),
            OtherPlugin(),
            SlowSyncPlugin(),
            HangingPlugin(),
            FailingPlugin(),
            PrefixPlugin(),
        ]
    )


@pytest.fixture
def creates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "creates.txt"
    monkeypatch.setenv("FAKE_CREATES", str(path))
    return path


async def test_fifty_concurrent_requests_build_once(make_agent: MakeAgent, creates: Path) -> None:
    agent = await make_agent(registry=registry())
    spec = agent.parse({"counting": {"name": "a", "sleep": 0.2}, "env_vars": {"X": "1"}})
    contexts = await asyncio.gather(*(agent.get_or_create(spec, f"h{i}") for i in range(50)))
    assert len(pid_file(creates)) == 1
    assert len({c.to_json_str() for c in contexts}) == 1
    status = await agent.env_status(spec.env_id)
    assert status["state"] == "READY"
    assert len(status["holders"]) == 50
    assert contexts[0].env_vars["COUNTING_A"].startswith(str(agent.cache.root))


async def test_two_envs_sharing_a_resource_create_it_once(
    make_agent: MakeAgent, creates: Path
) -> None:
    agent = await make_agent(registry=registry())
    one = agent.parse({"counting": {"name": "shared", "sleep": 0.2}, "env_vars": {"A": "1"}})
    two = agent.parse({"counting": {"name": "shared", "sleep": 0.2}, "env_vars": {"A": "2"}})
    a, b = await asyncio.gather(agent.get_or_create(one, "h"), agent.get_or_create(two, "h"))
    assert a.env_id != b.env_id
    assert a.env_vars["COUNTING_SHARED"] == b.env_vars["COUNTING_SHARED"]
    assert len(pid_file(creates)) == 1


async def test_independent_plugins_overlap(make_agent: MakeAgent) -> None:
    agent = await make_agent(registry=registry())
    events: list[Event] = []
    agent.add_listener(events.append)
    spec = agent.parse(
        {"counting": {"name": "p", "sleep": 0.5}, "other": {"name": "q", "sleep": 0.5}}
    )
    await agent.get_or_create(spec, "h")
    spans: dict[str, list[float]] = {}
    for e in events:
        if e.kind == "step" and e.data["status"] == "running":
            spans[e.data["step"].split()[0]] = [e.time]
        elif e.kind == "step" and e.data["status"] == "done":
            spans[e.data["step"].split()[0]].append(e.time)
    (a_start, a_end), (b_start, b_end) = spans["counting"], spans["other"]
    assert a_start < b_end, spans
    assert b_start < a_end, spans


async def test_install_limit_serialises_installs(make_agent: MakeAgent) -> None:
    agent = await make_agent(registry=registry(), max_concurrent_installs=1)
    events: list[Event] = []
    agent.add_listener(events.append)
    spec = agent.parse(
        {"counting": {"name": "p", "sleep": 0.3}, "other": {"name": "q", "sleep": 0.3}}
    )
    await agent.get_or_create(spec, "h")
    # Each create logs "installing" inside the slot and "created" after leaving it.
    order = [
        e.data["line"].split()[0]
        for e in events
        if e.kind == "log" and "creating" not in e.data["line"]
    ]
    assert order == ["installing", "created", "installing", "created"]


async def test_log_lines_are_events_before_the_step_ends(make_agent: MakeAgent) -> None:
    agent = await make_agent(registry=registry())
    events: list[Event] = []
    agent.add_listener(events.append)
    spec = agent.parse({"counting": {"name": "logs"}})
    await agent.get_or_create(spec, "h")
    kinds = [
        (e.kind, e.data.get("status") or e.data.get("state") or e.data.get("line")) for e in events
    ]
    assert ("state", "BUILDING") in kinds
    assert kinds.index(("log", "created counting://logs")) < kinds.index(("step", "done"))
    assert kinds[-1] == ("state", "READY")
    log = await agent.log(spec.env_id)
    assert "[counting] created counting://logs" in log


async def test_subscribe_yields_events(make_agent: MakeAgent) -> None:
    agent = await make_agent(registry=registry())
    spec = agent.parse({"counting": {"name": "sub", "sleep": 0.1}})
    seen: list[Event] = []

    async def follow() -> None:
        async for event in agent.subscribe():
            seen.append(event)
            if event.kind == "state" and event.data["state"] == "READY":
                return

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0)
    await agent.get_or_create(spec, "h")
    await asyncio.wait_for(follower, 10)
    assert {e.kind for e in seen} == {"state", "step", "log"}


async def test_deadline_kills_the_process_group(make_agent: MakeAgent) -> None:
    agent = await make_agent(registry=registry())
    spec = agent.parse({"hanging": "x", "config": {"setup_timeout_seconds": 2}})
    with pytest.raises(BuildTimeout) as info:
        await agent.get_or_create(spec, "h")
    error = info.value
    assert error.env_id == spec.env_id
    assert "hanging" in error.step
    assert "setup_timeout_seconds" in str(error)
    log = await agent.log(spec.env_id)
    match = re.search(r"pid (\d+) grandchild (\d+)", log)
    assert match, log
    for pid in map(int, match.groups()):
        assert not _alive(pid), f"process {pid} survived the deadline"
    assert list((agent.cache.root / "tmp").iterdir()) == []


def _alive(pid: int, grace: float = 5.0) -> bool:
    """Whether ``pid`` still runs ``grace`` seconds after it was sent SIGKILL.

    SIGKILL is delivered asynchronously: on a loaded machine an orphaned grandchild can still
    be scheduled for a moment after ``killpg`` returns, so a signalled process gets a bounded
    time to go (a correctness bound, not a timing claim).
    """
    try:
        process = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return False
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            return False
        time.sleep(0.05)
    return True


async def test_agent_build_timeout_caps_the_spec(make_agent: MakeAgent) -> None:
    agent = await make_agent(registry=registry(), build_timeout=1)
    spec = agent.parse({"hanging": "y"})
    with pytest.raises(BuildTimeout, match="within 1 s"):
        await agent.get_or_create(spec, "h")


async def test_failure_is_remembered_then_retry_rebuilds(
    make_agent: MakeAgent, tmp_path: Path
) -> None:
    flag = tmp_path / "broken"
    flag.write_text("")
    agent = await make_agent(registry=registry())
    events: list[Event] = []
    agent.add_listener(events.append)
    spec = agent.parse({"failing": str(flag)})
    with pytest.raises(BuildError) as info:
        await agent.get_or_create(spec, "h")
    error = info.value
    assert error.step == "failing"
    assert "fake installer failed with exit code 1" in str(error)
    assert "No matching distribution found for thing" in "\n".join(error.output_tail)
    assert error.log_path
    assert Path(error.log_path).exists()
    # Nothing half-built is kept, and nothing is in the index.
    assert list((agent.cache.root / "tmp").iterdir()) == []
    assert agent.cache.resources() == []

    starts = sum(1 for e in events if e.kind == "state" and e.data["state"] == "BUILDING")
    with pytest.raises(BuildError):  # remembered: no new build
        await agent.get_or_create(spec, "h")
    assert sum(1 for e in events if e.kind == "state" and e.data["state"] == "BUILDING") == starts

    flag.unlink()
    ctx = await agent.get_or_create(spec, "h", retry=True)
    assert ctx.env_id == spec.env_id
    assert (await agent.env_status(spec.env_id))["state"] == "READY"


async def test_failure_memory_expires(make_agent: MakeAgent, tmp_path: Path) -> None:
    flag = tmp_path / "broken"
    flag.write_text("")
    agent = await make_agent(registry=registry(), failure_ttl=0)
    spec = agent.parse({"failing": str(flag)})
    with pytest.raises(BuildError):
        await agent.get_or_create(spec, "h")
    flag.unlink()
    await agent.get_or_create(spec, "h")


async def test_loop_keeps_ticking_while_a_sync_plugin_blocks(make_agent: MakeAgent) -> None:
    agent = await make_agent(registry=registry())
    spec = agent.parse({"slow_sync": 1.5})
    gaps: list[float] = []

    async def tick() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    ctx = await agent.get_or_create(spec, "h")
    ticker.cancel()
    assert ctx.env_vars["SLOW_SYNC"] == "1"
    assert "sleeping in a thread" in await agent.log(spec.env_id)
    # The sync create blocked for 1.5 s; the loop went on ticking (a gross-stall bound only).
    assert len(gaps) > 20
    assert max(gaps) < 1.0


async def test_plugins_modify_context_in_priority_order(make_agent: MakeAgent) -> None:
    agent = await make_agent(registry=registry())
    spec = agent.parse({"nice": 10, "py_executable": "python3", "env_vars": {"A": "1"}})
    ctx = await agent.get_or_create(spec, "h")
    assert ctx.command_prefix == ("nice", "-n", "10")
    assert ctx.python.endswith("python3")
    assert compose(ctx, ["-c", "pass"]) == ["nice", "-n", "10", ctx.python, "-c", "pass"]


async def test_release_and_remove(make_agent: MakeAgent) -> None:
    agent = await make_agent(registry=registry())
    spec = agent.parse({"counting": {"name": "rm"}})
    ctx = await agent.get_or_create(spec, "k1")
    await agent.get_or_create(spec, "k2")
    assert await agent.release(spec.env_id, "k1")
    assert not await agent.release(spec.env_id, "k1")
    with pytest.raises(EnvInUse, match="k2"):
        await agent.remove(spec.env_id)
    assert await agent.release_holder("k2") == [spec.env_id]
    removed = await agent.remove(spec.env_id)
    assert removed == ["counting://rm"]
    assert not Path(ctx.env_vars["COUNTING_RM"]).exists()
    with pytest.raises(EnvNotFound):
        await agent.env_status(spec.env_id)
    with pytest.raises(EnvNotFound):
        await agent.remove(spec.env_id)


async def test_stop_cancels_builds_and_kills_processes(cache_dir: Path) -> None:
    agent = RuntimeEnvAgent(cache_dir, registry=registry())
    await agent.start()
    spec = agent.parse({"hanging": "stop"})
    await agent.ensure(spec, "h")
    for _ in range(200):
        if "grandchild" in "".join(agent._logs[spec.env_id].lines):
            break
        await asyncio.sleep(0.05)
    match = re.search(r"pid (\d+) grandchild (\d+)", "".join(agent._logs[spec.env_id].lines))
    assert match
    await agent.stop()
    for pid in map(int, match.groups()):
        assert not _alive(pid)
    assert list((cache_dir / "tmp").iterdir()) == []


async def test_plugin_bug_fails_the_env_not_the_agent(make_agent: MakeAgent) -> None:
    agent = await make_agent(registry=registry())
    spec = agent.parse({"counting": {"name": "bug", "explode": True}})
    with pytest.raises(BuildError, match="ValueError"):
        await agent.get_or_create(spec, "h")
    ok = agent.parse({"counting": {"name": "fine"}})
    assert (await agent.get_or_create(ok, "h")).env_id == ok.env_id


def test_process_env_carries_sys_path_and_env_id() -> None:
    from jupyter_runtimeenv.context import SYS_PATH_VAR, EnvContext, process_env

    ctx = EnvContext(env_vars={"A": "1"}, extra_paths=("/w",), driver_sys_path=("/d",), env_id="e")
    env = process_env(ctx, {"PATH": "/bin"})
    assert env["A"] == "1"
    assert env["PATH"] == "/bin"
    assert env[SYS_PATH_VAR] == '["/w", "/d"]'
    assert env["JUPYTER_RUNTIMEENV_ENV_ID"] == "e"
    assert EnvContext.from_json(ctx.to_json()) == ctx
