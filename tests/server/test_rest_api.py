"""The REST API of the extension, against a real Jupyter server with a non-root base URL."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from jupyter_server.auth import Authorizer
from tornado.httpclient import HTTPClientError

from tests.server.jupyter_fixtures import API
from tests.server.plugins import SCRIPT, script

ROUTES = [
    ("GET", ("status",)),
    ("GET", ("envs",)),
    ("POST", ("envs",)),
    ("GET", ("envs", "x" * 64)),
    ("DELETE", ("envs", "x" * 64)),
    ("GET", ("envs", "x" * 64, "log")),
    ("DELETE", ("envs", "x" * 64, "holders", "h")),
    ("POST", ("gc",)),
]


async def call(jp_fetch: Any, method: str, *path: str, body: Any = None, **kw: Any) -> Any:
    if body is not None and not isinstance(body, (str, bytes)):
        body = json.dumps(body)
    if method == "POST" and body is None:
        body = b""
    return await jp_fetch(*API, *path, method=method, body=body, **kw)


async def status_of(jp_fetch: Any, method: str, *path: str, **kw: Any) -> int:
    try:
        response = await call(jp_fetch, method, *path, **kw)
    except HTTPClientError as exc:
        return exc.code
    return int(response.code)


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_every_route_refuses_requests_without_token(
    jp_fetch: Any, method: str, path: tuple[str, ...]
) -> None:
    headers = {"Authorization": ""}
    assert await status_of(jp_fetch, method, *path, headers=headers) == 403
    headers = {"Authorization": "token not-the-token"}
    assert await status_of(jp_fetch, method, *path, headers=headers) == 403


class ReadOnlyAuthorizer(Authorizer):
    """Grants ``read`` only, and records what it was asked."""

    asked: list[tuple[str, str]] = []

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        self.asked.append((action, resource))
        return action == "read"


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any], request: pytest.FixtureRequest) -> Any:
    if "readonly" in request.keywords:
        jp_server_config["ServerApp"]["authorizer_class"] = ReadOnlyAuthorizer
    return jp_server_config


@pytest.mark.readonly
@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_an_authorizer_denying_write_blocks_post_and_delete(
    jp_fetch: Any, method: str, path: tuple[str, ...]
) -> None:
    ReadOnlyAuthorizer.asked.clear()
    code = await status_of(jp_fetch, method, *path)
    if method == "GET":
        assert code in (200, 404)  # allowed; the env does not exist
    else:
        assert code == 403
    action = "read" if method == "GET" else "write"
    assert ReadOnlyAuthorizer.asked == [(action, "jupyter_runtimeenv")]


async def test_post_creates_then_finds_and_waits(jp_fetch: Any, jp_base_url: str) -> None:
    spec = {"env_vars": {"A": "1"}, **script("one")}
    first = await call(jp_fetch, "POST", "envs", body=spec)
    assert first.code == 201
    env = json.loads(first.body)
    env_id = env["env_id"]
    assert env["state"] in ("PENDING", "BUILDING", "READY")
    assert first.headers["Location"] == f"{jp_base_url}jupyter-runtimeenv/api/envs/{env_id}"

    again = await call(jp_fetch, "POST", "envs", body=spec, params={"wait": "true"})
    assert again.code == 200
    ready = json.loads(again.body)
    assert ready["env_id"] == env_id
    assert ready["state"] == "READY"
    assert ready["context"]["env_vars"]["A"] == "1"
    assert "SCRIPT_ONE" in ready["context"]["env_vars"]
    assert ready["holders"] == ["user"]

    one = json.loads((await call(jp_fetch, "GET", "envs", env_id)).body)
    assert one["state"] == "READY"
    listed = json.loads((await call(jp_fetch, "GET", "envs")).body)["envs"]
    assert [e["env_id"] for e in listed] == [env_id]
    log = await call(jp_fetch, "GET", "envs", env_id, "log")
    assert log.headers["Content-Type"].startswith("text/plain")
    assert "script line 2" in log.body.decode()
    status = json.loads((await call(jp_fetch, "GET", "status")).body)
    assert status["started"] is True
    assert status["envs"] == {"READY": 1}


async def test_a_failed_build_answers_with_the_error(jp_fetch: Any) -> None:
    response = await call(
        jp_fetch, "POST", "envs", body=script("bad", fail=True), params={"wait": "true"}
    )
    assert response.code == 201
    env = json.loads(response.body)
    assert env["state"] == "FAILED"
    assert env["error"]["step"].startswith(SCRIPT)
    assert "script line 2" in env["error"]["output_tail"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("{not json", ""),
        ("[1, 2]", ""),
        ({"env_vars": {"A": 1}}, "env_vars.A"),
        ({"no_such_field": 1}, "no_such_field"),
        (script("x", lines="many"), f"plugins.{SCRIPT}.lines"),
        ({"plugins": {"no.such.Plugin": {}}}, "plugins.no.such.Plugin"),
    ],
)
async def test_bad_json_or_spec_is_400_with_the_field(jp_fetch: Any, body: Any, field: str) -> None:
    with pytest.raises(HTTPClientError) as info:
        await call(jp_fetch, "POST", "envs", body=body)
    assert info.value.code == 400
    assert info.value.response is not None
    error = json.loads(info.value.response.body)
    assert error["field"] == field
    assert error["type"] in ("SpecError", "PluginNotFound")


@pytest.fixture
def extension_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    if "no_plugins" in request.keywords:
        return {"allowed_plugins": []}
    return {}


@pytest.mark.no_plugins
async def test_allowed_plugins_refuses_other_plugins(jp_fetch: Any) -> None:
    with pytest.raises(HTTPClientError) as info:
        await call(jp_fetch, "POST", "envs", body=script("x"))
    assert info.value.code == 400
    assert info.value.response is not None
    assert json.loads(info.value.response.body)["field"] == f"plugins.{SCRIPT}"


async def test_delete_is_409_while_others_hold_it_unless_forced(jp_fetch: Any) -> None:
    spec = script("shared")
    env_id = json.loads((await call(jp_fetch, "POST", "envs", body=spec)).body)["env_id"]
    await call(jp_fetch, "POST", "envs", body=spec, params={"holder": "kernel:k1", "wait": "1"})

    assert await status_of(jp_fetch, "DELETE", "envs", env_id) == 409
    held = json.loads((await call(jp_fetch, "GET", "envs", env_id)).body)["holders"]
    assert held == ["kernel:k1"]  # the caller's own reference went

    response = await call(jp_fetch, "DELETE", "envs", env_id, params={"force": "true"})
    assert json.loads(response.body)["removed"] == ["script://shared"]
    assert await status_of(jp_fetch, "GET", "envs", env_id) == 404
    assert await status_of(jp_fetch, "DELETE", "envs", env_id) == 404
    assert await status_of(jp_fetch, "GET", "envs", "0" * 64, "log") == 404
    assert await status_of(jp_fetch, "DELETE", "envs", "0" * 64, "holders", "h") == 404


async def test_releasing_a_holder_keeps_the_env_until_gc(jp_fetch: Any) -> None:
    env = json.loads(
        (
            await call(
                jp_fetch,
                "POST",
                "envs",
                body=script("gc"),
                params={"holder": "someone", "wait": "1"},
            )
        ).body
    )
    env_id = env["env_id"]
    nothing = json.loads((await call(jp_fetch, "POST", "gc", body={"max_bytes": 0})).body)
    assert nothing["evicted"] == []  # still referenced

    response = await call(jp_fetch, "DELETE", "envs", env_id, "holders", "someone")
    assert json.loads(response.body) == {"env_id": env_id, "holder": "someone", "released": True}
    assert json.loads((await call(jp_fetch, "GET", "envs", env_id)).body)["holders"] == []

    evicted = json.loads((await call(jp_fetch, "POST", "gc", body={"max_bytes": 0})).body)
    assert [e["uri"] for e in evicted["evicted"]] == ["script://gc"]
    assert await status_of(jp_fetch, "POST", "gc", body={"max_bytes": -1}) == 400


def test_the_openapi_description_ships_and_names_every_route() -> None:
    from importlib.resources import files

    from jupyter_runtimeenv.server.cluster import cluster_handlers
    from jupyter_runtimeenv.server.handlers import default_handlers
    from jupyter_runtimeenv.server.panel import panel_handlers

    text = files("jupyter_runtimeenv.server").joinpath("openapi.yaml").read_text()
    described = set(yaml.safe_load(text)["paths"])
    routes = {
        pattern.removeprefix("/jupyter-runtimeenv/api")
        .removesuffix("/?")
        .replace("(?P<env_id>[^/]+)", "{env_id}")
        .replace("(?P<holder>[^/]+)", "{holder}")
        .replace("(?P<kernel_id>[0-9A-Za-z_-]{1,64})", "{kernel_id}")
        .replace("(?P<pid>[0-9]{1,10})", "{pid}")
        .replace("(?P<command_id>c[0-9]{1,18})", "{command_id}")
        for pattern, _ in [*default_handlers, *cluster_handlers, *panel_handlers]
    }
    assert described == routes
