"""A kernel's process on a Dask node: its private files, its start, its end.

Who calls it: ``node_kernels.NodeKernels`` (on the Dask worker, in threads: everything here
blocks). The connection file names the node's address, a key made on the node and ports 0
(or the kernel's previous ports on a restart, when they are free): ipykernel binds free
ports on that address itself and writes them back, so the ports are chosen on the node with
no race between choosing and binding. The file and its directory are owner-only; the key
is never logged.
"""

from __future__ import annotations

import contextlib
import json
import os
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

from distributed.comm.addressing import get_address_host

from ..context import EnvContext, process_env
from ..errors import KernelStartError
from ..kernels.command import kernel_command

#: Variables of the Dask worker a kernel must not inherit (the server's, a parent's pid).
_SCRUBBED = ("JUPYTER_RUNTIMEENV_URL", "JUPYTER_RUNTIMEENV_TOKEN", "JPY_PARENT_PID")
PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
#: In a kernel's directory: the pid of the Dask worker that started it (see ``sweep``).
OWNER_FILE = "owner"
#: How long a stopped kernel's processes get to disappear after SIGKILL.
KILL_GRACE = 10.0


@dataclass(eq=False)
class NodeKernel:
    """One kernel id on this node: its env reference, directory and (while it runs) process.
    Survives a restart (same key, its ports preferred); forgotten at shutdown."""

    kernel_id: str
    topic: str
    directory: Path
    key: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)
    #: The kernel's CurveZMQ key pair (public, secret), made on the node when asked for.
    curve: tuple[str, str] | None = field(default=None, repr=False)
    ctx: EnvContext | None = None
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None
    pids: set[int] = field(default_factory=set)
    #: Ids of the ``DaskExecutor``s the kernel made (their pools on every node end with it).
    owners: set[str] = field(default_factory=set)
    #: Seconds the kernel lives without word from its provisioner (0: forever), and when
    #: that word last came (``time.monotonic``): a server that died leaves no kernel.
    lease: float = 0.0
    renewed: float = field(default_factory=time.monotonic)


def running(kernel: NodeKernel) -> bool:
    """Whether the kernel's process runs now."""
    return kernel.proc is not None and kernel.proc.poll() is None


def launch(
    kernel: NodeKernel,
    address: str,
    on_exit: Callable[[NodeKernel, int, int], None],
    host: str,
    argv: list[str],
    variables: dict[str, str],
    start_timeout: float,
    encrypt: bool = False,
) -> dict[str, Any]:
    """Start ``kernel``'s ipykernel in its env; its connection info once it bound its ports
    on ``host``. ``KernelStartError`` naming ``address`` (the node) if it exits first or
    does not come up within ``start_timeout`` s (then it is killed). Blocking.

    ``on_exit(kernel, pid, code)`` is called from the waiter thread that reaps it. With
    ``encrypt``, the kernel gets a CurveZMQ key pair (kept across restarts, like its HMAC
    key): ipykernel then encrypts its channels (jupyter_client's ``transport_encryption``).
    """
    assert kernel.ctx is not None
    ctx = kernel.ctx
    _private_dir(kernel.directory.parent)
    _private_dir(kernel.directory)
    (kernel.directory / OWNER_FILE).write_text(str(os.getpid()), encoding="utf-8")
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
        **{name: ports.get(name, 0) for name in PORTS},
    }
    if encrypt:
        if kernel.curve is None:
            import zmq

            public, secret = zmq.curve_keypair()
            kernel.curve = (public.decode("ascii"), secret.decode("ascii"))
        info["curve_publickey"], info["curve_secretkey"] = kernel.curve
    _write_private(connection_file, json.dumps(info))
    cmd = kernel_command(ctx, [a.replace("{connection_file}", str(connection_file)) for a in argv])
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
        target=_reap, args=(kernel, proc, on_exit), name=f"kernel-{proc.pid}", daemon=True
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
                f" worker {address}: {last_line(log_path)}",
                node=address,
                detail=tail(log_path),
            )
        if time.monotonic() > deadline:
            kill_tree(proc.pid, {proc.pid})
            raise KernelStartError(
                f"the kernel did not come up within {start_timeout:g} s on Dask worker"
                f" {address}: {last_line(log_path) or 'no output'}",
                node=address,
                detail=tail(log_path),
            )
        time.sleep(0.05)
    return {
        "connection": {**info, **bound},
        "pid": proc.pid,
        "node": address,
        "env_id": ctx.env_id,
    }


def _reap(
    kernel: NodeKernel,
    proc: subprocess.Popen[bytes],
    on_exit: Callable[[NodeKernel, int, int], None],
) -> None:
    """The kernel's waiter thread: reaps it (the Dask worker is its parent) and reports."""
    code = proc.wait()
    if kernel.proc is proc:
        kernel.exit_code = code
    on_exit(kernel, proc.pid, code)


def kill(kernel: NodeKernel) -> None:
    """SIGKILL the kernel, its group and every process it started; reap it. Blocking."""
    proc = kernel.proc
    if proc is not None:
        kill_tree(proc.pid, kernel.pids)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=KILL_GRACE)
        kernel.exit_code = proc.returncode
        kernel.proc = None
    kernel.pids.clear()


def node_ip(address: str) -> str:
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
    ports = {name: int(data.get(name) or 0) for name in PORTS}
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


def kill_tree(pid: int, known: set[int]) -> None:
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


def tail(path: Path, lines: int = 20) -> list[str]:
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 16384))
            text = log.read().decode(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


def last_line(path: Path) -> str:
    lines = tail(path, 1)
    return lines[0].strip()[:300] if lines else ""


def sweep(kernels_dir: Path) -> list[str]:
    """Remove the directories of kernels whose Dask worker is gone (it died with them: a
    crash leaves their connection files behind). Kernels of live workers sharing this cache
    root are left alone. The kernel ids removed. Blocking."""
    import psutil

    removed: list[str] = []
    try:
        entries = list(kernels_dir.iterdir())
    except OSError:
        return removed
    for entry in entries:
        try:
            owner = int((entry / OWNER_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            owner = 0  # never started, or not ours: nothing can be using it
        if owner and psutil.pid_exists(owner):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry.name)
    return removed
