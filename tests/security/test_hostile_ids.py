"""Hostile env ids and holder names on every route that takes one, against the real server.

Threat: a crafted id that becomes a path (``GET envs/..%2F..%2Fsecret/log`` used to return any
``*.log`` the server could read), or that the server cannot handle (a NUL byte, 5,000
characters: 500s). Every id is checked against the env-id alphabet (lowercase hex: a whole id
or an unambiguous prefix) before anything is looked up; anything else is a JSON 404.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.spec import parse
from tests.security.conftest import Raw

ROUTES = [
    ("GET", "envs/{id}"),
    ("DELETE", "envs/{id}"),
    ("GET", "envs/{id}/log"),
    ("DELETE", "envs/{id}/holders/someone"),
]

HOSTILE_IDS = [
    "%00",
    "ab%00cd",
    "0" * 63 + "%00",
    "..%2F..%2F..%2F..%2F..%2Fetc%2Fpasswd",
    "..%2F..%2Fsecret",  # from logs/ to the directory above the cache: a real secret.log
    "%2e%2e%2f%2e%2e%2fsecret",
    "..",
    "...",
    "x" * 5000,
    "0" * 5000,
    "g" * 64,
    "A" * 64,  # hex, but not the alphabet (env ids are lowercase)
    "0" * 63 + "%0A",
    "%FF%FE",
    "%20",
    "-1",
    "0x" + "0" * 62,
]


@pytest.fixture
def secret(tmp_path: Path) -> str:
    """A ``.log`` file next to the cache root (the server's is ``tmp_path/runtimeenv-cache``)."""
    text = "SECRET-LOG-CONTENT"
    (tmp_path / "secret.log").write_text(text)
    return text


@pytest.mark.parametrize(("method", "route"), ROUTES)
@pytest.mark.parametrize("env_id", HOSTILE_IDS)
async def test_hostile_ids_are_404_on_every_route(
    raw: Raw,
    alive: Callable[[], Awaitable[None]],
    secret: str,
    method: str,
    route: str,
    env_id: str,
) -> None:
    code, body = await raw(method, route.format(id=env_id))
    assert code == 404, body
    assert isinstance(body, dict), body  # JSON, not a page or a file
    assert secret not in str(body)
    await alive()


async def make_envs(raw: Raw, count: int) -> list[str]:
    ids = []
    for i in range(count):
        code, env = await raw("POST", "envs?wait=1", body={"env_vars": {"N": str(i)}})
        assert code == 201, env
        ids.append(env["env_id"])
    return ids


def two_sharing_a_first_digit() -> list[dict[str, Any]]:
    """Two specs whose env ids start with the same hex digit (found by parsing, locally)."""
    first: dict[str, dict[str, Any]] = {}
    for i in range(100):
        data = {"env_vars": {"N": str(i)}}
        digit = parse(data).env_id[0]
        if digit in first:
            return [first[digit], data]
        first[digit] = data
    raise AssertionError("unreachable: 17 ids share a first digit")


@pytest.mark.parametrize(("method", "route"), ROUTES)
async def test_an_ambiguous_prefix_is_404_and_a_unique_one_works(
    raw: Raw, alive: Callable[[], Awaitable[None]], method: str, route: str
) -> None:
    ids = []
    for data in two_sharing_a_first_digit():
        code, env = await raw("POST", "envs?wait=1&holder=someone", body=data)
        assert code == 201, env
        ids.append(env["env_id"])
    common = ids[0][0]
    code, body = await raw(method, route.format(id=common))
    assert code == 404, body
    assert "ambiguous" in body["message"]
    unique = ids[0][: next(i for i in range(64) if ids[0][i] != ids[1][i]) + 1]
    code, body = await raw(method, route.format(id=unique) + "?force=1")
    assert code == 200, body
    if method == "GET" and not route.endswith("log"):
        assert body["env_id"] == ids[0]
    await alive()


@pytest.mark.parametrize(
    "holder", ["%00", "..%2F..%2Fx", "a%0A", "x" * 600, "%20", "%FF", "a%20b", "-x", "..", "."]
)
async def test_hostile_holder_names_in_the_path_are_404(
    raw: Raw, alive: Callable[[], Awaitable[None]], holder: str
) -> None:
    (env_id,) = await make_envs(raw, 1)
    code, body = await raw("DELETE", f"envs/{env_id}/holders/{holder}")
    assert code == 404, body
    assert isinstance(body, dict)
    code, env = await raw("GET", f"envs/{env_id}")
    assert code == 200
    assert env["holders"] == ["user"]  # nothing was released
    code, body = await raw("DELETE", f"envs/{env_id}/holders/user")
    assert (code, body["released"]) == (200, True)
    await alive()
