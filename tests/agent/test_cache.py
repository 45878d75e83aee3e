"""The cache: LRU by bytes, references, restarts, interrupted builds, two processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fakes import CountingPlugin, pid_file

from jupyter_runtimeenv.agent import RuntimeEnvAgent
from jupyter_runtimeenv.plugins import PluginRegistry

MakeAgent = Callable[..., Any]
HERE = Path(__file__).parent

AGENT_SCRIPT = """
import asyncio, json, sys
from jupyter_runtimeenv.agent import RuntimeEnvAgent

async def main():
    async with RuntimeEnvAgent(sys.argv[1]) as agent:
        ctx = await agent.get_or_create(json.loads(sys.argv[2]), "proc")
        print(json.dumps(ctx.to_json()), flush=True)

asyncio.run(main())
"""


@pytest.fixture
def creates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "creates.txt"
    monkeypatch.setenv("FAKE_CREATES", str(path))
    return path


def registry() -> PluginRegistry:
    return PluginRegistry([CountingPlugin()])


def counting(name: str, size: int = 1000, sleep: float = 0) -> dict[str, Any]:
    return {"counting": {"name": name, "bytes": size, "sleep": sleep}}


def uris(agent: RuntimeEnvAgent) -> list[str]:
    return sorted(r["uri"] for r in agent.cache.resources())


async def use(agent: RuntimeEnvAgent, name: str, holder: str = "h") -> str:
    spec = agent.parse(counting(name))
    await agent.get_or_create(spec, holder)
    await agent.release(spec.env_id, holder)
    return spec.env_id


async def test_lru_eviction_by_bytes(make_agent: MakeAgent) -> None:
    agent = await make_agent(registry=registry())
    for name in ("a", "b", "c"):
        await use(agent, name)
        await asyncio.sleep(0.01)  # distinct last-use times
    await use(agent, "a")  # a is now the most recently used
    assert agent.cache.total_bytes() == 3000
    evicted = await agent.gc(max_bytes=2000)
    assert [e["uri"] for e in evicted] == ["counting://b"]
    assert uris(agent) == ["counting://a", "counting://c"]
    assert not (agent.cache.root / "resources" / "counting").joinpath("b").exists()
    evicted = await agent.gc(max_bytes=0)
    assert [e["uri"] for e in evicted] == ["counting://c", "counting://a"]
    assert list((agent.cache.root / "resources" / "counting").iterdir()) == []


async def test_references_protect_from_eviction(make_agent: MakeAgent) -> None:
    agent = await make_agent(registry=registry())
    held = agent.parse(counting("held"))
    await agent.get_or_create(held, "kernel-1")
    await asyncio.sleep(0.01)
    await use(agent, "free")
    evicted = await agent.gc(max_bytes=0)
    assert [e["uri"] for e in evicted] == ["counting://free"]
    assert uris(agent) == ["counting://held"]
    await agent.release(held.env_id, "kernel-1")
    assert [e["uri"] for e in await agent.gc(max_bytes=0)] == ["counting://held"]


async def test_evicted_env_is_rebuilt_on_next_request(make_agent: MakeAgent, creates: Path) -> None:
    agent = await make_agent(registry=registry())
    env_id = await use(agent, "again")
    await agent.gc(max_bytes=0)
    assert env_id not in {e["env_id"] for e in await agent.status()}
    ctx = await agent.get_or_create(agent.parse(counting("again")), "h")
    assert Path(ctx.env_vars["COUNTING_AGAIN"], "payload").exists()
    assert len(pid_file(creates)) == 2


async def test_env_evicted_by_another_agent_is_rebuilt(
    make_agent: MakeAgent, creates: Path
) -> None:
    server = await make_agent(registry=registry())
    cli = await make_agent(registry=registry())  # e.g. `jupyter runtimeenv gc` meanwhile
    env_id = await use(server, "shared-root")
    assert [e["uri"] for e in await cli.gc(max_bytes=0)] == ["counting://shared-root"]
    ctx = await server.get_or_create(server.parse(counting("shared-root")), "h")
    assert ctx.env_id == env_id
    assert Path(ctx.env_vars["COUNTING_SHARED-ROOT"], "payload").exists()
    assert len(pid_file(creates)) == 2


async def test_cache_over_its_cap_evicts_after_a_build(make_agent: MakeAgent) -> None:
    agent = await make_agent(registry=registry(), max_cache_bytes=1500)
    await use(agent, "old")
    await asyncio.sleep(0.01)
    await use(agent, "new")
    for _ in range(100):
        if uris(agent) == ["counting://new"]:
            break
        await asyncio.sleep(0.05)
    assert uris(agent) == ["counting://new"]


async def test_restart_keeps_what_was_built(cache_dir: Path, creates: Path) -> None:
    async with RuntimeEnvAgent(cache_dir, registry=registry()) as first:
        spec = first.parse(counting("kept"))
        ctx = await first.get_or_create(spec, "h")
    async with RuntimeEnvAgent(cache_dir, registry=registry()) as second:
        known = {e["env_id"]: e for e in await second.status()}
        assert known[spec.env_id]["state"] == "READY"
        again = await second.get_or_create(spec, "h")
        assert "[counting] created counting://kept" in await second.log(spec.env_id)
    assert again == ctx
    assert len(pid_file(creates)) == 1


def _agent_process(cache_dir: Path, spec: dict[str, Any]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    return subprocess.Popen(
        [sys.executable, "-c", AGENT_SCRIPT, str(cache_dir), json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_interrupted_build_is_never_used(cache_dir: Path, creates: Path) -> None:
    spec = {"plugins": {"fakes.CountingPlugin": {"name": "cut", "sleep": 60}}}
    proc = _agent_process(cache_dir, spec)
    deadline = time.monotonic() + 60
    while not pid_file(creates) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid_file(creates), proc.communicate(timeout=5)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    leftovers = list((cache_dir / "tmp").iterdir())
    assert [p.name.split("-")[0] for p in leftovers] == [str(proc.pid)]

    async def rebuild() -> dict[str, Any]:
        async with RuntimeEnvAgent(cache_dir) as agent:
            assert list((cache_dir / "tmp").iterdir()) == []  # swept at start
            spec["plugins"]["fakes.CountingPlugin"]["sleep"] = 0  # type: ignore[index]
            return (await agent.get_or_create(spec, "h")).to_json()

    sys.path.insert(0, str(HERE))
    try:
        ctx = asyncio.run(rebuild())
    finally:
        sys.path.remove(str(HERE))
    assert Path(ctx["env_vars"]["COUNTING_CUT"], "payload").read_bytes() == b"x" * 10
    assert len(pid_file(creates)) == 2


def test_two_processes_share_one_root(cache_dir: Path, creates: Path) -> None:
    spec = {"plugins": {"fakes.CountingPlugin": {"name": "both", "sleep": 1}}}
    procs = [_agent_process(cache_dir, spec) for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    contexts = [json.loads(out) for out, _err in outputs]
    assert contexts[0] == contexts[1]
    assert len(pid_file(creates)) == 1
    assert Path(contexts[0]["env_vars"]["COUNTING_BOTH"], "payload").exists()


def test_many_processes_open_a_new_cache_at_once(tmp_path: Path) -> None:
    """A server, a CLI and Dask nodes may open one new cache together: none of them fails with
    'database is locked' (SQLite answers SQLITE_BUSY without waiting while it switches a new
    index to WAL). Eight processes wait on one file, then open the cache at the same moment."""
    root, go = tmp_path / "cache", tmp_path / "go"
    code = (
        "import os, sys, time\n"
        "from jupyter_runtimeenv.agent import Cache\n"
        "while not os.path.exists(sys.argv[2]): time.sleep(0.001)\n"
        "Cache(sys.argv[1]).close()\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(root), str(go)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    time.sleep(1.0)  # every process has imported the package and is polling
    go.touch()
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, "\n".join(errors)
