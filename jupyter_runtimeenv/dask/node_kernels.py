"""Kernels on a Dask node: ``ipykernel`` started by the node agent inside an env built there.

Who calls it: the Dask kernel provisioner (``kernels/remote.py``), in the Jupyter server,
through ``Client.run`` (coroutines on the Dask worker's loop; blocking work in threads, the
agent's work on the node agent's loop thread). Dask runs ``NodeKernelsPlugin`` on every
worker (registered by the provisioner next to ``NodeAgentPlugin``); its teardown kills the
node's kernels.

One start, step by step:

- ``node_kernel_load``: how busy this node is and whether the kernel's env is READY here
  (the provisioner picks a node with it, else the least loaded);
- ``node_kernel_build``: the staged env is built by the node agent with ``kernel:<id>`` as
  holder; its events (state, steps, installer lines) go to the provisioner as Dask events
  on the kernel's topic, so the server can show the build naming the node;
- ``node_kernel_start``: a connection file (owner-only, in an owner-only directory below the
  node's cache root) names the node's own address, a key made here and ports 0 (the
  kernel's previous ports on a restart, when they are free); ``ipykernel`` binds free ports
  on that address itself and writes them back, so ports are chosen on the node with no race;
  the connection info goes back to the provisioner, never into a log (``Client.run`` logs
  the arguments of a call that fails, so the key is never an argument).

The kernel runs in its own session (interrupts reach its process group, not the Dask
worker), with ``JPY_PARENT_PID`` set to the Dask worker: ipykernel exits when its parent
goes, so a lost node leaves no kernel behind. A waiter thread reaps it and tells the
provisioner at once (kind ``exited``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distributed import WorkerPlugin
from distributed.comm.addressing import get_address_host
from distributed.worker import Worker

from ..agent.events import Event
from ..context import EnvContext, process_env
from ..errors import BuildError, KernelStartError
from ..kernels.command import kernel_command
from .node import PLUGIN_NAME as NODE_PLUGIN_NAME
from .node import NodeAgent

PLUGIN_NAME = "jupyter-runtimeenv-node-kernels"
#: Variables of the Dask worker a kernel must not inherit (the server's, a parent's pid).
_SCRUBBED = ("JUPYTER_RUNTIMEENV_URL", "JUPYTER_RUNTIMEENV_TOKEN", "JPY_PARENT_PID")
_KERNEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
#: How often installer lines are sent to the provisioner (one Dask event per batch).
LOG_BATCH_SECONDS = 0.25
#: How long a stopped kernel's processes get to disappear after SIGKILL.
KILL_GRACE = 10.0


class NodeKernelsPlugin(WorkerPlugin):
    """Keeps the kernels of one Dask worker; kills them when the worker closes."""

    idempotent = True
    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.kernels: NodeKernels | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"kernels": None}

    async def setup(self, worker: Worker) -> None:
        self.kernels = NodeKernels(worker)

    async def teardown(self, worker: Worker) -> None:
        kernels, self.kernels = self.kernels, None
        if kernels is not None:
            await kernels.close()


@dataclass(eq=False)
class _Kernel:
    """One kernel id on this node: its env reference, directory and (while it runs) process.
    Survives a restart (same key, its ports preferred); forgotten at shutdown."""

    kernel_id: str
    topic: str
    directory: Path
    key: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)
    ctx: EnvContext | None = None
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None
    pids: set[int] = field(default_factory=set)


class NodeKernels:
    """The kernels the node agent of one Dask worker runs."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.address = str(worker.address)
        self._kernels: dict[str, _Kernel] = {}
        self._lock = threading.Lock()

    # -- placement ---------------------------------------------------------------------------

    async def load(self, token: str) -> dict[str, Any]:
        """How busy this node is, and whether the env staged as ``token`` is READY here."""
        node = self._node()
        ready = False
        spec = node.spec_of(token)
        if spec is not None:
            with contextlib.suppress(Exception):  # not parsed or not known: not ready
                parsed = await asyncio.to_thread(node.agent.parse, spec)
                status = await node.on_agent_loop(node.agent.env_status(parsed.env_id))
                ready = status.get("state") == "READY"
        with self._lock:
            running = sum(1 for k in self._kernels.values() if _running(k))
        return {
            "ready": ready,
            "staged": spec is not None,
            "kernels": running,
            "executing": len(self.worker.state.executing),
            "nthreads": int(self.worker.state.nthreads),
            "loadavg": os.getloadavg()[0] / max(1, os.cpu_count() or 1),
        }

    # -- the build ---------------------------------------------------------------------------

    async def build(self, kernel_id: str, token: str, topic: str) -> dict[str, Any]:
        """Build the staged env with the kernel as holder; its env id and interpreter.

        ``KernelStartError`` (one line naming this node) when it is not staged or fails.
        """
        kernel = self._kernel(kernel_id, topic)
        node = self._node()
        spec = node.spec_of(token)
        if spec is None:
            raise KernelStartError(
                f"the kernel's environment is not staged on Dask worker {self.address}",
                node=self.address,
            )
        try:
            parsed = await asyncio.to_thread(node.agent.parse, spec)
        except Exception as exc:
            raise KernelStartError(
                f"the kernel's environment is refused on Dask worker {self.address}: {exc}",
                node=self.address,
            ) from None
        forwarder = _Forwarder(self.worker, topic, parsed.env_id)
        unlisten = await node.on_agent_loop(_listen(node, forwarder))
        try:
            ctx = await node.on_agent_loop(node.agent.get_or_create(parsed, _holder(kernel_id)))
        except BuildError as exc:
            raise KernelStartError(
                f"building the kernel's environment failed on Dask worker {self.address}:"
                f" {_one_line(exc)}",
                node=self.address,
                detail=exc.output_tail
                + ([f"(full log on the node: {exc.log_path})"] if exc.log_path else []),
            ) from None
        finally:
            await node.on_agent_loop(_unlisten(unlisten, forwarder))
        if kernel.ctx is not None and kernel.ctx.env_id != ctx.env_id:
            # A restart in a rebuilt env: drop the old env's reference, keep the new one.
            await node.on_agent_loop(node.agent.release(kernel.ctx.env_id, _holder(kernel_id)))
        kernel.ctx = ctx
        return {"env_id": ctx.env_id, "python": ctx.python}

    # -- the kernel process ------------------------------------------------------------------

    async def start(
        self,
        kernel_id: str,
        argv: list[str],
        env: Mapping[str, str],
        start_timeout: float,
    ) -> dict[str, Any]:
        """Start the kernel in its built env; its connection info once it bound its ports."""
        kernel = self._known(kernel_id)
        if kernel.ctx is None:
            raise KernelStartError(
                f"the kernel's environment is not built on Dask worker {self.address}",
                node=self.address,
            )
        if _running(kernel):
            raise KernelStartError(
                f"kernel {kernel_id} already runs on Dask worker {self.address}",
                node=self.address,
            )
        host = await asyncio.to_thread(_node_ip, self.address)
        variables = {
            **env,
            "JPY_PARENT_PID": str(os.getpid()),
            "JUPYTER_RUNTIMEENV_CACHE": str(self._node().cache_root),
            "JUPYTER_RUNTIMEENV_KERNEL_NODE": self.address,
            "JUPYTER_RUNTIMEENV_DASK_SCHEDULER": str(self.worker.scheduler.address),
        }
        return await asyncio.to_thread(
            self._start_blocking, kernel, host, argv, variables, start_timeout
        )

    def _start_blocking(
        self,
        kernel: _Kernel,
        host: str,
        argv: list[str],
        variables: dict[str, str],
        start_timeout: float,
    ) -> dict[str, Any]:
        assert kernel.ctx is not None
        ctx = kernel.ctx
        _private_dir(kernel.directory.parent)
        _private_dir(kernel.directory)
        work = kernel.directory / "work"
        _private_dir(work)
        connection_file = kernel.directory / "connection.json"
        ports = kernel.ports if kernel.ports and _free(host, kernel.ports) else {}
        info = {
            "ip": host,
            "transport": "tcp",
            "signature_scheme": "hmac-sha256",
            "key": kernel.key,
            "kernel_name": "",
            **{name: ports.get(name, 0) for name in _PORTS},
        }
        _write_private(connection_file, json.dumps(info))
        cmd = kernel_command(
            ctx, [a.replace("{connection_file}", str(connection_file)) for a in argv]
        )
        base = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
        penv = process_env(ctx, base)
        penv.update(variables)
        log_path = kernel.directory / "kernel.log"
        with open(log_path, "ab") as log:
            os.chmod(log_path, 0o600)
            proc = subprocess.Popen(
                cmd,
                env=penv,
                cwd=ctx.cwd or str(work),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # interrupts reach the kernel's group, not the worker
            )
        kernel.proc, kernel.exit_code = proc, None
        kernel.pids.add(proc.pid)
        threading.Thread(
            target=self._reap, args=(kernel, proc), name=f"kernel-{proc.pid}", daemon=True
        ).start()
        deadline = time.monotonic() + start_timeout
        while True:
            bound = _bound_ports(connection_file)
            if bound is not None:
                kernel.ports = bound
                break
            if proc.poll() is not None:
                raise KernelStartError(
                    f"the kernel exited with code {proc.returncode} while starting on Dask"
                    f" worker {self.address}: {_last_line(log_path)}",
                    node=self.address,
                    detail=_tail(log_path),
                )
            if time.monotonic() > deadline:
                _kill_tree(proc.pid, {proc.pid})
                raise KernelStartError(
                    f"the kernel did not come up within {start_timeout:g} s on Dask worker"
                    f" {self.address}: {_last_line(log_path) or 'no output'}",
                    node=self.address,
                    detail=_tail(log_path),
                )
            time.sleep(0.05)
        return {
            "connection": {**info, **bound},
            "pid": proc.pid,
            "node": self.address,
            "env_id": ctx.env_id,
        }

    def _reap(self, kernel: _Kernel, proc: subprocess.Popen[bytes]) -> None:
        """The kernel's waiter thread: reaps it and tells the provisioner at once."""
        code = proc.wait()
        with self._lock:
            if kernel.proc is proc:
                kernel.exit_code = code
        with contextlib.suppress(Exception):  # the worker is closing: poll answers instead
            self.worker.log_event(
                kernel.topic,
                {"kind": "exited", "kernel_id": kernel.kernel_id, "pid": proc.pid, "code": code},
            )

    async def signal(self, kernel_id: str, signum: int) -> bool:
        """Send ``signum`` to the kernel's process group; whether it was running."""
        kernel = self._kernels.get(kernel_id)
        if kernel is None or kernel.proc is None or not _running(kernel):
            return False
        pid = kernel.proc.pid
        try:
            os.killpg(pid, signum)  # its own session: the group id is its pid
        except ProcessLookupError:
            return False
        except PermissionError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        return True

    async def poll(self, kernel_id: str) -> dict[str, Any]:
        """``{"exit": None}`` while the kernel runs, else its exit code (``known`` is
        false for a kernel this node never ran, e.g. after the Dask worker restarted)."""
        kernel = self._kernels.get(kernel_id)
        if kernel is None:
            return {"exit": -1, "known": False}
        if kernel.proc is None:
            return {"exit": kernel.exit_code if kernel.exit_code is not None else -1, "known": True}
        return {"exit": kernel.proc.poll(), "known": True}

    async def stop(self, kernel_id: str, *, forget: bool) -> None:
        """Kill the kernel and every process it started. With ``forget`` (not a restart),
        release its env and remove its directory too."""
        with self._lock:
            kernel = self._kernels.get(kernel_id)
            if kernel is not None and forget:
                del self._kernels[kernel_id]
        if kernel is None:
            return
        await asyncio.to_thread(self._kill, kernel)
        if not forget:
            return
        ctx, kernel.ctx = kernel.ctx, None
        if ctx is not None:
            node = self._node_or_none()
            if node is not None:
                with contextlib.suppress(Exception):  # a stopping agent dropped it already
                    await node.on_agent_loop(node.agent.release(ctx.env_id, _holder(kernel_id)))
        await asyncio.to_thread(shutil.rmtree, kernel.directory, True)

    def _kill(self, kernel: _Kernel) -> None:
        proc = kernel.proc
        if proc is not None:
            _kill_tree(proc.pid, kernel.pids)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=KILL_GRACE)
            with self._lock:
                kernel.exit_code = proc.returncode
                kernel.proc = None
        kernel.pids.clear()

    def info(self) -> dict[str, Any]:
        """The kernels of this node (tests and the provisioner's checks)."""
        with self._lock:
            kernels = list(self._kernels.values())
        return {
            k.kernel_id: {
                "pid": k.proc.pid if k.proc is not None else None,
                "running": _running(k),
                "exit": k.exit_code,
                "env_id": k.ctx.env_id if k.ctx is not None else None,
                "directory": str(k.directory),
            }
            for k in kernels
        }

    async def close(self) -> None:
        """Kill every kernel and release their envs (the Dask worker is closing)."""
        for kernel_id in list(self._kernels):
            with contextlib.suppress(Exception):
                await self.stop(kernel_id, forget=True)

    # -- helpers -----------------------------------------------------------------------------

    def _node(self) -> NodeAgent:
        node = self._node_or_none()
        if node is None:
            raise KernelStartError(
                f"Dask worker {self.address} has no node agent (plugin missing)",
                node=self.address,
            )
        return node

    def _node_or_none(self) -> NodeAgent | None:
        node = getattr(self.worker.plugins.get(NODE_PLUGIN_NAME), "node", None)
        return node if isinstance(node, NodeAgent) else None

    def _kernel(self, kernel_id: str, topic: str) -> _Kernel:
        if not _KERNEL_ID.fullmatch(kernel_id):
            raise KernelStartError(f"not a kernel id: {kernel_id[:80]!r}", node=self.address)
        with self._lock:
            kernel = self._kernels.get(kernel_id)
            if kernel is None:
                directory = self._node().cache_root / "kernels" / kernel_id
                kernel = self._kernels[kernel_id] = _Kernel(kernel_id, topic, directory)
            kernel.topic = topic
            return kernel

    def _known(self, kernel_id: str) -> _Kernel:
        kernel = self._kernels.get(kernel_id)
        if kernel is None:
            raise KernelStartError(
                f"Dask worker {self.address} does not know kernel {kernel_id[:80]!r}"
                " (it restarted?)",
                node=self.address,
            )
        return kernel


