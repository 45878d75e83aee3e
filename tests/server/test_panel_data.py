"""What the sidebar shows and does, from the server's side (issue 21 items 5, 10 and the
sidebar's data), against a real Jupyter server and real kernels: GC lists and removes every
environment nobody holds (a failed build holds nothing), a kernel reports its declared envs
by name and what each busy worker runs with its CPU, and a task run in an env is a use."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from jupyter_runtimeenv.server.kernels import WORKERS_SCHEMA_ID
from tests.kernels.test_kernels import run, start_kernel
from tests.server.plugins import script
from tests.server.test_panel import call, refused

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def extension_config() -> dict[str, Any]:
    return {"kernel_sweep_interval": 0.2}


async def test_gc_lists_every_unheld_env_with_its_bytes_then_removes_them(
    jp_fetch: Any,
) -> None:
    kept = await call(jp_fetch, "POST", "envs", body=script("kept"), params={"wait": "1"})
    loose = await call(jp_fetch, "POST", "envs", body=script("loose"), params={"wait": "1"})
    failed = await call(
        jp_fetch, "POST", "envs", body=script("failed", fail=True), params={"wait": "1"}
    )
    assert failed["state"] == "FAILED"
    await call(jp_fetch, "DELETE", "envs", loose["env_id"], "holders", "user")

    plan = await call(jp_fetch, "GET", "gc", "unreferenced")
    listed = {e["env_id"]: e for e in plan["envs"]}
    # The failed one too: a failed build holds nothing (its asker's reference went with it).
    assert set(listed) == {loose["env_id"], failed["env_id"]}
    assert listed[loose["env_id"]]["bytes"] == 2  # what the script plugin's create() said
    assert listed[failed["env_id"]]["bytes"] == 0
    assert plan["bytes"] == 2
    assert plan["held"] == 1

    # Taken meanwhile: kept. The rest goes.
    await call(jp_fetch, "POST", "envs", body=script("loose"), params={"holder": "cli"})
    done = await call(
        jp_fetch, "POST", "gc", "unreferenced", body={"env_ids": [*listed, "0" * 64, "zz"]}
    )
    assert done["removed"] == [failed["env_id"]]
    assert set(done["kept"]) == {loose["env_id"], "0" * 64, "zz"}
    assert done["freed_bytes"] == 0
    await call(jp_fetch, "DELETE", "envs", loose["env_id"], "holders", "cli")
    done = await call(jp_fetch, "POST", "gc", "unreferenced", body={"env_ids": [loose["env_id"]]})
    assert done == {"removed": [loose["env_id"]], "kept": [], "freed_bytes": 2}
    remaining = {e["env_id"] for e in (await call(jp_fetch, "GET", "envs"))["envs"]}
    assert remaining == {kept["env_id"]}

    code, body = await refused(jp_fetch, "POST", "gc", "unreferenced", body={"env_ids": "x"})
    assert (code, body["message"]) == (400, "env_ids: expected a list of env ids")


async def test_gc_says_how_many_unheld_envs_stay_because_they_are_building(
    jp_fetch: Any,
) -> None:
    """An env released while it builds is held by nobody yet not collected: the plan counts
    it (the sidebar said "the cache is empty" when nothing else was there)."""
    slow = await call(jp_fetch, "POST", "envs", body=script("slow", lines=400, sleep=0.05))
    await call(jp_fetch, "DELETE", "envs", slow["env_id"], "holders", "user")
    plan = await call(jp_fetch, "GET", "gc", "unreferenced")
    assert (plan["envs"], plan["held"], plan["building"]) == ([], 0, 1)
    await call(jp_fetch, "DELETE", "envs", slow["env_id"])  # cancels the build


async def test_report_fields_are_checked_and_named(jp_fetch: Any) -> None:
    kernel_id = await start_kernel(jp_fetch, "python3")
    worker = {"pid": 12345, "busy": True, "tasks_done": 0, "tasks_failed": 0}
    cases = [
        ({"declared": [{"name": 3, "env_id": "a" * 64}]}, "declared[0].name: expected a name"),
        ({"declared": [{"name": None, "env_id": "xyz"}]}, "declared[0].env_id: expected an env"),
        ({"declared": "all"}, "declared: expected a list"),
        (
            {"pools": [{"env_id": "e", "workers": [{**worker, "task": {"name": "f"}}]}]},
            "pools[0].workers[0].task.started: expected epoch seconds",
        ),
        (
            {"pools": [{"env_id": "e", "workers": [{**worker, "cpu": True}]}]},
            "pools[0].workers[0].cpu: expected a percentage or null",
        ),
    ]
    for body, message in cases:
        code, answer = await refused(jp_fetch, "POST", "kernels", kernel_id, body=body)
        assert code == 400
        assert answer["message"].startswith(message), answer


BUSY = """
%load_ext jupyter_runtimeenv
%runtime_env --env-var WHO=default --no-widget
%runtime_env --name slow --env-var WHO=slow --no-widget
@remote
def spin(seconds):
    import time
    end = time.time() + seconds
    while time.time() < end:
        pass
