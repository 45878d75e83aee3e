"""Threat: archive expansion without bounds.

A ~300 KB zip of zeros unpacked to 300 MB and the env turned READY (a 1 MB one to 1 GiB in
the probe); a tar.gz the same; an archive of a million empty members; an http(s) download
had no size cap.

Rules under test (``plugins/_unpack.py`` ``ArchiveLimits``, ``_fetch``/``_remote`` caps):
unpacked bytes, member count and the unpacked/archive ratio are bounded (defaults, or
``$JUPYTER_RUNTIMEENV_MAX_UNPACKED_BYTES``/``_MAX_ARCHIVE_MEMBERS``/``_MAX_ARCHIVE_RATIO``),
bytes are counted as they are written and a zip's central directory is checked before
anything is written; downloads stop at the field's ``max_bytes`` (an announced length
before the body is read). Each refusal is a one-line ``BuildError`` of the field's step,
naming the limit, and nothing of the build is left. Real agent, real plugins, real files,
a real HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import http.server
import io
import os
import tarfile
import threading
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.errors import BuildError
from jupyter_runtimeenv.plugins import PluginRegistry
from jupyter_runtimeenv.plugins.py_modules import PyModulesPlugin
from jupyter_runtimeenv.plugins.working_dir import WorkingDirPlugin

MakeAgent = Callable[..., Any]
MiB = 2**20


def zeros_zip(path: Path, size: int, name: str = "zeros.bin") -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf, zf.open(name, "w") as f:
        chunk = bytes(MiB)
        for _ in range(size // MiB):
            f.write(chunk)
    return path


def zeros_tgz(path: Path, size: int) -> Path:
    class Zeros(io.RawIOBase):
        def __init__(self) -> None:
            self.left = size

        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            n = min(len(b), self.left)
            b[:n] = bytes(n)
            self.left -= n
            return n

    with tarfile.open(path, "w:gz") as tf:
        info = tarfile.TarInfo("zeros.bin")
        info.size = size
        tf.addfile(info, io.BufferedReader(Zeros()))
    return path


def many_members_zip(path: Path, n: int) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for i in range(n):
            zf.writestr(f"f{i}.txt", "")
    return path


async def _refused(make_agent: MakeAgent, cache_dir: Path, spec: dict[str, Any]) -> BuildError:
    agent = await make_agent()
    with pytest.raises(BuildError) as info:
        await agent.get_or_create(spec, "t")
    error = info.value
    assert "\n" not in error.message, error.message
    assert await asyncio.to_thread(lambda: list((cache_dir / "tmp").iterdir())) == []
    return error


@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
async def test_a_bomb_stops_at_the_ratio(
    make_agent: MakeAgent, cache_dir: Path, tmp_path: Path, kind: str
) -> None:
    make = zeros_zip if kind == "zip" else zeros_tgz
    archive = make(tmp_path / f"bomb.{kind}", 300 * MiB)
    assert archive.stat().st_size < 2 * MiB
    error = await _refused(make_agent, cache_dir, {"working_dir": str(archive)})
    assert error.step == "working_dir"
    assert "times its own size" in error.message
    assert "JUPYTER_RUNTIMEENV_MAX_ARCHIVE_RATIO" in error.message


async def test_unpacked_bytes_and_members_are_bounded_as_configured(
    make_agent: MakeAgent, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = tmp_path / "big.zip"
    with zipfile.ZipFile(big, "w") as zf:  # stored: ratio 1
        zf.writestr("random.bin", os.urandom(3 * MiB))
    monkeypatch.setenv("JUPYTER_RUNTIMEENV_MAX_UNPACKED_BYTES", str(2 * MiB))
    error = await _refused(make_agent, cache_dir, {"working_dir": str(big)})
    assert "unpacks to more than 2.0 MiB" in error.message
    assert "JUPYTER_RUNTIMEENV_MAX_UNPACKED_BYTES" in error.message
    monkeypatch.delenv("JUPYTER_RUNTIMEENV_MAX_UNPACKED_BYTES")

    monkeypatch.setenv("JUPYTER_RUNTIMEENV_MAX_ARCHIVE_MEMBERS", "50")
    many = many_members_zip(tmp_path / "many.zip", 60)
    error = await _refused(make_agent, cache_dir, {"working_dir": str(many)})
    assert "more than 50 members" in error.message
    many_tar = tmp_path / "many.tar"
    with tarfile.open(many_tar, "w") as tf:
        for i in range(60):
            tf.addfile(tarfile.TarInfo(f"f{i}.txt"), io.BytesIO(b""))
    error = await _refused(make_agent, cache_dir, {"py_modules": [str(many_tar)]})
    assert (error.step, "more than 50 members" in error.message) == ("py_modules", True)
    # A wheel is installed by uv, which unpacks it: the same limits, checked first.
    wheel = many_members_zip(tmp_path / "pkg-1.0-py3-none-any.whl", 60)
    error = await _refused(make_agent, cache_dir, {"py_modules": [str(wheel)]})
    assert "more than 50 members" in error.message


class _Server:
    """``/sized.zip`` announces its length; ``/chunked.zip`` does not (streamed)."""

    def __init__(self, body: bytes) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self) -> None:
                self.send_response(200)
                if self.path.startswith("/sized"):
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                for i in range(0, len(body), 64 * 1024):
                    try:
                        self.wfile.write(body[i : i + 64 * 1024])
                    except OSError:
                        return  # the client stopped reading: the point

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
    s = _Server(os.urandom(3 * MiB))
    yield s
    s.close()


@pytest.mark.parametrize("route", ["sized", "chunked"])
async def test_downloads_stop_at_the_fields_limit(
    make_agent: MakeAgent, cache_dir: Path, server: _Server, route: str
) -> None:
    registry = PluginRegistry([WorkingDirPlugin(max_bytes=MiB), PyModulesPlugin(max_bytes=MiB)])
    url = f"{server.url}/{route}.zip?sig=SECRET-QUERY"
    agent = await make_agent(registry=registry)
    with pytest.raises(BuildError) as info:
        await agent.get_or_create(agent.parse({"working_dir": url}), "t")
    error = info.value
    assert error.step == "working_dir"
    assert "larger than the limit of 1.0 MiB" in error.message
    assert "\n" not in error.message
    assert "SECRET-QUERY" not in str(error)  # URLs are shown without their query
    assert await asyncio.to_thread(lambda: list((cache_dir / "tmp").iterdir())) == []
