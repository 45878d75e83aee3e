"""A real ipykernel kernel of this interpreter, driven through jupyter_client.

For tests that need what only a kernel has: widgets (a ``ZMQInteractiveShell`` with comms),
display ids and ``update_display_data``, interrupts. Every message a cell produced on iopub is
returned in order, so a test sees exactly what a frontend would be sent.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import processes
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager


@contextmanager
def kernel_manager() -> Iterator[KernelManager]:
    """A ``python3`` kernel manager whose channels are unix sockets in a directory of their
    own (removed after the block). Not TCP: jupyter_client picks free ports by binding port 0
    and closing it, and under load another process can take one before the kernel binds it
    ('Address already in use': the kernel dies before replying to kernel_info).

    A kernel started with it is shut down when the block ends, and its processes (the
    workers of its pools) are waited for: nbclient given a manager starts its kernel but
    leaves it running, and such kernels, with their workers, stayed children of pytest for
    the rest of a whole-suite run (tests/notebooks)."""
    sockets = tempfile.mkdtemp(prefix="kernel-")  # short: a socket path fits in 107 bytes
    km = KernelManager(
        kernel_name="python3",
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[]),
        transport="ipc",
        ip=os.path.join(sockets, "channel"),
        connection_file=os.path.join(sockets, "kernel.json"),
    )
    try:
        yield km
    finally:
        try:
            stop_kernel(km)
        finally:
            shutil.rmtree(sockets, ignore_errors=True)


def stop_kernel(km: KernelManager, timeout: float = 60) -> None:
    """Shut ``km``'s kernel down if it runs (its pools close as it exits), then wait up to
    ``timeout`` seconds for it and every process it had started; SIGKILL what is left."""
    if not km.has_kernel:
        return
    pid = getattr(km.provisioner, "pid", None)
    kernel = processes.Proc.of(pid) if isinstance(pid, int) else None
    procs = [kernel] if kernel is not None else []
    for child in processes.descendants(pid) if isinstance(pid, int) else []:
        if (proc := processes.Proc.of(child.pid)) is not None:
            procs.append(proc)
    try:
        km.shutdown_kernel()
    finally:
        processes.kill_all(processes.survivors(procs, timeout))


@contextmanager
def running_kernel(
    cwd: Path, env: Mapping[str, str] | None = None
) -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    """A ``python3`` kernel (ipykernel's native spec: this very interpreter) in ``cwd``; shut
    down (now) when the block ends."""
    with kernel_manager() as km:
        km.start_kernel(cwd=str(cwd), env={**os.environ, **(env or {})})
        client = km.blocking_client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            yield km, client
        finally:
            client.stop_channels()
            km.shutdown_kernel(now=True)


def execute(
    client: BlockingKernelClient, code: str, timeout: float = 120
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run ``code``; the reply's content and every iopub message of it, in order."""
    messages: list[dict[str, Any]] = []
    reply = client.execute_interactive(code, output_hook=messages.append, timeout=timeout)
    return reply["content"], messages


def of_type(messages: list[dict[str, Any]], *types: str) -> list[dict[str, Any]]:
    return [m for m in messages if m["msg_type"] in types]
