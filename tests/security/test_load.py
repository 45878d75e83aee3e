"""One big request must not slow everyone: per-request work does not grow with the stored envs.

Threat: a 200 MB spec was accepted, and from then on every POST and every ``GET status`` took
seconds, because each request decoded every stored spec and serialised big answers on the
event loop. Now bodies stop at ``max_spec_bytes`` (413), ``GET envs`` pages summaries that are
read without the stored specs, one env is read by its id, and big answers are encoded in a
thread. The proof here is the work done, not a timing (that is
``benchmarks/bench_big_specs.py``): with a near-limit spec and hundreds of envs stored, no
request reads more than the one stored spec it names, and no query walks the stored rows
(every SQL statement the cache runs is traced, and its query plan checked).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Awaitable, Callable
from typing import Any

from jupyter_runtimeenv.server.handlers import SETTINGS_KEY
from tests.security.conftest import Raw

LIMIT = 2**20  # the default max_spec_bytes
MANY = 300


def fake_id(i: int) -> str:
    return hashlib.sha256(f"stored-{i}".encode()).hexdigest()


async def test_requests_read_no_stored_spec_but_the_one_they_name(
    raw: Raw, alive: Callable[[], Awaitable[None]], jp_serverapp: Any
) -> None:
    # Near the body limit: nine variables of 100 KB (one may hold at most 128 KiB, E2BIG).
    near = {"env_vars": {f"BIG{i}": "x" * 100_000 for i in range(9)}}
    code, big = await raw("POST", "envs?wait=1", body=near)
    assert code == 201, big
    code, error = await raw("POST", "envs", body={"env_vars": {"BIG": "x" * LIMIT}})
    assert code == 413, error

    agent = await jp_serverapp.web_app.settings[SETTINGS_KEY].started_agent()
    cache = agent.cache
    spec = {"env_vars": {"N": "1"}, "config": {}}
    for i in range(MANY):
        await asyncio.to_thread(cache.record_env, fake_id(i), spec, {"python": "p"}, [])

    statements: list[str] = []
    cache._db.set_trace_callback(statements.append)  # observes; the cache runs as in production
    try:
        code, env = await raw("POST", "envs?wait=1", body={"env_vars": {"NEW": "1"}})
        assert code == 201, env
        assert (await raw("GET", "status"))[0] == 200
        code, page = await raw("GET", "envs")
        assert code == 200
        code, one = await raw("GET", f"envs/{fake_id(7)}")
        assert (code, one["spec"]["env_vars"]) == (200, {"N": "1"})
        code, _ = await raw("GET", f"envs/{env['env_id']}/log")
        assert code == 200
        code, _ = await raw("DELETE", f"envs/{env['env_id']}/holders/user")
        assert code == 200
    finally:
        cache._db.set_trace_callback(None)

    reads_of_specs = [
        s for s in statements if re.search(r"SELECT[^;]*\bspec\b[^;]*FROM envs", s, re.S)
    ]
    assert reads_of_specs, "the one env asked for is read"
    for statement in reads_of_specs:
        assert re.search(r"WHERE env_id = '[0-9a-f]{64}'", statement), statement
    assert not any(big["env_id"] in s and "spec" in s for s in statements if "SELECT" in s)
    # ... and none walks the stored rows: a row's later columns sit behind its spec's overflow
    # pages, so a full scan must use the covering index of the summaries.
    for statement in {s for s in statements if re.match(r"\s*SELECT[^;]*FROM envs\b", s, re.S)}:
        plan = " ".join(row[-1] for row in cache._db.execute("EXPLAIN QUERY PLAN " + statement))
        assert "SEARCH" in plan or "COVERING INDEX" in plan, (statement, plan)

    assert page["total"] == MANY + 2
    assert len(page["envs"]) == MANY + 2
    assert all("spec" not in e and "context" not in e for e in page["envs"])
    by_id = {e["env_id"]: e for e in page["envs"]}
    assert by_id[big["env_id"]]["fields"] == ["env_vars"]
    code, first = await raw("GET", "envs?limit=10&offset=5")
    assert (code, len(first["envs"]), first["total"]) == (200, 10, MANY + 2)
    assert [e["env_id"] for e in first["envs"]] == [e["env_id"] for e in page["envs"][5:15]]
    for bad in ("limit=-1", "limit=x", "limit=1e3", "offset=%00", "limit=99999999"):
        code, error = await raw("GET", f"envs?{bad}")
        assert code == 400, (bad, error)
    await alive()
