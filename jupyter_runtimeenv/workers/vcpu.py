"""Keeping a worker that a caller polls for off the caller's own vCPU.

Where the kernel packs woken tasks onto busy vCPUs (this project's VM: ``sched_vcpu_pack``),
a worker woken by a call is often queued on the very vCPU of the thread that sent it, and
that thread then polls for the answer (``protocol.Spin``) while the worker waits behind it
for the whole window. Both ends on one vCPU, a round trip is their work in series (~130 us
against ~60 polled on two vCPUs), and while both poll, 200-470 us (docs/benchmarks.md, W2
in session 12: pinned to two vCPUs every cycle's median was 58-67 us; unpinned half were
above 84). ``part`` moves the worker off the caller's vCPU once: its affinity without that
CPU, then as it was (the kernel moves a queued task at once, and does not move it back).
Called by ``answers.Answers`` only when a poll is late, the call was sent while the worker
still polled for it (``protocol.Spin.wait``: a sleeping worker's wake-up is late anyway), and
the worker has not even started the call (its status word): it runs no task code then, so
its mask is not being changed by one. Linux only; anything that fails leaves the worker
where it was.
"""

from __future__ import annotations

import contextlib
import os

#: This thread's ``stat`` (its 39th field: the CPU it last ran on, i.e. now).
_STAT = "/proc/thread-self/stat"


def current_cpu() -> int | None:
    """The CPU this thread runs on, None where it cannot be told."""
    try:
        with open(_STAT, "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2 :].split()[36])
    except (OSError, ValueError, IndexError):
        return None


def part(pid: int, cpu: int | None = None) -> bool:
    """Move process ``pid``'s main thread off ``cpu`` (default: this thread's) if its
    affinity allows another CPU, leaving its affinity as it was; whether it was moved."""
    get = getattr(os, "sched_getaffinity", None)
    put = getattr(os, "sched_setaffinity", None)
    if get is None or put is None:
        return False
    if cpu is None:
        cpu = current_cpu()
        if cpu is None:
            return False
    try:
        mask = get(pid)
    except OSError:
        return False
    if cpu not in mask or len(mask) < 2:
        return False
    try:
        put(pid, mask - {cpu})
    except OSError:
        return False
    finally:  # as it was, also after an interrupt between the two
        with contextlib.suppress(OSError):  # it exited meanwhile
            put(pid, mask)
    return True
