"""Does the Jupyter server keep answering while its agent builds environments?

    .venv/bin/python benchmarks/bench_server_loop.py [--rounds 3] [--envs 4]

Each round starts a real ``jupyter server`` (this package's extension enabled, a fresh cache,
installers offline on a wheelhouse of tiny packages built on the fly, as the tests do),
asks for ``--envs`` environments with real ``pip`` installs (uv) at once (the default
install limit, 2, applies), and meanwhile
calls ``GET {base_url}jupyter-runtimeenv/api/status`` back to back until every env is READY.
It prints the latency percentiles of those calls over every round, measured from this
process (HTTP round trip included). Target: p99 <= 20 ms. No network is used.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import rss_mb  # noqa: E402

from tests.wheelhouse import make_wheelhouse  # noqa: E402

BASE_URL = "/bench/"
API = f"{BASE_URL}jupyter-runtimeenv/api"
PACKAGE_SETS = [["alpha==1.0"], ["alpha==2.0"], ["beta"], ["delta"], ["gamma"], ["picklebreaker"]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    tmp: Path,
    wheelhouse: Path,
    port: int,
    token: str,
    extension: bool = True,
    watch: bool = False,
) -> subprocess.Popen[bytes]:
    """A real ``jupyter server`` (this package's extension enabled unless ``extension`` is
    false; with ``watch``, also ``_loopwatch``: what its event loop did)."""
    env = dict(os.environ)
    extensions = {"jupyter_runtimeenv": extension}
    if watch:
        extensions["_loopwatch"] = True
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(Path(__file__).parent), env.get("PYTHONPATH")) if p
        )
    env.update(
        UV_NO_INDEX="1",
        UV_FIND_LINKS=str(wheelhouse),
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(wheelhouse),
        JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
        JUPYTER_CONFIG_DIR=str(tmp / "config"),
    )
    argv = [
        sys.executable, "-m", "jupyter_server", "--no-browser", f"--port={port}",
        "--ip=127.0.0.1", "--allow-root", f"--ServerApp.base_url={BASE_URL}",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp}",
        f"--ServerApp.jpserver_extensions={extensions}",
        f"--RuntimeEnvExtension.cache_dir={tmp / 'cache'}",
    ]  # fmt: skip
    log = open(tmp / "server.log", "wb")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


def request(
    conn: http.client.HTTPConnection, method: str, path: str, token: str, body: object = None
) -> tuple[int, dict[str, object]]:
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Authorization": f"token {token}"})
    response = conn.getresponse()
    return response.status, json.loads(response.read() or b"null")


def wait_until_up(
    server: subprocess.Popen[bytes], conn: http.client.HTTPConnection, path: str, token: str
) -> None:
    for _ in range(600):  # the server takes a moment to listen
        try:
            if request(conn, "GET", path, token)[0] == 200:
                return
        except (OSError, http.client.HTTPException):
            conn.close()
        if server.poll() is not None:
            break
        time.sleep(0.05)
    raise SystemExit(f"the server did not answer {path}")


def one_round(envs: int, measure: Callable[[str, int], None] | None = None) -> list[float]:
    """Latencies of GET status while ``envs`` envs build; ``measure("idle"|"built", pid)``
    is called with the server's pid before the builds start and once they are READY."""
    with tempfile.TemporaryDirectory(prefix="jre-bench-loop-") as name:
        tmp = Path(name)
        wheelhouse = make_wheelhouse(tmp / "wheelhouse")
        port, token = free_port(), secrets.token_hex(16)
        server = start_server(tmp, wheelhouse, port, token)
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                wait_until_up(server, conn, f"{API}/status", token)
            except SystemExit:
                raise SystemExit((tmp / "server.log").read_text()) from None
            if measure is not None:
                measure("idle", server.pid)
            for packages in PACKAGE_SETS[:envs]:
                code, body = request(conn, "POST", f"{API}/envs", token, {"pip": packages})
                assert code == 201, (code, body)
            latencies: list[float] = []
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                start = time.perf_counter()
                _, status = request(conn, "GET", f"{API}/status", token)
                latencies.append(time.perf_counter() - start)
                counts = status["envs"]
                assert isinstance(counts, dict)
                if counts.get("READY", 0) + counts.get("FAILED", 0) >= envs:
                    break
            if counts.get("FAILED"):
                raise SystemExit(f"a build failed; see {tmp / 'server.log'}")
            if measure is not None:
                measure("built", server.pid)
            conn.close()
            return latencies
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(30)


def idle_rss(extension: bool) -> float:
    """Resident MB of an idle server (with or without this extension), once it answers."""
    with tempfile.TemporaryDirectory(prefix="jre-bench-rss-") as name:
        tmp = Path(name)
        port, token = free_port(), secrets.token_hex(16)
        server = start_server(tmp, tmp, port, token, extension=extension)
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            wait_until_up(server, conn, f"{BASE_URL}api/status", token)
            conn.close()
            time.sleep(0.5)  # let start-up garbage settle
            return rss_mb([server.pid])
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--envs", type=int, default=4, choices=range(1, len(PACKAGE_SETS) + 1))
    args = parser.parse_args()
    latencies: list[float] = []
    for i in range(args.rounds):
        got = one_round(args.envs)
        print(f"round {i + 1}: {len(got)} calls while {args.envs} envs built")
        latencies.extend(got)
    ms = sorted(x * 1000 for x in latencies)
    p99 = ms[max(0, int(len(ms) * 0.99) - 1)]
    print(f"GET status during builds: n={len(ms)}")
    print(f"  p50 {statistics.median(ms):.2f} ms   p99 {p99:.2f} ms   max {ms[-1]:.2f} ms")
    print(f"  target p99 <= 20 ms: {'met' if p99 <= 20 else 'NOT met'}")


if __name__ == "__main__":
    main()
