"""The sidebar's endpoints (``server/panel.py``) against a real Jupyter server, real kernels
and real worker processes."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_runtimeenv.server.kernels import WORKERS_SCHEMA_ID
from tests.kernels.test_kernels import run, start_kernel
from tests.server.jupyter_fixtures import API
from tests.server.plugins import script


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


PANEL_ROUTES = [
    ("GET", ("overview",)),
    ("POST", ("envs", "a" * 64, "rebuild")),
    ("GET", ("kernels",)),
    ("GET", ("kernels", "k")),
    ("POST", ("kernels", "k")),
    ("GET", ("kernels", "k", "notebook_env")),
    ("DELETE", ("kernels", "k", "workers", "123")),
    ("POST", ("notebook_env",)),
]


@pytest.mark.parametrize(("method", "path"), PANEL_ROUTES)
async def test_every_panel_route_refuses_requests_without_the_token(
    jp_fetch: Any, method: str, path: tuple[str, ...]
) -> None:
    for token in ("", "token wrong"):
        code, _ = await refused(jp_fetch, method, *path, headers={"Authorization": token})
        assert code == 403


async def test_overview_gives_sizes_ages_and_holders_named_as_users_know_them(
    jp_fetch: Any,
) -> None:
    env = await call(jp_fetch, "POST", "envs", body=script("sized"), params={"wait": "true"})
    await call(jp_fetch, "POST", "envs", body=script("sized"), params={"holder": "cli"})
    await call(jp_fetch, "POST", "envs", body=script("sized"), params={"holder": "kernel:abc/x"})
    overview = await call(jp_fetch, "GET", "overview")
    (mine,) = [e for e in overview["envs"] if e["env_id"] == env["env_id"]]
    assert mine["state"] == "READY"
    assert mine["size"] == 2  # what the script plugin's create() returned
    assert mine["last_used"] >= mine["created"] > 0
    labels = {h["id"]: h["label"] for h in mine["holders"]}
    assert labels == {"cli": "CLI", "user": "REST (user)", "kernel:abc/x": "kernel abc"}
    assert mine["spec"]["plugins"]
    assert overview["kernels"] == []


async def test_gc_answers_the_bytes_it_freed(jp_fetch: Any) -> None:
    env = await call(jp_fetch, "POST", "envs", body=script("gc"), params={"wait": "true"})
    await call(jp_fetch, "DELETE", "envs", env["env_id"], "holders", "user")
    answer = await call(jp_fetch, "POST", "gc", body={"max_bytes": 0})
    assert answer["freed_bytes"] == sum(e["size"] for e in answer["evicted"]) == 2


async def test_rebuild_retries_a_failed_env_and_rebuilds_a_ready_one(jp_fetch: Any) -> None:
    failed = await call(
        jp_fetch, "POST", "envs", body=script("flaky", fail=True), params={"wait": "true"}
    )
    assert failed["state"] == "FAILED"
    again = await call(jp_fetch, "POST", "envs", failed["env_id"], "rebuild")
    assert again["state"] in ("PENDING", "BUILDING", "FAILED")

    ready = await call(jp_fetch, "POST", "envs", body=script("again"), params={"wait": "true"})
    await call(jp_fetch, "POST", "envs", body=script("again"), params={"holder": "cli"})
    code, body = await refused(jp_fetch, "POST", "envs", ready["env_id"], "rebuild")
    assert (code, body["type"]) == (409, "EnvInUse")
    rebuilt = await call(
        jp_fetch, "POST", "envs", ready["env_id"], "rebuild", params={"force": "true"}
    )
    assert rebuilt["env_id"] == ready["env_id"]
    for _ in range(100):
        env = await call(jp_fetch, "GET", "envs", ready["env_id"])
        if env["state"] == "READY":
            break
        await asyncio.sleep(0.05)
    assert env["state"] == "READY"
    assert env["holders"] == ["cli", "user"]  # a rebuild keeps its holders (issue 21 item 4)

    code, body = await refused(jp_fetch, "POST", "envs", "0" * 64, "rebuild")
    assert code == 404
    code, _ = await refused(jp_fetch, "POST", "envs", "not-an-id", "rebuild")
    assert code == 404  # outside the env-id alphabet, like every other env route


async def test_reports_of_unknown_kernels_and_bad_reports_are_refused(
    jp_fetch: Any, jp_serverapp: Any
) -> None:
    code, _ = await refused(jp_fetch, "POST", "kernels", "nokernel", body={"pools": []})
    assert code == 404
    kernel_id = await start_kernel(jp_fetch, "python3")
    bad = {"pools": [{"env_id": "e", "workers": [{"pid": "12"}]}]}
    code, body = await refused(jp_fetch, "POST", "kernels", kernel_id, body=bad)
    assert (code, body["type"]) == (400, "ReportError")
    assert body["message"] == "pools[0].workers[0].pid: expected int"
    code, body = await refused(jp_fetch, "POST", "kernels", kernel_id, body=[1])
    assert code == 400
    # A pid the kernel never reported cannot be stopped (here: the server's own process).
    code, body = await refused(
        jp_fetch, "DELETE", "kernels", kernel_id, "workers", str(os.getpid())
    )
    assert (code, body["type"]) == (404, "WorkerNotFound")


WORK = """
%load_ext jupyter_runtimeenv
import os, time
@remote
def pid():
    return os.getpid()