spin.remote(0).result(timeout=120)
running = spin.remote(300)
print("started")
"""


async def test_a_kernel_reports_names_tasks_and_cpu_and_tasks_are_uses(
    jp_fetch: Any, jp_serverapp: Any
) -> None:
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def listener(logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        events.put_nowait(data)

    jp_serverapp.event_logger.add_listener(schema_id=WORKERS_SCHEMA_ID, listener=listener)
    kernel_id = await start_kernel(jp_fetch, "python3")
    assert "started" in await run(jp_serverapp, kernel_id, BUSY)

    async def report() -> dict[str, Any]:
        deadline = time.monotonic() + 60
        while True:
            kernels = (await call(jp_fetch, "GET", "overview"))["kernels"]
            mine = [k for k in kernels if k["kernel_id"] == kernel_id]
            workers = [w for k in mine for p in k["pools"] for w in p["workers"]]
            # The spinning worker uses a core (a share of one on a loaded machine), and each
            # declared env's pool has its env (a pool is reported once its env is acquired:
            # the second env's may come a report later).
            declared = {d["env_id"] for k in mine for d in k["declared"]}
            pooled = {p["env_id"] for k in mine for p in k["pools"]}
            busy = any(w["busy"] and (w.get("cpu") or 0) > 5 for w in workers)
            if mine and busy and declared and declared <= pooled:
                return mine[0]
            assert time.monotonic() < deadline, mine
            await asyncio.sleep(0.3)

    kernel = await report()
    names = [(d["name"], d["env_id"]) for d in kernel["declared"]]
    assert [n for n, _ in names] == [None, "slow"]
    default_id = names[0][1]
    # The declared ids are the ones the pools run in (each env's first worker was started).
    assert {p["env_id"] for p in kernel["pools"]} == {i for _, i in names}
    [pool] = [p for p in kernel["pools"] if p["env_id"] == default_id]
    [busy] = [w for w in pool["workers"] if w["busy"]]
    assert busy["task"]["name"] == "spin"
    assert 0 < busy["task"]["started"] <= time.time()
    # The declared envs reach the event stream by name and id only (no specs).
    event = await asyncio.wait_for(events.get(), 30)
    while event.get("kind") != "report" or not event.get("declared"):
        event = await asyncio.wait_for(events.get(), 30)
    assert all(set(d) == {"name", "env_id"} for d in event["declared"])

    # A task run in the env is a use: its last use moves past the build's.
    env = await call(jp_fetch, "GET", "envs", default_id)
    before = env.get("last_used") or env["updated"]
    await run(jp_serverapp, kernel_id, "running.cancel()\nspin.remote(0).result(timeout=60)")
    deadline = time.monotonic() + 60
    while True:
        summaries = (await call(jp_fetch, "GET", "envs"))["envs"]
        [mine] = [e for e in summaries if e["env_id"] == default_id]
        if (mine.get("last_used") or 0) > before:
            break
        assert time.monotonic() < deadline, (mine, before)
        await asyncio.sleep(0.3)
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
