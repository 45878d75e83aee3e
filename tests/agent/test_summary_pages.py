"""Pages of the env listing (``RuntimeEnvAgent.summaries``): read from SQLite page by page
(issue 19 item 6: ``GET envs`` grew with the stored envs), equal to the whole listing.

Envs stored by an earlier agent (on disk only) and envs this agent holds in memory (some of
them stored too) are mixed; every page, concatenated, is the full listing in its order, and
the total counts each env once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


async def test_pages_make_the_whole_listing(make_agent: Callable[..., Any]) -> None:
    earlier = await make_agent()
    for i in range(12):
        await earlier.get_or_create({"env_vars": {"PAGE": f"old{i}"}}, "h")
    await earlier.stop()

    agent = await make_agent()
    for i in range(5):  # in memory and stored
        await agent.get_or_create({"env_vars": {"PAGE": f"new{i}"}}, "h")
    # One stored env this agent also holds in memory now (a record of its own).
    old = (await agent.summaries())[0][3]["env_id"]
    await agent.get_or_create((await agent.env_status(old))["spec"], "again")

    whole, total = await agent.summaries()
    assert total == len(whole) == 17
    assert len({e["env_id"] for e in whole}) == 17
    for size in (1, 4, 5, 17, 40):
        pages: list[dict[str, Any]] = []
        for offset in range(0, 20, size):
            page, count = await agent.summaries(limit=size, offset=offset)
            assert count == 17, (size, offset)
            pages += page
        assert [e["env_id"] for e in pages] == [e["env_id"] for e in whole], size
        assert [e["holders"] for e in pages] == [e["holders"] for e in whole], size
    held = {e["env_id"]: e["holders"] for e in whole}
    assert held[old] == ["again"]  # (an agent that stops drops what it held)
