"""Threat: the events websocket buffers without limit.

A subscriber of ``/api/events/subscribe`` that never reads, plus large kernel reports (each is
published to every subscriber), grew the server by the size of every event (~4.7 MiB per
report of 64 pools of 1,024 workers: 92 -> 1,026 MiB in the probe).

Rules under test (``server/subscribe.py``, ``server/kernels.py``): a subscriber with more than
``events_buffer_bytes`` waiting is disconnected; a report holds at most 1,024 workers in all
and 256 KiB, and its ``runtime_env`` is depth-limited like a spec. A real server in its own
process, a real kernel, a raw websocket that never reads (its receive window made small).
"""

from __future__ import annotations

import base64
import os
import socket
import time
from typing import Any

import psutil
import pytest
from jupyter_process import API, JupyterProcess

from tests.security.conftest import ServerFactory, request_within

BUFFER = 256 * 1024


def _subscribe_and_never_read(server: JupyterProcess) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            "GET /api/events/subscribe HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{server.port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: token {server.token}\r\n\r\n"
        ).encode()
    )
    sock.settimeout(30)
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def _report(n_workers: int, busy: bool) -> dict[str, Any]:
    workers = [
        {"pid": 10_000 + i, "busy": busy, "tasks_done": i, "tasks_failed": 0, "rss": 1 << 20}
        for i in range(n_workers)
    ]
    return {"pools": [{"env_id": "e" * 64, "name": "x", "workers": workers}], "cwd": "/"}


@pytest.mark.timeout(600)
def test_a_subscriber_that_never_reads_is_dropped_and_the_server_does_not_grow(
    make_server_process: ServerFactory,
) -> None:
    server = make_server_process(f"--RuntimeEnvExtension.events_buffer_bytes={BUFFER}")
    code, kernel = request_within(server, "POST", "api/kernels", {"name": "python3"}, seconds=60)
    assert code == 201, kernel
    try:
        stalled = _subscribe_and_never_read(server)
        rss = psutil.Process(server.proc.pid).memory_info().rss
        sent = 0
        busy = False
        while sent < 64 * 2**20:  # 64 MiB of events for the stalled subscriber
            busy = not busy  # a changed report is an event
            body = _report(1024, busy)
            code, answer = request_within(
                server, "POST", f"{API}kernels/{kernel['id']}", body, seconds=60
            )
            assert code == 204, answer
            sent += len(str(body))
        grown = psutil.Process(server.proc.pid).memory_info().rss - rss
        assert grown < 32 * 2**20, f"the server grew by {grown / 2**20:.0f} MiB"
        # The server dropped the stalled subscriber: what it had in flight, then EOF.
        deadline = time.monotonic() + 60
        while stalled.recv(1 << 16):
            assert time.monotonic() < deadline, "the stalled subscriber was never dropped"
        assert "did not read what the server sent" in server.log_path.read_text()
        stalled.close()
    finally:
        request_within(server, "DELETE", f"api/kernels/{kernel['id']}", seconds=60)


@pytest.mark.timeout(300)
def test_reports_are_bounded_in_workers_bytes_and_depth(server_process: JupyterProcess) -> None:
    server = server_process
    code, kernel = request_within(server, "POST", "api/kernels", {"name": "python3"}, seconds=60)
    assert code == 201, kernel
    path = f"{API}kernels/{kernel['id']}"
    try:
        many = {"pools": [_report(1000, False)["pools"][0]] * 2}
        code, answer = request_within(server, "POST", path, many, seconds=60)
        assert (code, "at most 1024" in answer["message"]) == (400, True), answer
        huge = {**_report(1, False), "cwd": "x" * 300_000}
        code, answer = request_within(server, "POST", path, huge, seconds=60)
        assert code == 413, answer
        deep: Any = "leaf"
        for _ in range(900):
            deep = {"a": deep}
        code, answer = request_within(
            server, "POST", path, {**_report(1, False), "runtime_env": deep}, seconds=60
        )
        assert code == 400, answer
        assert answer["message"].startswith("runtime_env."), answer
        code, answer = request_within(server, "GET", f"{path}/notebook_env", seconds=60)
        assert code in (200, 404), answer  # never a 500
    finally:
        request_within(server, "DELETE", f"api/kernels/{kernel['id']}", seconds=60)
