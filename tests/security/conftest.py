"""The threat model, tested: what a hostile request can (not) do to a real Jupyter server.

Every test here talks to a real server (pytest-jupyter, the fixtures of ``tests/server``) as
an authorized but hostile client would, then checks that the server still answers and that
nothing was imported that should not have been (the modules in ``hostile/`` leave a marker
file when imported).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_process import JupyterProcess

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


ServerFactory = Callable[..., JupyterProcess]


@pytest.fixture
def make_server_process(tmp_path: Path, cache_dir: Path) -> Iterator[ServerFactory]:
    """``make_server_process(*args, env={...})``: a real ``jupyter server`` with the extension,
    in its own process (its root: ``tmp_path / "root"``), for threats that would freeze a
    server in the test's own process (the GIL, its event loop, its executor) or that need
    signals. The repository is on its ``PYTHONPATH`` (``tests.security.hostile`` plugins).
    Every one is stopped (SIGTERM, then SIGKILL) after the test."""
    root = tmp_path / "root"
    root.mkdir()
    servers: list[JupyterProcess] = []

    def make(*args: str, env: dict[str, str] | None = None) -> JupyterProcess:
        repo = str(Path(__file__).resolve().parents[2])
        full_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]).rstrip(":"),
            "JUPYTER_RUNTIMEENV_CACHE": str(cache_dir),
            "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
            "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
            **(env or {}),
        }
        server = JupyterProcess(
            "jupyter_server",
            root,
            tmp_path / f"server-{len(servers)}.log",
            env=full_env,
            args=[
                "--ServerApp.jpserver_extensions={'jupyter_runtimeenv': True}",
                f"--RuntimeEnvExtension.cache_dir={cache_dir}",
                *args,
            ],
        )
        servers.append(server)
        return server

    try:
        yield make
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def server_process(make_server_process: ServerFactory) -> JupyterProcess:
    """One server of ``make_server_process`` with the default settings."""
    return make_server_process()


def answers_within(server: JupyterProcess, path: str, seconds: float) -> int:
    """The HTTP status of GET ``path`` (from the server's base URL), or an ``AssertionError``
    if the server does not answer within ``seconds``."""
    request = urllib.request.Request(
        server.url + path, headers={"Authorization": f"token {server.token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=seconds) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (TimeoutError, urllib.error.URLError) as exc:
        raise AssertionError(f"GET {path}: no answer within {seconds} s ({exc})") from None


def request_within(
    server: JupyterProcess, method: str, path: str, body: Any = None, *, seconds: float
) -> tuple[int, Any]:
    """(status, decoded JSON answer) of one request to ``path`` (from the server's base URL),
    or an ``AssertionError`` if no answer comes within ``seconds``."""
    request = urllib.request.Request(
        server.url + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"token {server.token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=seconds) as response:
            return int(response.status), json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")
    except (TimeoutError, urllib.error.URLError) as exc:
        raise AssertionError(f"{method} {path}: no answer within {seconds} s ({exc})") from None
