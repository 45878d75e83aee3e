"""Threat: rebuilds that lose references and answer 500.

A rebuild refused with 409 (others hold the env) had already dropped the caller's own
reference; and during a storm of rebuilds a concurrent ``POST envs?wait=true`` for the same
spec answered 500 (the env was removed between its reference and its wait: an
``EnvNotFound`` nothing mapped).

Rules under test (``RuntimeEnvAgent.rebuild``, ``EnvsHandler``): a refused rebuild changes
nothing; a POST whose env is removed under it asks again (and at worst answers 404, never a
500). A real server (pytest-jupyter) and the tests' own plugin, whose builds take a moment.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tests.security.conftest import Raw
from tests.server.plugins import script


async def test_a_refused_rebuild_keeps_the_callers_reference(
    raw: Raw, alive: Callable[[], Awaitable[None]]
) -> None:
    code, env = await raw("POST", "envs?wait=1", body=script("kept"))
    assert code == 201, env
    code, _ = await raw("POST", "envs?wait=1&holder=cli", body=script("kept"))
    assert code == 200
    code, body = await raw("POST", f"envs/{env['env_id']}/rebuild")
    assert (code, body["type"]) == (409, "EnvInUse"), body
    code, now = await raw("GET", f"envs/{env['env_id']}")
    assert now["holders"] == ["cli", "user"], now
    assert now["state"] == "READY"
    await alive()


async def test_a_storm_of_rebuilds_never_answers_500(
    raw: Raw, alive: Callable[[], Awaitable[None]]
) -> None:
    spec = script("storm", lines=2, sleep=0.05)
    code, env = await raw("POST", "envs?wait=1", body=spec)
    assert code == 201, env
    env_id = env["env_id"]

    async def rebuild() -> tuple[int, object]:
        return await raw("POST", f"envs/{env_id}/rebuild?force=true")

    async def ask() -> tuple[int, object]:
        return await raw("POST", "envs?wait=1", body=spec)

    for _ in range(3):
        answers = await asyncio.gather(*[rebuild() for _ in range(8)], *[ask() for _ in range(8)])
        rebuilds, asks = answers[:8], answers[8:]
        for code, body in rebuilds:
            assert code in (202, 404, 409), body  # busy or just removed: said, in JSON
        for code, body in asks:
            assert code in (200, 201, 404), body
            assert isinstance(body, dict)
            if code != 404:
                assert body["state"] in ("READY", "FAILED", "BUILDING", "PENDING"), body
    await alive()
