"""Archives: safe unzipping (zip-slip, symlink escapes) and http downloads from 127.0.0.1."""

from __future__ import annotations

import asyncio
import http.server
import io
import stat
import threading
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.errors import BuildError
from jupyter_runtimeenv.plugins._unpack import safe_unzip

Agent = Callable[..., Any]


def zip_bytes(members: list[tuple[str, str, bool]]) -> bytes:
    """A zip of (name, content, is_symlink) members."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, content, is_link in members:
            info = zipfile.ZipInfo(name)
            if is_link:
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, content)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("members", "words"),
    [
        ([("/etc/evil", "x", False)], "absolute paths"),
        ([("../evil", "x", False)], "'..'"),
        ([("ok/../../evil", "x", False)], "'..'"),
        ([("link", "/etc", True)], "outside the archive's root"),
        ([("link", "../../outside", True)], "outside the archive's root"),
        ([("C:/windows/evil", "x", False)], "absolute paths"),
    ],
)
def test_escapes_are_refused(tmp_path: Path, members: list[Any], words: str) -> None:
    archive = tmp_path / "bad.zip"
    archive.write_bytes(zip_bytes(members))
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(BuildError) as info:
        safe_unzip(archive, dest)
    assert words in str(info.value)
    assert not (tmp_path / "evil").exists()
    assert not (tmp_path / "outside").exists()


def test_links_inside_the_root_are_kept(tmp_path: Path) -> None:
    archive = tmp_path / "ok.zip"
    archive.write_bytes(
        zip_bytes([("pkg/real.txt", "content", False), ("pkg/alias.txt", "real.txt", True)])
    )
    dest = tmp_path / "out"
    dest.mkdir()
    safe_unzip(archive, dest)
    assert (dest / "pkg" / "alias.txt").is_symlink()
    assert (dest / "pkg" / "alias.txt").read_text() == "content"


def test_not_a_zip_is_a_clear_error(tmp_path: Path) -> None:
    archive = tmp_path / "fake.zip"
    archive.write_text("not a zip")
    with pytest.raises(BuildError, match="not a readable zip"):
        safe_unzip(archive, tmp_path)


class _Server:
    """Serves ``routes[path]``: a list of (status, body) used in turn, the last one kept."""

    def __init__(self) -> None:
        self.routes: dict[str, list[tuple[int, bytes]]] = {}
        self.hits: dict[str, int] = {}
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.hits[self.path] = server.hits.get(self.path, 0) + 1
                responses = server.routes.get(self.path, [(404, b"")])
                status, body = responses.pop(0) if len(responses) > 1 else responses[0]
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.close()


async def test_download_is_retried_after_a_server_error(
    make_agent: Agent, run_in: Callable[..., Any], server: _Server
) -> None:
    body = zip_bytes([("proj/hello.py", "WHO = 'served'\n", False)])
    server.routes["/proj.zip"] = [(500, b"try again"), (200, body)]
    agent = await make_agent()
    ctx = await agent.get_or_create({"working_dir": f"{server.url}/proj.zip"}, "t")
    assert server.hits["/proj.zip"] == 2
    assert run_in(ctx, "import hello; print(json.dumps(hello.WHO))") == "served"
    log = await agent.log(ctx.env_id)
    assert "HTTP 500" in log
    assert "retrying" in log


async def test_404_is_a_clear_error_and_not_retried(
    make_agent: Agent, server: _Server, cache_dir: Path
) -> None:
    agent = await make_agent()
    url = f"{server.url}/missing.zip"
    with pytest.raises(BuildError) as info:
        await agent.get_or_create({"working_dir": url}, "t")
    assert f"cannot download {url}: HTTP 404" in info.value.message
    assert server.hits["/missing.zip"] == 1
    assert await asyncio.to_thread(lambda: list((cache_dir / "tmp").iterdir())) == []


async def test_a_server_that_never_recovers_fails_after_the_retries(
    make_agent: Agent, server: _Server
) -> None:
    server.routes["/down.zip"] = [(503, b"")]
    agent = await make_agent()
    with pytest.raises(BuildError, match=r"HTTP 503.*tried 3 times"):
        await agent.get_or_create({"working_dir": f"{server.url}/down.zip"}, "t")
    assert server.hits["/down.zip"] == 3
