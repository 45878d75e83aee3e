"""The names under which a server records references taken for its kernels.

``kernel:<kernel id>`` is a kernel's own holder (the provisioner's); ``kernel:<kernel
id>/<kind>:<pid>:...`` one a process of that kernel took for itself (a pool, ``ServerClient``).
The server's sweep reads them back to release what a dead kernel or process held.
"""

from __future__ import annotations

import re

import psutil

KERNEL_HOLDER_PREFIX = "kernel:"


def kernel_holder(kernel_id: str) -> str:
    """The holder under which references taken for kernel ``kernel_id`` are recorded."""
    return f"{KERNEL_HOLDER_PREFIX}{kernel_id}"


def holds_for_kernel(holder: str, kernel_id: str) -> bool:
    base = kernel_holder(kernel_id)
    return holder == base or holder.startswith(base + "/")


#: ``<kind>:<pid>:...``: a holder a kernel's process took for itself (see ``ServerClient``).
_PROCESS_HOLDER = re.compile(r"(?P<kind>[A-Za-z_][A-Za-z0-9_.-]*):(?P<pid>[0-9]{1,10}):")


def holder_process(holder: str, kernel_id: str) -> int | None:
    """The pid of the kernel process that took ``holder`` (``kernel:<id>/pool:<pid>:...``);
    None for the kernel's own holder and for holders that name no process."""
    base = kernel_holder(kernel_id) + "/"
    if not holder.startswith(base):
        return None
    found = _PROCESS_HOLDER.match(holder, len(base))
    return int(found.group("pid")) if found else None


def process_gone(pid: int) -> bool:
    """Whether ``pid`` is gone (a zombie is gone; one we may not look at is not)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, ValueError):
        return True
    except psutil.AccessDenied:
        return False
