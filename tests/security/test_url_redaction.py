"""Threat: URL secrets in logs, step events and errors; environment variables that can never
start a process.

fsspec URIs were shown redacted, but an http(s) URL's query (a presigned signature, a token)
and password appeared in the build log, the step names and labels of events and REST
answers, and error messages. A 200 KB variable was accepted, and then every worker start
failed with E2BIG.

Rules under test (``jupyter_runtimeenv/redact.py``, ``errors``, ``agent/build.py``,
``plugins/env_vars.py``): every URL in every log line, step, label, error message and output
tail is shown without user info, query or fragment; a variable over 128 KiB (``NAME=value``)
or variables over 1 MiB in all are refused at parse, naming the field. A real agent, a real
HTTP server on 127.0.0.1, a real uv install that fails.
"""

from __future__ import annotations

import asyncio
import http.server
import io
import json
import threading
import zipfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.agent import Event, RuntimeEnvAgent
from jupyter_runtimeenv.errors import BuildError, SpecError
from jupyter_runtimeenv.spec import parse

MakeAgent = Callable[..., Any]
SECRETS = ("S3CRET-SIG", "S3CRET-PASS", "S3CRET-TOKEN", "S3CRET-FRAG")


def _zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("hello.py", "WHO = 'served'\n")
    return buf.getvalue()


@pytest.fixture
def served() -> Iterator[str]:
    body = _zip()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = 200 if self.path.startswith("/app.zip") else 404
            self.send_response(status)
            self.send_header("Content-Length", str(len(body) if status == 200 else 0))
            self.end_headers()
            if status == 200:
                self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


async def _everything_shown(agent: RuntimeEnvAgent, env_id: str, events: list[Event]) -> str:
    """Everything a user or a client can see of a build, as one text: its log, its status
    (steps, labels, error) and its events. Not the spec, which is what was asked for and
    keeps the URL whole (as it keeps env_vars values), in the owner-only index."""
    status = await agent.env_status(env_id)
    status.pop("spec", None)
    shown = [await agent.log(env_id), json.dumps(status)]
    shown += [json.dumps(e.to_json()) for e in events]
    return "\n".join(shown)


async def _collect(agent: RuntimeEnvAgent, events: list[Event]) -> None:
    stream: AsyncIterator[Event] = agent.subscribe()
    async for event in stream:
        events.append(event)


async def test_a_downloaded_urls_query_is_never_shown(make_agent: MakeAgent, served: str) -> None:
    agent = await make_agent()
    events: list[Event] = []
    collector = asyncio.create_task(_collect(agent, events))
    url = f"{served}/app.zip?X-Amz-Signature=S3CRET-SIG&token=S3CRET-TOKEN#S3CRET-FRAG"
    spec = await agent.parse_async({"working_dir": url})
    ctx = await agent.get_or_create(spec, "t")
    assert Path(ctx.cwd, "hello.py").is_file()
    text = await _everything_shown(agent, spec.env_id, events)
    assert f"{served}/app.zip" in text  # what stays: enough to tell which URL it was
    assert not [s for s in SECRETS if s in text], text
    assert not [s for s in SECRETS if s in json.dumps(await agent.gc(0))]
    collector.cancel()


@pytest.mark.parametrize(
    "where", ["missing", "password"], ids=["404 with a query", "password in the URL"]
)
async def test_a_failed_downloads_error_shows_no_secret(
    make_agent: MakeAgent, served: str, where: str, closed_port: int
) -> None:
    agent = await make_agent()
    events: list[Event] = []
    collector = asyncio.create_task(_collect(agent, events))
    if where == "missing":
        url = f"{served}/missing.zip?token=S3CRET-TOKEN"
    else:
        url = f"http://user:S3CRET-PASS@127.0.0.1:{closed_port}/app.zip?sig=S3CRET-SIG"
    spec = await agent.parse_async({"working_dir": url})
    with pytest.raises(BuildError) as info:
        await agent.get_or_create(spec, "t")
    text = str(info.value) + await _everything_shown(agent, spec.env_id, events)
    assert not [s for s in SECRETS if s in text], text
    collector.cancel()


async def test_an_installers_output_and_error_show_no_secret(
    make_agent: MakeAgent, closed_port: int
) -> None:
    agent = await make_agent()
    port = closed_port
    requirement = (
        f"six @ http://user:S3CRET-PASS@127.0.0.1:{port}/six-1.0-py3-none-any.whl"
        "?token=S3CRET-TOKEN"
    )
    spec = await agent.parse_async({"pip": [requirement]})
    with pytest.raises(BuildError) as info:
        await agent.get_or_create(spec, "t")
    text = str(info.value) + await _everything_shown(agent, spec.env_id, [])
    assert f"127.0.0.1:{port}" in text  # the installer's error is there, redacted
    assert not [s for s in SECRETS if s in text], text


def test_a_spec_errors_url_shows_no_secret() -> None:
    with pytest.raises(SpecError) as info:
        parse({"pip": ["not a requirement https://user:S3CRET-PASS@host/x?token=S3CRET-TOKEN"]})
    assert "https://host/x" in str(info.value)
    assert not [s for s in SECRETS if s in str(info.value)]


def test_environment_variables_a_process_cannot_take_are_refused_at_parse() -> None:
    with pytest.raises(SpecError) as info:
        parse({"env_vars": {"BIG": "x" * 200_000}})
    assert info.value.field == "env_vars.BIG"
    assert "E2BIG" in str(info.value)
    with pytest.raises(SpecError) as info:
        parse({"env_vars": {f"V{i}": "x" * 120_000 for i in range(9)}})
    assert info.value.field == "env_vars"
    assert "in all" in str(info.value)
    with pytest.raises(SpecError) as info:
        parse({"env_vars": {"N" * 2000: "1"}})
    assert len(info.value.field) < 120
    parse({"env_vars": {"OK": "x" * 100_000}})  # big, but a process can start with it
