"""A cache the server cannot open (full disk, read-only): a clear log line, 503 with the
message from every route that needs the agent, and a server that stays up."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fulldisk import full_disk
from tornado.httpclient import HTTPClientError

from tests.server.jupyter_fixtures import API


@pytest.fixture
def disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A filled tmpfs when we may mount one, else a read-only directory (see fulldisk)."""
    with full_disk(tmp_path_factory.mktemp("fulldisk")) as found:
        yield found


@pytest.fixture
def extension_config(disk: tuple[Path, str]) -> dict[str, Any]:
    return {"cache_dir": str(disk[0] / "cache")}


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", ("envs",), None),
        ("POST", ("envs",), json.dumps({"env_vars": {"A": "1"}})),
        ("GET", ("envs", "a" * 64), None),
        ("GET", ("envs", "a" * 64, "log"), None),
        ("POST", ("gc",), b""),
    ],
)
async def test_routes_answer_503_naming_the_cache(
    jp_fetch: Any,
    disk: tuple[Path, str],
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: tuple[str, ...],
    body: Any,
) -> None:
    cache = disk[0] / "cache"
    with caplog.at_level(logging.ERROR), pytest.raises(HTTPClientError) as info:
        await jp_fetch(*API, *path, method=method, body=body)
    assert info.value.code == 503
    assert info.value.response is not None
    payload = json.loads(info.value.response.body)
    assert payload["type"] == "CacheUnavailable"
    assert payload["path"] == str(cache)
    assert payload["message"].startswith(f"cannot use the cache at {cache}: ")
    assert f"jupyter_runtimeenv: cannot use the cache at {cache}" in caplog.text
    # The server is alive and says the agent is not started.
    status = json.loads((await jp_fetch(*API, "status")).body)
    assert status["started"] is False
