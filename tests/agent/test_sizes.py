"""A resource's size is measured after its build, not on its way to READY (``agent/sizes.py``).

A plugin that does not know what it made (the pip plugin: a venv of thousands of files) commits
its resource unmeasured; every listing of the cache measures what is unmeasured first, and the
agent measures it in its own thread after the build, then asks whether the cache is over its
cap. These tests read the index's rows directly to see what was stored when.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fakes import CountingPlugin

from jupyter_runtimeenv.agent import RuntimeEnvAgent
from jupyter_runtimeenv.agent.cache import Cache
from jupyter_runtimeenv.agent.cache_resources import UNMEASURED, dir_size
from jupyter_runtimeenv.plugins import PluginRegistry
from jupyter_runtimeenv.plugins.base import BuildContext

MakeAgent = Callable[..., Any]


class UnsizedPlugin(CountingPlugin):
    """``CountingPlugin``'s resources, their size not told (as the pip plugin's)."""

    async def create(self, uri: str, value: Any, build: BuildContext) -> int:
        await super().create(uri, value, build)
        return 0


def stored_sizes(root: Path) -> dict[str, int]:
    """The ``size`` column as the index holds it now (no listing, which would measure)."""
    with sqlite3.connect(root / "index.sqlite") as db:
        return dict(db.execute("SELECT uri, size FROM resources").fetchall())


def built_tree(cache: Cache, files: int = 30) -> Path:
    tmp = cache.new_tmp()
    for i in range(files):
        (tmp / f"d{i % 3}").mkdir(exist_ok=True)
        (tmp / f"d{i % 3}" / f"f{i}").write_bytes(b"x" * (100 + i))
    os.link(tmp / "d0" / "f0", tmp / "again")  # a hard link counts once
    return tmp


def test_a_resource_of_unknown_size_is_committed_unmeasured_and_every_listing_measures_it(
    cache_dir: Path,
) -> None:
    cache = Cache(cache_dir)
    try:
        for uri in ("t://listed", "t://summed", "t://evictable", "t://looked-up"):
            cache.commit("t", uri, built_tree(cache), 0)
        assert set(stored_sizes(cache_dir).values()) == {UNMEASURED}
        want = dir_size(cache.resource_path("t", "t://listed"))
        assert want == sum(100 + i for i in range(30))

        assert {r["size"] for r in cache.resources()} == {want}
        assert stored_sizes(cache_dir) == dict.fromkeys(stored_sizes(cache_dir), want)

        cache.commit("t", "t://later", built_tree(cache), 0)
        assert cache.total_bytes() == 5 * want
        cache.commit("t", "t://later-still", built_tree(cache), 0)
        assert {e.size for e in cache.eviction_candidates(0)} == {want}
        cache.commit("t", "t://last", built_tree(cache), 0)
        row = cache.resource("t://listed")
        assert row is not None
        assert row["size"] == want
        assert UNMEASURED not in stored_sizes(cache_dir).values()
        cache.commit("t", "t://told", built_tree(cache), 12345)  # a plugin that knows
        assert stored_sizes(cache_dir)["t://told"] == 12345
    finally:
        cache.close()


def test_measuring_stops_when_asked_and_leaves_the_rest_unmeasured(cache_dir: Path) -> None:
    cache = Cache(cache_dir)
    try:
        cache.commit("t", "t://a", built_tree(cache), 0)
        stop = threading.Event()
        stop.set()
        assert cache.measure_pending(stop) is False
        assert stored_sizes(cache_dir) == {"t://a": UNMEASURED}
        assert cache.measure_pending() is True
        assert stored_sizes(cache_dir)["t://a"] > 0
    finally:
        cache.close()


async def test_the_agent_measures_a_new_resource_after_its_build(make_agent: MakeAgent) -> None:
    agent: RuntimeEnvAgent = await make_agent(registry=PluginRegistry([UnsizedPlugin()]))
    spec = agent.parse({"counting": {"name": "new", "bytes": 700}})
    await agent.get_or_create(spec, "h")
    for _ in range(200):  # the measuring thread, after the build
        if stored_sizes(agent.cache.root).get("counting://new", UNMEASURED) != UNMEASURED:
            break
        await asyncio.sleep(0.02)
    assert stored_sizes(agent.cache.root) == {"counting://new": 700}


async def test_a_cache_over_its_cap_by_unmeasured_resources_evicts_after_a_build(
    make_agent: MakeAgent,
) -> None:
    agent: RuntimeEnvAgent = await make_agent(
        registry=PluginRegistry([UnsizedPlugin()]), max_cache_bytes=1500
    )
    for name in ("old", "new"):
        spec = agent.parse({"counting": {"name": name, "bytes": 1000}})
        await agent.get_or_create(spec, "h")
        await agent.release(spec.env_id, "h")
        await asyncio.sleep(0.01)  # distinct last-use times
    for _ in range(100):
        if list(stored_sizes(agent.cache.root)) == ["counting://new"]:
            break
        await asyncio.sleep(0.05)
    assert stored_sizes(agent.cache.root) == {"counting://new": 1000}
