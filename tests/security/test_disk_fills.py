"""Threat: the disk fills while the server runs, and requests answer 500.

The cache could be opened, then the disk filled: ``POST envs`` answered 500 (SQLite's
``OperationalError: database or disk is full`` while adding the reference), where a cache
that cannot be used is documented as a 503 naming the cache; and a COMMIT that failed left
the index's transaction open, so nothing worked again once there was room.

Rule under test (``Cache``: every method's disk failures are ``CacheUnavailable``; the
handlers answer it with 503 on every route; a failed COMMIT is rolled back). A real server
(pytest-jupyter) whose cache is on a real tmpfs that the test fills until ENOSPC.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fulldisk import filling_disk

from tests.security.conftest import Raw


@pytest.fixture
def disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Callable[[], None]]]:
    with filling_disk(tmp_path_factory.mktemp("filling")) as found:
        yield found


@pytest.fixture
def extension_config(disk: tuple[Path, Callable[[], None]]) -> dict[str, Any]:
    return {"cache_dir": str(disk[0] / "cache")}


async def test_a_disk_that_fills_while_the_server_runs_answers_503_then_recovers(
    raw: Raw, disk: tuple[Path, Callable[[], None]]
) -> None:
    mount, fill = disk
    code, env = await raw("POST", "envs?wait=1", body={"env_vars": {"BEFORE": "1"}})
    assert code == 201, env
    fill()
    for i in range(3):
        code, body = await raw("POST", "envs?wait=1", body={"env_vars": {"FULL": str(i)}})
        assert code == 503, body
        assert body["type"] == "CacheUnavailable", body
        assert body["path"] == str(mount / "cache"), body
        assert "No space left" in body["cause"] or "full" in body["cause"], body
    code, body = await raw("GET", "status")
    assert code == 200, body
    (mount / "filler").unlink()  # room again: the index works without a restart
    code, env = await raw("POST", "envs?wait=1", body={"env_vars": {"AFTER": "1"}})
    assert code == 201, env
    assert env["state"] == "READY", env
