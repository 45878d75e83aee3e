"""The threat model, tested: what a hostile request can (not) do to a real Jupyter server.

Every test here talks to a real server (pytest-jupyter, the fixtures of ``tests/server``) as
an authorized but hostile client would, then checks that the server still answers and that
nothing was imported that should not have been (the modules in ``hostile/`` leave a marker
file when imported).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.security.hostile import MARKER_VAR, PACKAGE
from tests.server.jupyter_fixtures import *  # noqa: F403
from tests.server.jupyter_fixtures import API


@pytest.fixture
def markers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The directory where hostile modules leave a marker when imported; none of them is
    imported before the test (so an import during it would run their bodies again)."""
    where = tmp_path / "markers"
    where.mkdir()
    monkeypatch.setenv(MARKER_VAR, str(where))
    for name in [m for m in sys.modules if m.startswith(PACKAGE + ".")]:
        del sys.modules[name]
    yield where
    for name in [m for m in sys.modules if m.startswith(PACKAGE + ".")]:
        del sys.modules[name]


Raw = Callable[..., Awaitable[tuple[int, Any]]]


@pytest.fixture
def raw(http_server_client: Any, jp_auth_header: dict[str, str], jp_base_url: str) -> Raw:
    """``await raw(method, path_after_api, body=...)`` -> (status, JSON or text): the path is
    sent exactly as given (``%2F`` and ``%00`` stay escaped), and errors are returned."""

    async def fetch(method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        if method == "POST" and body is None and "body_producer" not in kwargs:
            body = b""
        headers = {**jp_auth_header, **kwargs.pop("headers", {})}
        response = await http_server_client.fetch(
            f"{jp_base_url}{'/'.join(API)}/{path}",
            method=method,
            body=body,
            headers=headers,
            raise_error=False,
            request_timeout=60,
            **kwargs,
        )
        text = response.body.decode("utf-8", errors="replace") if response.body else ""
        if response.headers.get("Content-Type", "").startswith("application/json"):
            return response.code, json.loads(text, parse_constant=_not_json)
        return response.code, text

    return fetch


def _not_json(name: str) -> Any:
    raise AssertionError(f"the server answered with {name}, which is not JSON")


@pytest.fixture
def alive(raw: Raw) -> Callable[[], Awaitable[None]]:
    """``await alive()``: the server still answers, and its agent is up."""

    async def check() -> None:
        code, body = await raw("GET", "envs?limit=1")
        assert code == 200, body
        code, body = await raw("GET", "status")
        assert code == 200, body
        assert body["started"] is True

    return check
