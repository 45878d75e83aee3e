"""Events through the server's event logger and websocket; the loop never blocks; a clean stop."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from processes import cmdline, descendants, wait_gone

from jupyter_runtimeenv.server.events import SCHEMA_ID
from tests.server.jupyter_fixtures import API
from tests.server.plugins import script
from tests.wheelhouse import make_wheelhouse, offline_installers


async def post(jp_fetch: Any, spec: dict[str, Any], **params: str) -> dict[str, Any]:
    response = await jp_fetch(*API, "envs", method="POST", body=json.dumps(spec), params=params)
    body: dict[str, Any] = json.loads(response.body)
    return body


async def test_events_reach_the_event_logger_and_the_websocket(
    jp_fetch: Any, jp_ws_fetch: Any, jp_serverapp: Any
) -> None:
    seen: list[dict[str, Any]] = []

    async def listener(logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        seen.append(data)

    jp_serverapp.event_logger.add_listener(schema_id=SCHEMA_ID, listener=listener)
    ws = await jp_ws_fetch("api", "events", "subscribe")
    try:
        env = await post(jp_fetch, script("events", lines=5), wait="true")
        assert env["state"] == "READY"
        from_ws: list[dict[str, Any]] = []

        async def read_until_ready() -> None:
            while True:
                message = json.loads(await ws.read_message())
                if message.get("schema_id") == SCHEMA_ID:
                    from_ws.append(message)
                    if message.get("state") == "READY":
                        return

        await asyncio.wait_for(read_until_ready(), 10)
    finally:
        ws.close()
    await asyncio.sleep(0.05)  # listeners run as tasks

    mine = [e for e in seen if e["env_id"] == env["env_id"]]
    states = [e["state"] for e in mine if e["kind"] == "state"]
    assert states == ["PENDING", "BUILDING", "READY"]
    steps = [e["status"] for e in mine if e["kind"] == "step"]
    assert steps[0] == "running"
    assert steps[-1] == "done"
    lines = [line for e in mine if e["kind"] == "log" for line in e["lines"]]
    assert [f"script line {i}" for i in range(5)] == [x for x in lines if "script line" in x]
    # A step's lines arrive before the step's end and the READY state.
    kinds = [e["kind"] for e in mine]
    assert kinds.index("log") < len(kinds) - 1 - kinds[::-1].index("step")
    assert [e["state"] for e in from_ws if e["kind"] == "state"] == states

    # GET status's counts are kept with each state event, not recounted per request: after
    # PENDING -> BUILDING -> READY and after a removal they equal a recount of the states.
    ext = jp_serverapp.web_app.settings["jupyter_runtimeenv"]

    def recount() -> dict[str, int]:
        return dict(Counter(ext._states.values()))

    status = json.loads((await jp_fetch(*API, "status")).body)["envs"]
    assert status == recount()
    assert status.get("READY", 0) >= 1
    await jp_fetch(*API, "envs", env["env_id"], method="DELETE", params={"force": "true"})
    await asyncio.sleep(0.05)
    assert env["env_id"] not in ext._states
    assert ext.state_counts() == recount()
    assert sum(ext.state_counts().values()) == len(ext._states)


@pytest.mark.slow
async def test_the_loop_keeps_answering_while_four_envs_install(
    jp_fetch: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheelhouse = make_wheelhouse(tmp_path / "wheelhouse")
    offline_installers(monkeypatch, wheelhouse)
    options = ["--no-index", "--find-links", str(wheelhouse)]
    specs = [
        {"pip": {"packages": packages, "install_options": options}}
        for packages in (["alpha==1.0"], ["alpha==2.0"], ["beta"], ["delta"])
    ]
    envs = [await post(jp_fetch, spec) for spec in specs]
    assert len({e["env_id"] for e in envs}) == 4

    latencies: list[float] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        start = time.perf_counter()
        response = await jp_fetch(*API, "status")
        latencies.append(time.perf_counter() - start)
        counts = json.loads(response.body)["envs"]
        if counts.get("READY", 0) + counts.get("FAILED", 0) == 4:
            break
        await asyncio.sleep(0.01)
    for env in envs:
        final = json.loads((await jp_fetch(*API, "envs", env["env_id"])).body)
        assert final["state"] == "READY", final["error"]
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1] if len(latencies) > 1 else latencies[0]
    print(f"GET status while building: n={len(latencies)} p99={p99 * 1000:.1f} ms")
    assert len(latencies) > 5
    assert latencies[-1] < 1.0, f"the server stalled {latencies[-1]:.2f} s while building"


async def test_the_server_stops_clean_killing_builds(jp_fetch: Any, jp_serverapp: Any) -> None:
    # The build's processes by their command line (the script's name is its argument), not
    # as "children that were not there before": the test process has other children that
    # come and go (kernels and pools earlier tests left, restarted or reaped at any moment).
    name = f"slow_{uuid.uuid4().hex[:12]}"

    def build_processes() -> list[int]:
        return [p.pid for p in descendants() if name in cmdline(p)]

    env = await post(jp_fetch, script(name, lines=600, sleep=0.1))
    deadline = time.monotonic() + 120
    while not (builders := build_processes()):
        assert time.monotonic() < deadline, "the build's process never started"
        await asyncio.sleep(0.05)

    await jp_serverapp._cleanup()  # what the server runs when it stops

    # Gone (not how fast: SIGKILLed, then reaped by the loop's child watcher), and none of
    # the build's started meanwhile.
    assert not wait_gone(builders, timeout=60)
    assert not wait_gone(build_processes(), timeout=60)
    assert "JUPYTER_RUNTIMEENV_URL" not in os.environ
    ext = jp_serverapp.web_app.settings["jupyter_runtimeenv"]
    assert ext.agent_started is False
    assert env["state"] in ("PENDING", "BUILDING")
    assert ext.state_counts() == {"FAILED": 1}  # the build was cancelled, not left running
