"""A kernel's Dask cluster in the sidebar's data (issue 17 item 3): a real Jupyter server, a
real kernel whose session executor is a ``DaskExecutor`` on a real ``LocalCluster`` (two
worker processes on 127.0.0.1), its reports, and the sidebar's Stop and GC carried out by the
kernel (it long-polls its commands)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_runtimeenv.server.cluster import KernelCommands
from jupyter_runtimeenv.server.cluster_report import listed, validate_cluster
from jupyter_runtimeenv.server.kernels import WORKERS_SCHEMA_ID, ReportError
from tests.cluster_kernel import TEARDOWN, setup
from tests.kernels.test_kernels import run, start_kernel
from tests.processes import wait_gone
from tests.server.jupyter_fixtures import API

pytest.importorskip("distributed")


@pytest.fixture
def extension_config() -> dict[str, Any]:
    return {"kernel_sweep_interval": 0.2}


async def call(jp_fetch: Any, method: str, *path: str, body: Any = None, **kw: Any) -> Any:
    if body is not None and not isinstance(body, (str, bytes)):
        body = json.dumps(body)
    if method == "POST" and body is None:
        body = b""
    response = await jp_fetch(*API, *path, method=method, body=body, **kw)
    return json.loads(response.body) if response.body else None


async def refused(jp_fetch: Any, method: str, *path: str, **kw: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(HTTPClientError) as info:
        await call(jp_fetch, method, *path, **kw)
    assert info.value.response is not None
    body = info.value.response.body
    return info.value.code, (json.loads(body) if body else {})


NODE = {
    "address": "tcp://10.0.0.7:40123",
    "name": "0",
    "state": "up",
    "cache_bytes": 10,
    "max_bytes": 100,
    "envs": [
        {
            "env_id": "a" * 64,
            "driver_env_id": "b" * 64,
            "state": "READY",
            "bytes": 5,
            "workers": [{"pid": 4321, "busy": True, "tasks_done": 2, "tasks_failed": 0}],
        }
    ],
}


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ([], "cluster: expected a JSON object or null"),
        ({"nodes": {}}, "cluster.nodes: expected a list of at most 512 nodes"),
        ({"dashboard": "javascript:alert(1)"}, "cluster.dashboard: expected an http(s) URL"),
        ({"nodes": [{**NODE, "address": ""}]}, "cluster.nodes[0].address: expected a node's"),
        ({"nodes": [{**NODE, "state": "odd"}]}, "cluster.nodes[0].state: expected one of"),
        ({"nodes": [{**NODE, "cache_bytes": -1}]}, "cluster.nodes[0].cache_bytes: expected a"),
        (
            {"nodes": [{**NODE, "envs": [{"workers": [{"pid": "1"}]}]}]},
            "cluster.nodes[0].envs[0].workers[0].pid: expected int",
        ),
        (
            {"nodes": [{**NODE, "envs": [{"bytes": True}]}]},
            "cluster.nodes[0].envs[0].bytes: expected a byte count",
        ),
    ],
)
def test_bad_cluster_sections_name_the_field(cluster: Any, message: str) -> None:
    with pytest.raises(ReportError) as info:
        validate_cluster(cluster)
    assert str(info.value).startswith(message)


def test_a_cluster_section_keeps_what_it_knows() -> None:
    clean = validate_cluster(
        {"scheduler": "tcp://s:8786", "dashboard": None, "nodes": [{**NODE, "extra": 1}]}
    )
    assert clean is not None
    (node,) = clean["nodes"]
    assert "extra" not in node
    assert node["envs"][0]["workers"][0]["rss"] is None  # as a local pool's worker
    report = {"cluster": clean}
    assert listed(report, "tcp://10.0.0.7:40123", 4321)
    assert not listed(report, "tcp://10.0.0.8:40123", 4321)  # another node
    assert not listed(report, "tcp://10.0.0.7:40123", 4322)
    assert validate_cluster(None) is None


async def test_commands_wait_for_a_poll_and_their_answer() -> None:
    commands = KernelCommands()
    assert await commands.take("k", 0) == []
    asked = asyncio.create_task(commands.call("k", "gc", {}, timeout=5))
    (command,) = await commands.take("k", 5)
    assert command["action"] == "gc"
    assert not commands.answer("other", command["id"], {"ok": True})  # not its kernel's
    assert commands.answer("k", command["id"], {"ok": True, "result": {"nodes": {}}})
    assert (await asked)["ok"] is True
    assert not commands.answer("k", command["id"], {"ok": True})  # answered already
    with pytest.raises(TimeoutError):
        await commands.call("k", "gc", {}, timeout=0.1)  # nobody polled
    assert await commands.take("k", 0) == []  # a command whose caller gave up is gone


async def next_event(queue: asyncio.Queue[dict[str, Any]], predicate: Any) -> dict[str, Any]:
    async def wait() -> dict[str, Any]:
        while True:
            event = await queue.get()
            if predicate(event):
                return event

    return await asyncio.wait_for(wait(), 120)


def _workers(cluster: dict[str, Any] | None) -> dict[tuple[str, int], dict[str, Any]]:
    return {
        (node["address"], worker["pid"]): worker
        for node in (cluster or {}).get("nodes", [])
        for env in node["envs"]
        for worker in env["workers"]
    }


async def test_a_kernels_cluster_is_reported_and_the_sidebar_stops_and_collects_through_it(
    jp_fetch: Any, jp_serverapp: Any, tmp_path: Path
) -> None:
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def listener(logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        events.put_nowait(data)

    jp_serverapp.event_logger.add_listener(schema_id=WORKERS_SCHEMA_ID, listener=listener)
    kernel_id = await start_kernel(jp_fetch, "python3")
    out = await run(jp_serverapp, kernel_id, setup(str(tmp_path / "nodes")))
    nodes = out.split("nodes:", 1)[1].split()
    assert len(nodes) == 2
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    try:
        # Live: a workers event carries the cluster with both nodes, each running a worker.
        event = await next_event(
            events,
            lambda e: {addr for addr, _pid in _workers(e.get("cluster"))} == set(nodes),
        )
        cluster = event["cluster"]
        seen.update(_workers(cluster))
        assert cluster["scheduler"].startswith("tcp://127.0.0.1:")
        assert cluster["dashboard"].startswith("http://127.0.0.1:")
        assert sorted(n["address"] for n in cluster["nodes"]) == nodes
        for node in cluster["nodes"]:
            assert node["state"] == "up"
            assert node["max_bytes"] > 0
            (env,) = node["envs"]
            assert env["state"] == "READY"
            assert env["driver_env_id"]
            (worker,) = env["workers"]
            assert worker["tasks_done"] >= 0
            assert worker["rss"] is None or worker["rss"] > 1_000_000
        report = await call(jp_fetch, "GET", "kernels", kernel_id)
        assert {n["address"] for n in report["cluster"]["nodes"]} == set(nodes)

        (node, pid), _ = next(iter(_workers(cluster).items()))
        other = next(n for n in nodes if n != node)
        # Only what the kernel's own report lists on that node.
        code, body = await refused(
            jp_fetch, "DELETE", "kernels", kernel_id, "workers", str(pid), params={"node": other}
        )
        assert (code, body["type"]) == (404, "WorkerNotFound")
        code, _ = await refused(
            jp_fetch, "DELETE", "kernels", kernel_id, "workers", "99999", params={"node": node}
        )
        assert code == 404

        stopped = await call(
            jp_fetch, "DELETE", "kernels", kernel_id, "workers", str(pid), params={"node": node}
        )
        assert stopped == {"kernel_id": kernel_id, "pid": pid, "node": node, "stopped": True}
        # Killed on its node, through the kernel.
        assert await asyncio.to_thread(wait_gone, [pid], 10) == []
        await next_event(events, lambda e: (node, pid) not in _workers(e.get("cluster")))

        freed = await call(jp_fetch, "POST", "kernels", kernel_id, "gc")
        assert set(freed["nodes"]) == set(nodes)
        assert freed["freed_bytes"] == sum(freed["nodes"].values()) >= 0
    finally:
        await run(jp_serverapp, kernel_id, TEARDOWN)
        await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    gone = await asyncio.to_thread(wait_gone, [pid for _node, pid in seen], 30)
    assert gone == []  # no env worker outlives the kernel's cluster
    code, body = await refused(jp_fetch, "POST", "kernels", kernel_id, "gc")
    assert code == 404


async def test_gc_and_node_stop_of_a_kernel_without_a_cluster(jp_fetch: Any) -> None:
    kernel_id = await start_kernel(jp_fetch, "python3")
    await call(jp_fetch, "POST", "kernels", kernel_id, body={"pools": []})
    code, body = await refused(jp_fetch, "POST", "kernels", kernel_id, "gc")
    assert (code, body["type"]) == (404, "NoCluster")
    code, body = await refused(
        jp_fetch, "DELETE", "kernels", kernel_id, "workers", "1234", params={"node": "tcp://x:1"}
    )
    assert (code, body["type"]) == (404, "WorkerNotFound")
    code, _ = await refused(jp_fetch, "POST", "kernels", kernel_id, "commands", "c1", body={})
    assert code == 404  # no such command
    assert await call(jp_fetch, "GET", "kernels", kernel_id, "commands") == {"commands": []}


CLUSTER_ROUTES = [
    ("POST", ("kernels", "k", "gc")),
    ("GET", ("kernels", "k", "commands")),
    ("POST", ("kernels", "k", "commands", "c1")),
]


@pytest.mark.parametrize(("method", "path"), CLUSTER_ROUTES)
async def test_every_cluster_route_refuses_requests_without_the_token(
    jp_fetch: Any, method: str, path: tuple[str, ...]
) -> None:
    for token in ("", "token wrong"):
        code, _ = await refused(jp_fetch, method, *path, headers={"Authorization": token})
        assert code == 403
    code, _ = await refused(jp_fetch, "GET", "kernels", "nokernel", "commands")
    assert code == 404  # no such running kernel