class _Forwarder:
    """An agent listener (on the agent's loop) that sends one env's events to the
    provisioner as Dask events; installer lines in batches."""

    def __init__(self, worker: Worker, topic: str, env_id: str) -> None:
        self.worker = worker
        self.topic = topic
        self.env_id = env_id
        self._lines: dict[str, list[str]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self, event: Event) -> None:
        if event.env_id != self.env_id:
            return
        data = dict(event.data)
        if event.kind == "log":
            self._lines.setdefault(str(data.get("step", "")), []).append(str(data.get("line", "")))
            if self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(LOG_BATCH_SECONDS, self.flush)
            return
        self.flush()
        message: dict[str, Any] = {"kind": event.kind, "env_id": self.env_id}
        if event.kind == "state":
            message["state"] = str(data.get("state", ""))
            if isinstance(data.get("error"), dict):
                message["message"] = str(data["error"].get("message", ""))[:500]
        else:
            message["step"] = str(data.get("step", ""))
            message["status"] = str(data.get("status", ""))
            if isinstance(data.get("label"), str):
                message["label"] = data["label"]
        self._send(message)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        lines, self._lines = self._lines, {}
        for step, batch in lines.items():
            self._send({"kind": "log", "env_id": self.env_id, "step": step, "lines": batch[-200:]})

    def _send(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # progress is best effort; the build is not
            self.worker.log_event(self.topic, message)


async def _listen(node: NodeAgent, forwarder: _Forwarder) -> Callable[[], None]:
    return node.agent.add_listener(forwarder)


async def _unlisten(unlisten: Callable[[], None], forwarder: _Forwarder) -> None:
    unlisten()
    forwarder.flush()


def _holder(kernel_id: str) -> str:
    return f"kernel:{kernel_id}"


def _running(kernel: _Kernel) -> bool:
    return kernel.proc is not None and kernel.proc.poll() is None


def _one_line(error: BuildError) -> str:
    text = f"{error.step}: {error.message}" if error.step else error.message
    last = next((line.strip() for line in reversed(error.output_tail) if line.strip()), "")
    text = " ".join(text.split())
    return f"{text} (last output: {last})" if last else text


def _node_ip(address: str) -> str:
    """The IP address the node's Dask worker listens on: where the kernel binds."""
    host = get_address_host(address)
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to a file only its owner may read (replacing any old one)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def _bound_ports(connection_file: Path) -> dict[str, int] | None:
    """The ports ipykernel wrote back once it bound them all, else ``None``."""
    try:
        data = json.loads(connection_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # being rewritten: look again
    ports = {name: int(data.get(name) or 0) for name in _PORTS}
    return ports if all(ports.values()) else None


def _free(host: str, ports: Mapping[str, int]) -> bool:
    """Whether every one of ``ports`` can be bound on ``host`` now (a restart keeps them)."""
    sockets = []
    try:
        for port in ports.values():
            sock = socket.socket()
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, int(port)))
        return True
    except OSError:
        return False
    finally:
        for sock in sockets:
            sock.close()


