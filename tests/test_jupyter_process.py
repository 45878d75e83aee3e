"""The tests' own Jupyter server process (``tests/jupyter_process.py``): a port taken before
the server binds it, and a start that fails, leave no server behind.

Seen in a whole-suite run (session 8): a server fixture's start met a port answered by
another process (``BadStatusLine`` of a 0xff byte: a ZMQ socket's greeting), the exception
was not an ``OSError``, so the start raised without stopping its server, which ran on for 36
minutes beside the rest of the suite.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import jupyter_process
import pytest
from jupyter_process import JupyterProcess

ZMQ_GREETING = b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f"


@pytest.fixture
def taken() -> Iterator[int]:
    """A port on 127.0.0.1 held by a listener that answers every connection with a ZMQ
    greeting (what a kernel's socket says), as a kernel that took it first would."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    holder.settimeout(0.1)  # the thread sees ``stop`` soon (a close does not end an accept)
    stop = threading.Event()

    def answer() -> None:
        while not stop.is_set():
            try:
                conn, _ = holder.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.sendall(ZMQ_GREETING)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield int(holder.getsockname()[1])
    stop.set()
    holder.close()
    thread.join(10)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[subprocess.Popen[bytes]]:
    """Every server process the class starts in the test."""
    procs: list[subprocess.Popen[bytes]] = []
    real = subprocess.Popen

    def spy(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        proc: subprocess.Popen[bytes] = real(*args, **kwargs)  # type: ignore[call-overload]
        procs.append(proc)
        return proc

    monkeypatch.setattr(subprocess, "Popen", spy)
    return procs


def _env(root: Path) -> dict[str, str]:
    return {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        "JUPYTER_DATA_DIR": str(root / "data"),
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "JUPYTER_RUNTIMEENV_CACHE": str(root / "cache"),
    }


def test_a_port_taken_before_the_server_binds_it_is_tried_again_on_another(
    tmp_path: Path,
    taken: int,
    started: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ports = iter([taken])
    free = jupyter_process.free_port
    monkeypatch.setattr(jupyter_process, "free_port", lambda: next(ports, None) or free())
    server = JupyterProcess("jupyter_server", tmp_path, tmp_path / "log", env=_env(tmp_path))
    try:
        assert server.port != taken
        # The server answers before its agent's start-up (a task on its loop) is over:
        # ``status`` may say ``started: false`` then. A request that needs the agent waits
        # for that start, so after it the status must say started (seen false once under
        # load, in a whole-suite run).
        assert server.api("GET", "envs")["envs"] == []
        assert server.api("GET", "status")["started"] is True
        assert len(started) == 2
        assert started[0].poll() is not None  # the first could not bind and is gone
    finally:
        server.stop()
    assert all(proc.poll() is not None for proc in started)


def test_a_start_that_fails_leaves_no_server(
    tmp_path: Path,
    taken: int,
    started: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(jupyter_process, "free_port", lambda: taken)
    with pytest.raises(RuntimeError, match="did not start"):
        JupyterProcess("jupyter_server", tmp_path, tmp_path / "log", env=_env(tmp_path))
    assert len(started) == jupyter_process.PORT_TRIES
    assert all(proc.poll() is not None for proc in started)


def test_a_server_that_never_answers_is_stopped(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    # Without the extension, its status route answers 404: never up.
    env = {**_env(tmp_path), "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    with pytest.raises(TimeoutError, match="no answer"):
        JupyterProcess(
            "jupyter_server",
            tmp_path,
            tmp_path / "log",
            env=env,
            args=["--ServerApp.jpserver_extensions={'jupyter_runtimeenv': False}"],
            startup_timeout=8,
        )
    assert len(started) == 1
    assert started[0].poll() is not None
