"""A Jupyter server (``jupyter_server`` or ``jupyterlab``) in its own process on 127.0.0.1.

For tests that need the server outside the test's event loop: kernels driven by nbclient, a
browser, signals sent to the server. pytest-jupyter's in-process server serves the rest.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

API = "jupyter-runtimeenv/api/"
#: Starts on a new port when the last one was taken before the server could bind it.
PORT_TRIES = 3
#: What jupyter_server logs when its port is taken (``port_retries=0``: then it exits).
ADDRESS_IN_USE = "already in use"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def hangup_at_default() -> Iterator[None]:
    """While a child starts, SIGHUP is at its default in this process: an ignored signal stays
    ignored across exec, so under ``nohup`` (which ignores SIGHUP) the server would start
    ignoring it and a test of what a hangup does would wait for nothing. The server itself
    rightly leaves an ignored SIGHUP alone (someone chose it)."""
    hup = getattr(signal, "SIGHUP", None)
    if (
        hup is None
        or threading.current_thread() is not threading.main_thread()
        or signal.getsignal(hup) is not signal.SIG_IGN
    ):
        yield
        return
    previous = signal.signal(hup, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(hup, previous)


class JupyterProcess:
    """``python -m <module>`` serving ``root`` (output in ``log``); up once ``status`` answers."""

    def __init__(
        self,
        module: str,
        root: Path,
        log: Path,
        *,
        env: Mapping[str, str],
        args: Sequence[str] = (),
        startup_timeout: float = 90,
        port: int | None = None,
        token: str | None = None,
    ) -> None:
        """``port`` and ``token``: those of a server that stopped, to start it again where
        its pages look for it (else a free port and a new token)."""
        self.root = root
        self.log_path = log
        self.token = token or secrets.token_hex(16)
        self._port = port
        self.log = log.open("wb")
        self.proc: subprocess.Popen[bytes] | None = None
        try:
            for attempt in range(PORT_TRIES):
                self._start(module, root, env, args)
                if self._wait_until_up(startup_timeout):
                    return
                text = log.read_text(errors="replace")
                if ADDRESS_IN_USE not in text or attempt + 1 == PORT_TRIES or port:
                    raise RuntimeError(f"{module} did not start:\n{text}")
                # free_port's port was taken before the server bound it (a kernel's ZMQ
                # socket, another test's server): it exited; start again on another port.
                self.log.seek(0)
                self.log.truncate()
        except BaseException:
            self.stop()  # whatever went wrong, never leave a server behind
            raise

    def _start(self, module: str, root: Path, env: Mapping[str, str], args: Sequence[str]) -> None:
        self.port = self._port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        argv = [
            sys.executable, "-m", module, "--no-browser", "--allow-root", "--ip=127.0.0.1",
            f"--port={self.port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}", *args,
        ]  # fmt: skip
        with hangup_at_default():
            self.proc = subprocess.Popen(
                argv, env=dict(env), cwd=root, stdout=self.log, stderr=subprocess.STDOUT
            )

    def _wait_until_up(self, timeout: float) -> bool:
        """True once this server answers ``status``; False if it exited first. Until then
        nothing on the port, or another process answering there (not HTTP: a kernel's ZMQ
        socket holding the port this one could not bind), is not an answer."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.api("GET", "status")
                return True
            except (OSError, http.client.HTTPException):
                if self.proc.poll() is not None:
                    return False
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"no answer on port {self.port} within {timeout} s:\n"
                        + self.log_path.read_text(errors="replace")
                    ) from None
                time.sleep(0.2)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """A JSON request to ``path`` (relative to the base URL); the decoded answer."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def api(self, method: str, path: str, body: Any = None) -> Any:
        return self.request(method, API + path, body)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
