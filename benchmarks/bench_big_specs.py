"""Does one big spec, or many stored envs, slow every request down?

    .venv/bin/python benchmarks/bench_big_specs.py [--envs 300] [--reps 50]

Starts a real ``jupyter server`` (this package's extension, a fresh cache), then measures the
latency of ``GET status``, ``GET envs``, ``GET envs/{id}`` and ``POST envs`` (an env already
built) three times: on an empty cache; after one spec just under ``max_spec_bytes`` (1 MiB)
was built; and after ``--envs`` more envs (each with a 64 KiB variable) were built. Requests
whose work grows with the stored envs would show it in the later columns. A body past the
limit is also sent, to show the 413 costs no more than a small request. No network is used.
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

BASE_URL = "/bench/"
API = f"{BASE_URL}jupyter-runtimeenv/api"
LIMIT = 2**20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(tmp: Path, port: int, token: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
    }
    argv = [
        sys.executable, "-m", "jupyter_server", "--no-browser", f"--port={port}",
        "--ip=127.0.0.1", "--allow-root", f"--ServerApp.base_url={BASE_URL}",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp}",
        "--ServerApp.jpserver_extensions={'jupyter_runtimeenv': True}",
        f"--RuntimeEnvExtension.cache_dir={tmp / 'cache'}",
    ]  # fmt: skip
    log = open(tmp / "server.log", "wb")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


class Client:
    def __init__(self, port: int, token: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.token = token

    def __call__(self, method: str, path: str, body: object = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"token {self.token}"}
        self.conn.request(method, f"{API}/{path}", body=data, headers=headers)
        response = self.conn.getresponse()
        return response.status, response.read()


def wait_up(call: Client, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit("the server exited; see its log")
        try:
            if call("GET", "envs?limit=1")[0] == 200:
                return
        except OSError:
            time.sleep(0.2)
            call.conn.close()
    raise SystemExit("the server did not start within 60 s")


def ms(call: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def measure(call: Client, env_id: str, reps: int) -> dict[str, float]:
    small = {"env_vars": {"BENCH": "small"}}
    call("POST", "envs?wait=1", small)
    return {
        "GET status": ms(lambda: call("GET", "status"), reps),
        "GET envs (page)": ms(lambda: call("GET", "envs"), reps),
        "GET envs/{small id}": ms(lambda: call("GET", f"envs/{env_id}"), reps),
        "POST envs (known)": ms(lambda: call("POST", "envs", small), reps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, default=300)
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jre-bench-big-") as name:
        tmp = Path(name)
        port, token = free_port(), secrets.token_hex(16)
        server = start_server(tmp, port, token)
        try:
            call = Client(port, token)
            wait_up(call, server)
            code, body = call("POST", "envs?wait=1", {"env_vars": {"BENCH": "small"}})
            small_id = json.loads(body)["env_id"]
            columns = {"empty cache": measure(call, small_id, args.reps)}
            code, _ = call(
                "POST", "envs?wait=1", {"env_vars": {f"BIG{i}": "x" * 100_000 for i in range(9)}}
            )
            assert code == 201, code
            columns["+ a 1 MiB spec"] = measure(call, small_id, args.reps)
            for i in range(args.envs):
                body_i = {"env_vars": {"N": str(i), "PAD": "y" * 65536}}
                code, _ = call("POST", "envs?wait=1", body_i)
                assert code == 201, code
            columns[f"+ {args.envs} envs of 64 KiB"] = measure(call, small_id, args.reps)
            started = time.perf_counter()
            code, _ = call("POST", "envs", {"env_vars": {"BIG": "x" * (LIMIT + 1)}})
            refused = (time.perf_counter() - started) * 1000
            refused_code = code
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
    names = list(columns)
    print(f"median ms over {args.reps} requests   " + "  ".join(f"{n:>22}" for n in names))
    for row in columns[names[0]]:
        print(f"{row:<34}" + "  ".join(f"{columns[n][row]:>22.2f}" for n in names))
    print(f"{f'POST of 1 MiB + 1 byte ({refused_code})':<34}{refused:>22.2f}")


if __name__ == "__main__":
    main()