def _kill_tree(pid: int, known: set[int]) -> None:
    """SIGKILL the kernel's group, its descendants and ``known``; any may be gone already."""
    import psutil

    targets: set[int] = set(known)
    with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        targets.update(child.pid for child in psutil.Process(pid).children(recursive=True))
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for each in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(each, signal.SIGKILL)


def _tail(path: Path, lines: int = 20) -> list[str]:
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 16384))
            text = log.read().decode(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


def _last_line(path: Path) -> str:
    tail = _tail(path, 1)
    return tail[0].strip()[:300] if tail else ""


# -- what the provisioner runs with Client.run (coroutines on the worker's loop) -----------


def _kernels_of(dask_worker: Worker) -> NodeKernels:
    kernels = getattr(dask_worker.plugins.get(PLUGIN_NAME), "kernels", None)
    if not isinstance(kernels, NodeKernels):
        raise KernelStartError(
            f"Dask worker {dask_worker.address} has no kernel plugin", node=str(dask_worker.address)
        )
    return kernels


async def node_kernel_load(token: str, dask_worker: Worker) -> dict[str, Any]:
    return await _kernels_of(dask_worker).load(token)


async def node_kernel_build(
    kernel_id: str, token: str, topic: str, dask_worker: Worker
) -> dict[str, Any]:
    return await _kernels_of(dask_worker).build(kernel_id, token, topic)


async def node_kernel_start(
    kernel_id: str,
    argv: list[str],
    env: dict[str, str],
    start_timeout: float,
    dask_worker: Worker,
) -> dict[str, Any]:
    return await _kernels_of(dask_worker).start(kernel_id, argv, env, start_timeout)


async def node_kernel_signal(kernel_id: str, signum: int, dask_worker: Worker) -> bool:
    return await _kernels_of(dask_worker).signal(kernel_id, signum)


async def node_kernel_poll(kernel_id: str, dask_worker: Worker) -> dict[str, Any]:
    kernels = getattr(dask_worker.plugins.get(PLUGIN_NAME), "kernels", None)
    if not isinstance(kernels, NodeKernels):
        return {"exit": -1, "known": False}
    return await kernels.poll(kernel_id)


async def node_kernel_stop(kernel_id: str, forget: bool, dask_worker: Worker) -> None:
    kernels = getattr(dask_worker.plugins.get(PLUGIN_NAME), "kernels", None)
    if isinstance(kernels, NodeKernels):
        await kernels.stop(kernel_id, forget=forget)


async def node_kernel_info(dask_worker: Worker) -> dict[str, Any]:
    kernels = getattr(dask_worker.plugins.get(PLUGIN_NAME), "kernels", None)
    return kernels.info() if isinstance(kernels, NodeKernels) else {}
