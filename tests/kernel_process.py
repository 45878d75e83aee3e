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

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager


@contextmanager
def kernel_manager() -> Iterator[KernelManager]:
    """A ``python3`` kernel manager whose channels are unix sockets in a directory of their
    own (removed after the block). Not TCP: jupyter_client picks free ports by binding port 0
    and closing it, and under load another process can take one before the kernel binds it
    ('Address already in use': the kernel dies before replying to kernel_info)."""
    sockets = tempfile.mkdtemp(prefix="kernel-")  # short: a socket path fits in 107 bytes
    try:
        yield KernelManager(
            kernel_name="python3",
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[]),
            transport="ipc",
            ip=os.path.join(sockets, "channel"),
            connection_file=os.path.join(sockets, "kernel.json"),
        )
    finally:
        shutil.rmtree(sockets, ignore_errors=True)


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