first = pid.remote().result(timeout=120)
print(first)
"""


async def next_report(queue: asyncio.Queue[dict[str, Any]], predicate: Any) -> dict[str, Any]:
    async def wait() -> dict[str, Any]:
        while True:
            event = await queue.get()
            if predicate(event):
                return event

    return await asyncio.wait_for(wait(), 60)


async def test_the_worker_of_a_remote_namespace_is_reported_as_kept_for_it(
    jp_fetch: Any, jp_serverapp: Any
) -> None:
    """The sidebar's data names the worker a notebook's %%remote namespace lives in (issue 20
    item 4)."""
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def listener(logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        events.put_nowait(data)

    jp_serverapp.event_logger.add_listener(schema_id=WORKERS_SCHEMA_ID, listener=listener)
    kernel_id = await start_kernel(jp_fetch, "python3")
    cell = "%load_ext jupyter_runtimeenv\n"
    await run(jp_serverapp, kernel_id, cell)
    cell = "%%remote\nimport os\nprint(os.getpid())"
    sticky_pid = int((await run(jp_serverapp, kernel_id, cell)).split()[-1])

    def workers(event: dict[str, Any]) -> dict[int, Any]:
        return {w["pid"]: w["sticky"] for p in event.get("pools", []) for w in p["workers"]}

    label = "%%remote namespace of the default env"
    event = await next_report(events, lambda e: workers(e).get(sticky_pid) == label)
    kept = workers(event)
    overview = await call(jp_fetch, "GET", "overview")
    (kernel,) = overview["kernels"]
    reported = {w["pid"]: w["sticky"] for p in kernel["pools"] for w in p["workers"]}
    assert reported[sticky_pid] == kept[sticky_pid]


async def test_a_kernels_workers_are_reported_stopped_and_dropped_with_the_kernel(
    jp_fetch: Any, jp_serverapp: Any
) -> None:
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def listener(logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        events.put_nowait(data)

    jp_serverapp.event_logger.add_listener(schema_id=WORKERS_SCHEMA_ID, listener=listener)
    kernel_id = await start_kernel(jp_fetch, "python3")
    pid = int((await run(jp_serverapp, kernel_id, WORK)).split()[-1])

    def has_worker(event: dict[str, Any]) -> bool:
        workers = [w for p in event.get("pools", []) for w in p["workers"]]
        return any(w["pid"] == pid and w["tasks_done"] == 1 for w in workers)

    event = await next_report(events, has_worker)
    assert event["kernel_id"] == kernel_id
    assert event["kind"] == "report"
    (pool,) = event["pools"]
    (worker,) = pool["workers"]
    assert worker["busy"] is False
    assert worker["tasks_failed"] == 0
    assert worker["rss"] is None or worker["rss"] > 1_000_000
    overview = await call(jp_fetch, "GET", "overview")
    (kernel,) = overview["kernels"]
    assert kernel["pools"][0]["env_id"] == pool["env_id"]
    assert pool["env_id"] in {e["env_id"] for e in overview["envs"]}

    stopped = await call(jp_fetch, "DELETE", "kernels", kernel_id, "workers", str(pid))
    assert stopped == {"kernel_id": kernel_id, "pid": pid, "stopped": True}
    await next_report(events, lambda e: not has_worker(e))
    assert not Path(f"/proc/{pid}").exists() or _zombie(pid)

    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    gone = await next_report(events, lambda e: e["kind"] == "gone")
    assert gone["kernel_id"] == kernel_id
    assert (await call(jp_fetch, "GET", "kernels"))["kernels"] == []


STUCK = """
@remote
def stuck(marker):
    import os, time
    with open(marker + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(marker + ".tmp", marker)  # whole: the test polls for it
    time.sleep(600)
busy = stuck.remote({marker!r})
"""

OUTCOME = """
try:
    busy.result(timeout=60)
except Exception as exc:
    print(type(exc).__name__, exc)
"""


async def test_a_worker_stopped_from_the_sidebar_is_said_to_be_stopped_not_killed(
    jp_fetch: Any, jp_serverapp: Any, tmp_path: Path
) -> None:
    # Issue 21 item 11: its task's error read "killed by signal 9 (SIGKILL)", like the OOM
    # killer's work.
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def listener(logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        events.put_nowait(data)

    jp_serverapp.event_logger.add_listener(schema_id=WORKERS_SCHEMA_ID, listener=listener)
    kernel_id = await start_kernel(jp_fetch, "python3")
    await run(jp_serverapp, kernel_id, WORK)
    marker = tmp_path / "stuck.pid"
    await run(jp_serverapp, kernel_id, STUCK.format(marker=str(marker)))
    # The worker running the call, not one the report calls busy: a worker holding a call it
    # has not started yet is busy too, and its call would rerun elsewhere once it is stopped.
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert time.monotonic() < deadline, "the task never started"
        await asyncio.sleep(0.05)
    pid = int(marker.read_text())
    await next_report(
        events, lambda e: any(w["pid"] == pid for p in e.get("pools", []) for w in p["workers"])
    )
    await call(jp_fetch, "DELETE", "kernels", kernel_id, "workers", str(pid))
    out = (await run(jp_serverapp, kernel_id, OUTCOME)).strip()
    assert out == f"BrokenWorker worker pid {pid} was stopped from the sidebar while running stuck"
    # The note was taken: nothing is left for a later pid of the same number.
    notes = jp_serverapp.web_app.settings["jupyter_runtimeenv"].kernel_reports.notes_dir
    assert notes is not None
    assert os.listdir(notes) == []
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


DECLARE = """
%load_ext jupyter_runtimeenv
import os
os.makedirs({root!r} + "/nbdir/data", exist_ok=True)
os.chdir({root!r} + "/nbdir")
%runtime_env --env-var MODE=fast --working-dir data --no-widget
%runtime_env --name slow --env-var SPEED=slow --no-widget
print("declared")
"""


async def test_the_kernels_declared_env_becomes_notebook_metadata_and_its_state_is_known(
    jp_fetch: Any, jp_serverapp: Any, jp_root_dir: Path
) -> None:
    kernel_id = await start_kernel(jp_fetch, "python3")
    code, body = await refused(jp_fetch, "GET", "kernels", kernel_id, "notebook_env")
    assert code == 404
    assert "declared no environment" in body["message"]
    assert "declared" in await run(jp_serverapp, kernel_id, DECLARE.format(root=str(jp_root_dir)))
    for _ in range(100):
        report = (await call(jp_fetch, "GET", "kernels"))["kernels"]
        if report and len(report[0]["declared"]) == 2:
            break
        await asyncio.sleep(0.1)
    ids = {d["name"]: d["env_id"] for d in report[0]["declared"]}
    meta = await call(
        jp_fetch,
        "GET",
        "kernels",
        kernel_id,
        "notebook_env",
        params={"path": "nbdir/analysis.ipynb"},
    )
    assert meta["version"] == 1
    assert meta["spec"] == {"env_vars": {"MODE": "fast"}, "working_dir": "data"}
    # Named envs are saved too, and each id is the one the kernel shows (--list, the sidebar).
    assert meta["named"] == {
        "slow": {"spec": {"env_vars": {"SPEED": "slow"}}, "env_id": ids["slow"]}
    }
    assert meta["env_id"] == ids[None]

    # The kernel built them (with its own driver_python and sys.path): the notebook's are
    # cached, under the ids the kernel shows.
    notebook = {"path": "nbdir/analysis.ipynb", "runtime_env": meta}
    status = await call(jp_fetch, "POST", "notebook_env", body=notebook)
    assert status["state"] == "cached"
    assert status["env_id"] == ids[None]
    assert status["default"]["env_id"] == ids[None]
    assert [(n["name"], n["state"], n["env_id"]) for n in status["named"]] == [
        ("slow", "cached", ids["slow"])
    ]
    other = {**meta, "spec": {**meta["spec"], "env_vars": {"MODE": "slow"}}}
    status = await call(jp_fetch, "POST", "notebook_env", body={**notebook, "runtime_env": other})
    assert status["state"] == "missing"
    assert status["env_id"] is None  # no id this server does not have
    assert status["named"][0]["state"] == "cached"
    # A named env alone is a notebook env too; a bad one is refused naming it.
    only_named = {"version": 1, "named": meta["named"]}
    status = await call(
        jp_fetch, "POST", "notebook_env", body={**notebook, "runtime_env": only_named}
    )
    assert (status["state"], status["default"]) == ("cached", None)
    bad = {"version": 1, "named": {"slow": {"spec": {"env_vars": 5}}}}
    code, body = await refused(
        jp_fetch, "POST", "notebook_env", body={**notebook, "runtime_env": bad}
    )
    assert (code, body["field"]) == (400, "named.slow.env_vars")
    # Built from that spec through REST: cached too.
    spec = {"env_vars": {"MODE": "slow"}, "working_dir": str(jp_root_dir / "nbdir" / "data")}
    await call(jp_fetch, "POST", "envs", body=spec, params={"wait": "true"})
    status = await call(jp_fetch, "POST", "notebook_env", body={**notebook, "runtime_env": other})
    assert status["state"] == "cached"

    code, body = await refused(
        jp_fetch, "POST", "notebook_env", body={"path": "x.ipynb", "runtime_env": {"spec": 3}}
    )
    assert (code, body["message"]) == (400, "runtime_env.spec: expected a JSON object")
    code, body = await refused(
        jp_fetch,
        "POST",
        "notebook_env",
        body={"path": "x.ipynb", "runtime_env": {"spec": {"env_vars": 5}}},
    )
    assert (code, body["type"]) == (400, "SpecError")
    code, _ = await refused(
        jp_fetch, "POST", "notebook_env", body={"path": "../../x.ipynb", "runtime_env": meta}
    )
    assert code == 400


async def test_declare_makes_the_notebooks_env_the_kernels_default(
    jp_fetch: Any, jp_serverapp: Any, jp_root_dir: Path
) -> None:
    # The code the badge's "Declare" button runs (labextension/src/notebook.ts declareCode).
    (jp_root_dir / "nb" / "data").mkdir(parents=True)
    spec = json.dumps({"env_vars": {"MODE": "carried"}, "working_dir": "data"})
    named = json.dumps({"slow": {"env_vars": {"SPEED": "slow"}, "working_dir": "data"}})
    code = (
        f"import os\nos.chdir({str(jp_root_dir / 'nb')!r})\n"
        "import json as _jre_json\n"
        "from jupyter_runtimeenv.notebook_meta import declare as _jre_declare\n"
        f"_jre_declare(_jre_json.loads({spec!r}), named=_jre_json.loads({named!r}))\n"
        "from jupyter_runtimeenv.session import default_runtime_env, lookup\n"
        "print(lookup('slow').to_json()['env_vars'])\n"
        "print(default_runtime_env().to_json()['working_dir'])"
    )
    kernel_id = await start_kernel(jp_fetch, "python3")
    out = await run(jp_serverapp, kernel_id, code)
    # Every env the notebook carries is declared again: the default and the named ones.
    assert out.strip().splitlines()[-2:] == [
        "{'SPEED': 'slow'}",
        str(jp_root_dir / "nb" / "data"),
    ]
    for _ in range(100):
        kernels = (await call(jp_fetch, "GET", "kernels"))["kernels"]
        if kernels and kernels[0]["runtime_env"]:
            break
        await asyncio.sleep(0.1)
    assert kernels[0]["runtime_env"]["env_vars"] == {"MODE": "carried"}
    # Built at once (eager), like %runtime_env: the notebook's badge says cached.
    meta = {"version": 1, "spec": json.loads(spec)}
    status = await call(
        jp_fetch, "POST", "notebook_env", body={"path": "nb/x.ipynb", "runtime_env": meta}
    )
    assert status["state"] == "cached"
