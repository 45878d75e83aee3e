"""Hostile bodies against the real server: each is a 4xx naming what is wrong, never a 500,
never an import, and the server answers the next request.

Threats: a body that exhausts the JSON decoder's recursion, numbers that are not JSON
(``NaN``, ``Infinity``, ``1e400``), bodies past the size limit (announced or streamed),
values of the wrong type (``true`` where a count is expected), names with a trailing newline,
and plugin paths that import code (one that calls ``sys.exit``, one that prints, one whose
class cannot be constructed, ``this``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.security.conftest import Raw
from tests.security.hostile import PACKAGE
from tests.server.plugins import SCRIPT, script

LIMIT = 64 * 1024


@pytest.fixture
def extension_config() -> dict[str, Any]:
    return {"max_spec_bytes": LIMIT}


def nested(depth: int, opening: str = "[", closing: str = "]", inner: str = "1") -> str:
    return opening * depth + inner + closing * depth


def plugin(path: str) -> dict[str, Any]:
    return {"plugins": {path: {}}}


# (case, body, status, field the error names; None: not checked)
SPEC_BODIES: list[tuple[str, Any, int, str | None]] = [
    ("not JSON", "{not json", 400, ""),
    ("a JSON array", "[1, 2]", 400, ""),
    ("a JSON string", '"spec"', 400, ""),
    ("invalid UTF-8", b'{"env_vars": {"A": "\xff"}}', 400, ""),
    ("arrays 20,000 deep", '{"pip": ' + nested(20_000) + "}", 400, ""),
    ("objects 10,000 deep", '{"env_vars": ' + nested(10_000, '{"a":', "}") + "}", 400, ""),
    ("lists 40 deep", {"env_vars": {"A": "1"}, **script("d", x=json.loads(nested(40)))}, 400, None),
    ("NaN", '{"config": {"setup_timeout_seconds": NaN}}', 400, ""),
    ("Infinity", '{"config": {"setup_timeout_seconds": Infinity}}', 400, ""),
    ("-Infinity", '{"config": {"setup_timeout_seconds": -Infinity}}', 400, ""),
    ("1e400", '{"config": {"setup_timeout_seconds": 1e400}}', 400, ""),
    ("1e400 in a plugin's config", '{"plugins": {"' + SCRIPT + '": {"sleep": 1e400}}}', 400, ""),
    (
        "an integer of 5,000 digits",
        '{"config": {"setup_timeout_seconds": ' + "9" * 5000 + "}}",
        400,
        "",
    ),
    (
        "true as a timeout",
        {"config": {"setup_timeout_seconds": True}},
        400,
        "config.setup_timeout_seconds",
    ),
    ("a string as a flag", {"config": {"eager_install": "yes"}}, 400, "config.eager_install"),
    ("env_vars as a list", {"env_vars": ["A=1"]}, 400, "env_vars"),
    ("a value that is not a string", {"env_vars": {"A": 1}}, 400, "env_vars.A"),
    ("a name ending in a newline", {"env_vars": {"A\n": "1"}}, 400, "env_vars.A\n"),
    ("a name with '='", {"env_vars": {"A=B": "1"}}, 400, "env_vars.A=B"),
    ("a NUL in a value", {"env_vars": {"A": "x\x00y"}}, 400, "env_vars.A"),
    ("a NUL in a path", {"working_dir": "/tmp/a\x00b"}, 400, "working_dir"),
    ("pip as a number", {"pip": 3}, 400, "pip"),
    ("plugins as a list", {"plugins": ["a.b.C"]}, 400, "plugins"),
    (
        "a plugin's config of the wrong type",
        script("x", lines=True),
        400,
        f"plugins.{SCRIPT}.lines",
    ),
    ("an unknown field", {"no_such_field": 1}, 400, "no_such_field"),
    ("a conda name ending in a newline", {"conda": "base\n"}, 400, "conda"),
    (
        "a setup hook path ending in a newline",
        {"worker_process_setup_hook": "pkg.hook\n"},
        400,
        "worker_process_setup_hook",
    ),
]

PLUGIN_PATHS = [
    f"{PACKAGE}.exits_on_import.Plugin",
    f"{PACKAGE}.interrupts_on_import.Plugin",
    f"{PACKAGE}.prints_on_import.Plugin",
    f"{PACKAGE}.needs_args.NeedsArgs",
    f"{PACKAGE}.friendly.Friendly",  # harmless, but not allowed by the operator
    "this",
    "this.Plugin",
    "os.system",
    "antigravity.Plugin",
    "../../etc/passwd.Plugin",
    "tests.server.plugins ScriptPlugin",
    "",
]


async def post(raw: Raw, body: Any, **kwargs: Any) -> tuple[int, Any]:
    return await raw("POST", "envs", body=body, **kwargs)


async def nothing_happened(raw: Raw, alive: Callable[[], Awaitable[None]], markers: Path) -> None:
    await alive()
    assert sorted(p.name for p in markers.iterdir()) == [], "a hostile module was imported"
    code, envs = await raw("GET", "envs")
    assert code == 200
    assert envs["total"] == 0, "a refused spec left an environment behind"


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [pytest.param(b, s, f, id=case) for case, b, s, f in SPEC_BODIES],
)
async def test_hostile_spec_bodies_are_refused(
    raw: Raw,
    alive: Callable[[], Awaitable[None]],
    markers: Path,
    body: Any,
    status: int,
    field: str | None,
) -> None:
    code, error = await post(raw, body)
    assert code == status, error
    assert error["type"] in ("SpecError", "PluginNotFound"), error
    if field is not None:
        assert error["field"] == field, error
    await nothing_happened(raw, alive, markers)


@pytest.mark.parametrize("path", PLUGIN_PATHS)
async def test_plugins_by_import_path_are_refused_before_any_import(
    raw: Raw,
    alive: Callable[[], Awaitable[None]],
    markers: Path,
    capsys: pytest.CaptureFixture[str],
    path: str,
) -> None:
    import sys

    before = set(sys.modules)
    code, error = await post(raw, plugin(path))
    assert code == 400, error
    assert error["type"] == "PluginNotFound"
    assert error["field"] == f"plugins.{path}"
    assert {
        m for m in set(sys.modules) - before if m.startswith((PACKAGE, "this", "antigravity"))
    } == set()
    assert "HOSTILE" not in capsys.readouterr().out
    await nothing_happened(raw, alive, markers)


async def test_an_allowed_plugin_next_to_a_hostile_one_is_not_imported_either(
    raw: Raw, alive: Callable[[], Awaitable[None]], markers: Path
) -> None:
    # Every path is judged before the first import: the allowed script plugin is no way in.
    body = {"plugins": {SCRIPT: {"name": "x"}, f"{PACKAGE}.exits_on_import.Plugin": {}}}
    code, error = await post(raw, body)
    assert code == 400
    assert error["field"] == f"plugins.{PACKAGE}.exits_on_import.Plugin"
    await nothing_happened(raw, alive, markers)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        pytest.param({"max_bytes": True}, 400, id="true"),
        pytest.param({"max_bytes": False}, 400, id="false"),
        pytest.param({"max_bytes": "1"}, 400, id="a string"),
        pytest.param({"max_bytes": 1.5}, 400, id="a float"),
        pytest.param({"max_bytes": -1}, 400, id="negative"),
        pytest.param({"max_bytes": []}, 400, id="a list"),
        pytest.param('{"max_bytes": NaN}', 400, id="NaN"),
        pytest.param('{"max_bytes": 1e400}', 400, id="1e400"),
        pytest.param("[]", 400, id="an array"),
        pytest.param(nested(20_000), 400, id="20,000 deep"),
        pytest.param({"max_bytes": None}, 200, id="null"),
        pytest.param("", 200, id="no body"),
    ],
)
async def test_gc_takes_only_a_non_negative_integer(
    raw: Raw, alive: Callable[[], Awaitable[None]], markers: Path, body: Any, status: int
) -> None:
    code, answer = await raw("POST", "gc", body=body)
    assert code == status, answer
    if status == 200:
        assert answer == {"evicted": [], "freed_bytes": 0}
    await nothing_happened(raw, alive, markers)


@pytest.mark.parametrize(
    "holder",
    ["..%2F..%2Fetc", "%00", "a%00b", "a%0A", "%0A", "x" * 600, "a%20b", "%FF", "-leading-dash"],
)
async def test_hostile_holder_arguments_are_400(
    raw: Raw, alive: Callable[[], Awaitable[None]], markers: Path, holder: str
) -> None:
    code, error = await raw("POST", f"envs?holder={holder}", body={"env_vars": {"A": "1"}})
    assert code == 400, error
    assert error["field"] == "holder"
    await nothing_happened(raw, alive, markers)


async def test_a_body_past_the_limit_is_413_before_it_is_read(
    raw: Raw, alive: Callable[[], Awaitable[None]], markers: Path
) -> None:
    big = {"env_vars": {"A": "x" * LIMIT}}
    code, error = await post(raw, big)
    assert code == 413, error
    assert "max_spec_bytes" in error["message"]
    code, error = await raw("POST", "gc", body=b" " * (64 * 1024 + 1))
    assert code == 413, error
    await nothing_happened(raw, alive, markers)


async def test_a_streamed_body_past_the_limit_is_413(
    raw: Raw, alive: Callable[[], Awaitable[None]], markers: Path
) -> None:
    sent = 0

    async def produce(write: Any) -> None:
        # No Content-Length (chunked): the server counts as the body arrives.
        nonlocal sent
        await write(b'{"env_vars": {"A": "')
        for _ in range(40):
            await write(b"x" * 4096)
            sent += 4096
        await write(b'"}}')

    code, error = await raw("POST", "envs", body_producer=produce)
    assert sent > LIMIT
    assert code == 413, error
    await nothing_happened(raw, alive, markers)


async def test_a_big_but_allowed_spec_is_taken(
    raw: Raw, alive: Callable[[], Awaitable[None]]
) -> None:
    body = {"env_vars": {"A": "x" * (LIMIT - 100)}}
    code, env = await post(raw, body, headers={"Content-Type": "application/json"})
    assert code == 201, env
    await alive()
