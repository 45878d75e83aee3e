"""The first ``%runtime_env`` in a fresh kernel, its env already cached (issue 19 item 5).

    .venv/bin/python benchmarks/bench_kernel_env.py [--reps 3]

A real ``jupyter server`` with this extension (a fresh cache), and for each rep a fresh
ipykernel started by ``jupyter_client`` with the environment the server gives its kernels
(``JUPYTER_RUNTIMEENV_URL``/``_TOKEN``, a kernel id), so the kernel talks to the server's
agent as in JupyterLab. Timed from the client, execute request to reply: ``%load_ext
jupyter_runtimeenv``, then ``%runtime_env --env-var K=1`` (the env was built by an earlier
kernel, so it is cached), and as the floor, an empty cell in the same kernel. Also the
same without a server (the agent embedded in the kernel, the cache warm). Target: the
cached ``%runtime_env`` in a kernel of a server ≤ 150 ms. No network is used.
"""

from __future__ import annotations

import argparse
import http.client
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _common import compile_package
from bench_server_loop import API, free_port, start_server, wait_until_up

MAGIC = "%runtime_env --env-var K=1 --no-widget"


def _execute(client: Any, code: str) -> float:
    """Seconds from the request to the reply; the reply must be ok."""
    started = time.perf_counter()
    msg_id = client.execute(code)
    while True:
        reply = client.get_shell_msg(timeout=300)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    elapsed = time.perf_counter() - started
    if reply["content"]["status"] != "ok":
        raise SystemExit(f"{code!r} failed in the kernel: {reply['content']}")
    return elapsed


def one_kernel(env: dict[str, str]) -> dict[str, float]:
    """A fresh kernel: the time of an empty cell, ``%load_ext`` and the magic."""
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3", env=env)
    try:
        return {
            "empty cell": _execute(client, "pass"),
            "load_ext": _execute(client, "%load_ext jupyter_runtimeenv"),
            "runtime_env": _execute(client, MAGIC),
        }
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def measure(tmp: Path, reps: int) -> dict[str, list[float]]:
    """Samples of each phase, in a kernel of a server (``server ...``) and with the agent
    embedded (``embedded ...``); the first kernel of each builds the env, the rest count."""
    out: dict[str, list[float]] = {}
    base = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_RUNTIMEENV_")}
    base["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # this checkout first
    port, token = free_port(), secrets.token_hex(16)
    server = start_server(tmp, tmp, port, token)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            wait_until_up(server, conn, f"{API}/status", token)
        except SystemExit:
            raise SystemExit((tmp / "server.log").read_text()[-3000:]) from None
        conn.close()
        url = f"http://127.0.0.1:{port}{API}/"
        for who, extra in (
            ("server", {"JUPYTER_RUNTIMEENV_URL": url, "JUPYTER_RUNTIMEENV_TOKEN": token}),
            ("embedded", {"JUPYTER_RUNTIMEENV_CACHE": str(tmp / "embedded-cache")}),
        ):
            for rep in range(reps + 1):
                env = {**base, **extra, "JUPYTER_RUNTIMEENV_KERNEL_ID": str(uuid.uuid4())}
                times = one_kernel(env)
                if rep:  # the first kernel built the env
                    for phase, seconds in times.items():
                        out.setdefault(f"{who} {phase}", []).append(seconds)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    return out


def run(tmp: Path, reps: int) -> dict[str, list[float]]:
    tmp.mkdir(parents=True, exist_ok=True)
    return measure(tmp, reps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    compile_package()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="jre-bench-kenv-") as name:
        data = run(Path(name), args.reps)
    for key, samples in data.items():
        ms = [s * 1000 for s in samples]
        spread = f"(min {min(ms):.1f}, max {max(ms):.1f})"
        print(f"{key:<24} median {statistics.median(ms):7.1f} ms  {spread}")
    print(f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
