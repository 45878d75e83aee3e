"""Agent benchmarks against floors measured in the same run.

    .venv/bin/python benchmarks/bench_agent.py [--reps N]

Rows:
- a request for an env that is READY in this agent (the hot path of every task submission
  through the embedded client), in the agent's own loop and through ``EmbeddedClient``
  from another thread;
- the first request for an env_vars-only env (parse, build, record in the index);
- 50 concurrent requests for one new env (single flight: one build);
- an agent restart finding a built env in the index.
Floors: one ``asyncio.to_thread`` round trip and one SQLite insert-and-commit in the same
process (the agent moves every index access off its loop, so these bound it from below).
"""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from jupyter_runtimeenv.agent import RuntimeEnvAgent
from jupyter_runtimeenv.client import EmbeddedClient

REPS = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 200


async def median_ms(func: Callable[[], Awaitable[Any]], reps: int = REPS) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        await func()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def sqlite_floor(root: Path) -> float:
    db = sqlite3.connect(root / "floor.sqlite", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT)")
    times = []
    for i in range(REPS):
        start = time.perf_counter()
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", (str(i), "x"))
        db.execute("COMMIT")
        times.append(time.perf_counter() - start)
    db.close()
    return statistics.median(times) * 1000


async def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="jre-bench-agent-"))
    rows: list[tuple[str, float, str]] = []
    to_thread = await median_ms(lambda: asyncio.to_thread(lambda: None))
    sqlite_ms = await asyncio.to_thread(sqlite_floor, root)

    async with RuntimeEnvAgent(root / "cache") as agent:
        spec = agent.parse({"env_vars": {"A": "1"}})
        await agent.get_or_create(spec, "warm")
        rows.append(
            (
                "READY env, request in the agent's loop",
                await median_ms(lambda: agent.get_or_create(spec, "h")),
                "to_thread",
            )
        )

        async def first() -> None:
            fresh = agent.parse({"env_vars": {"A": uuid.uuid4().hex}})
            await agent.get_or_create(fresh, "h")

        rows.append(
            ("new env_vars-only env, first request", await median_ms(first, 50), "to_thread")
        )

        async def fifty() -> None:
            fresh = agent.parse({"env_vars": {"A": uuid.uuid4().hex}})
            await asyncio.gather(*(agent.get_or_create(fresh, f"h{i}") for i in range(50)))

        rows.append(
            ("50 concurrent requests, one new env", await median_ms(fifty, 20), "to_thread")
        )

    async def restart() -> None:
        async with RuntimeEnvAgent(root / "cache") as again:
            await again.get_or_create(again.parse({"env_vars": {"A": "1"}}), "h")

    rows.append(("agent start + READY env from the index", await median_ms(restart, 20), "sqlite"))

    client = EmbeddedClient(RuntimeEnvAgent(root / "cache"))
    try:
        client.acquire_sync({"env_vars": {"A": "1"}}, "warm")
        times = []
        for _ in range(REPS):
            start = time.perf_counter()
            client.acquire_sync({"env_vars": {"A": "1"}}, "h")
            times.append(time.perf_counter() - start)
        rows.append(
            (
                "READY env via EmbeddedClient.acquire_sync",
                statistics.median(times) * 1000,
                "to_thread",
            )
        )
    finally:
        client.close()

    floors = {"to_thread": to_thread, "sqlite": sqlite_ms}
    print(f"agent benchmark (medians; {REPS} reps where not said otherwise), cache {root}")
    print(f"{'measure':<46}{'ms':>10}{'ratio':>10}  floor")
    print(f"{'floor: asyncio.to_thread round trip':<46}{to_thread:>10.3f}{1:>9.2f}x")
    print(f"{'floor: sqlite insert + commit (WAL)':<46}{sqlite_ms:>10.3f}{1:>9.2f}x")
    for name, ms, floor in rows:
        print(f"{name:<46}{ms:>10.3f}{ms / floors[floor]:>9.1f}x  {floor}")


if __name__ == "__main__":
    asyncio.run(main())
