"""A real Dask cluster of subprocesses for the remote kernel tests: ``dask scheduler`` and
``dask worker`` processes (no nanny: the worker process is the node), each worker with its
own cache root, optionally each in a network namespace of its own (``netns.py``).

Who uses it: ``test_remote_kernels.py``, ``test_remote_netns.py``, the browser test and the
server tests of kernels on a cluster. ``stop()`` leaves no process: the workers, the
scheduler and anything they started (a kernel a test forgot) are killed and waited for.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil
from processes import alive

__all__ = ["DaskNodes", "alive", "ancestors", "listening", "wait_until"]


#: The line ``dask scheduler`` logs once it listens (with ``--port 0``: on a port of its choice).
SCHEDULER_AT = re.compile(r"Scheduler at:\s+(tcp://[^\s:]+:(\d+))")


def ancestors(pid: int) -> list[int]:
    """The pids above ``pid``, nearest first (empty if it is gone)."""
    try:
        return [p.pid for p in psutil.Process(pid).parents()]
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []


def listening(pid: int) -> set[tuple[str, int]]:
    """The TCP (ip, port) pairs ``pid`` listens on, read from its own /proc (so a process in
    another network namespace is seen as it binds there). Empty if it is gone."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
        tables = {t: Path(f"/proc/{pid}/net/{t}").read_text() for t in ("tcp", "tcp6")}
    except OSError:
        return set()
    found = set()
    for table, text in tables.items():
        for line in text.splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            hex_ip, hex_port = local.split(":")
            raw = bytes.fromhex(hex_ip)
            if table == "tcp":
                ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
            else:  # four little-endian 32-bit words
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                ip = socket.inet_ntop(socket.AF_INET6, words)
            found.add((ip, int(hex_port, 16)))
    return found


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class DaskNodes:
    """A scheduler on ``scheduler_host`` and one worker per entry of ``worker_hosts``.

    ``wrap(i)`` may return a command prefix for worker ``i`` (``ip netns exec NAME``).
    ``env`` is added to every process's environment; worker ``i`` gets
    ``JUPYTER_RUNTIMEENV_CACHE=<root>/node-<i>``.
    """

    def __init__(
        self,
        root: Path,
        *,
        scheduler_host: str = "127.0.0.1",
        worker_hosts: Sequence[str] = ("127.0.0.1", "127.0.0.1"),
        env: Mapping[str, str] | None = None,
        wrap: Any = None,
        timeout: float = 90,
    ) -> None:
        self.root = root
        self.port = 0  # the scheduler's own choice, once it is up (``_start``)
        self.address = ""
        self.env = {**os.environ, **(env or {})}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.workers: list[subprocess.Popen[bytes]] = []
        self.cache_roots: list[Path] = []
        self.logs: list[Path] = []
        self.client: Any = None
        try:
            self._start(scheduler_host, list(worker_hosts), wrap, timeout)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, argv: list[str], log: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        self.logs.append(log)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, env=dict(env), cwd=self.root, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.procs.append(proc)
        return proc

    def _start(self, host: str, hosts: list[str], wrap: Any, timeout: float) -> None:
        import distributed

        dask = [sys.executable, "-m", "dask"]
        self._spawn(
            [
                *dask,
                "scheduler",
                "--host",
                host,
                # Port 0: the scheduler binds a free port itself. A port picked here and
                # passed on could be taken by another process before the scheduler binds it
                # (CI saw "Address already in use").
                "--port",
                "0",
                "--no-dashboard",
                "--dashboard-address",
                f"{host}:0",
            ],
            self.root / "scheduler.log",
            self.env,
        )
        deadline = time.monotonic() + timeout
        log = self.root / "scheduler.log"
        while not (found := SCHEDULER_AT.search(log.read_text(errors="replace"))):
            if time.monotonic() > deadline or self.procs[0].poll() is not None:
                raise RuntimeError(self._logs_text())
            time.sleep(0.1)
        self.address, self.port = found[1], int(found[2])
        for i, worker_host in enumerate(hosts):
            cache = self.root / f"node-{i}"
            cache.mkdir(mode=0o700)
            self.cache_roots.append(cache)
            argv = [
                *(wrap(i) if wrap else []), *dask, "worker", self.address,
                "--host", worker_host, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                "--name", f"node-{i}", "--death-timeout", "120",
            ]  # fmt: skip
            env = {**self.env, "JUPYTER_RUNTIMEENV_CACHE": str(cache)}
            self.workers.append(self._spawn(argv, self.root / f"worker-{i}.log", env))
        self.client = distributed.Client(self.address, set_as_default=False, timeout=timeout)
        try:
            if hosts:
                self.client.wait_for_workers(len(hosts), timeout=timeout)
        except Exception:
            raise RuntimeError(self._logs_text()) from None

    def _logs_text(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in self.logs)

    def worker_pids(self) -> dict[str, int]:
        """Dask worker address -> its process id."""
        return dict(self.client.run(os.getpid))

    def node_kernels(self) -> dict[str, dict[str, Any]]:
        """Worker address -> the kernels its node agent knows (``node_kernel_info``)."""
        from jupyter_runtimeenv.dask.node_kernels import node_kernel_info

        return dict(self.client.run(node_kernel_info, on_error="return"))

    def node_envs(self) -> dict[str, list[dict[str, Any]]]:
        """Worker address -> the envs of its node agent (id, state, holders)."""

        # Defined here, so that cloudpickle sends it by value: the workers need not import
        # this module (its imports come from the tests' sys.path).
        async def envs(dask_worker: Any) -> list[dict[str, Any]]:
            from jupyter_runtimeenv.dask.node import PLUGIN_NAME

            node = dask_worker.plugins[PLUGIN_NAME].node
            found: list[dict[str, Any]] = await node.on_agent_loop(node.agent.status())
            return [{k: e.get(k) for k in ("env_id", "state", "holders")} for e in found]

        return dict(self.client.run(envs, on_error="return"))

    def kill_worker(self, address: str) -> int:
        """SIGKILL the worker process at ``address`` (the node dies); its pid."""
        pid = self.worker_pids()[address]
        os.kill(pid, signal.SIGKILL)
        return pid

    def kill_scheduler(self) -> int:
        """SIGKILL the scheduler process (its workers close when they lose it); its pid."""
        pid = self.procs[0].pid
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self) -> None:
        """Stop every process of the cluster and whatever they started; wait for them."""
        if self.client is not None:
            with contextlib.suppress(Exception):  # the scheduler may be dead already
                self.client.close(timeout=10)
            self.client = None
        leftovers: set[int] = set()
        for proc in self.procs:
            with contextlib.suppress(
                psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied
            ):
                leftovers.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not any(alive(p) for p in leftovers), 20, "the cluster's children")
