"""How many tasks the machine's CPUs have to run: the kernel's count of runnable tasks.

Read from ``/proc/loadavg``'s fourth field (``"0.10 0.20 0.30 2/123 4567"``: 2 runnable of
123), the count at this instant, the reader among them (the load averages lag by seconds).
One reader for every caller; each caller states its own rule where it asks:

- ``plugins/_spares`` lays a spare tree out soon after a build when the build waited for a
  CPU less than a quarter of its time (``cpu_waits()`` at its start and end), or where the
  kernel keeps no such count, when ``runnable()`` is below ``cpus()`` as the build ends;
- ``workers/protocol.Spin`` polls for a peer's next frame only while no task would wait for
  the CPU it takes (through a ``Gauge``: read at most every ``EVERY`` seconds per process,
  and sooner after a count that rose, so that a task woken for an instant does not stop the
  polling for ``EVERY``). The driver reads it; its workers are told with each call.

It imports only the standard library.
"""

from __future__ import annotations

import os

#: Linux's; elsewhere the count is unknown (``None``) and every caller takes it as busy.
LOADAVG = "/proc/loadavg"
#: The kernel's CPU pressure stall information (Linux 4.20+); elsewhere ``cpu_waits`` is None.
PSI = "/proc/pressure/cpu"
#: How long a ``Gauge`` keeps a count at most (seconds).
EVERY = 0.02
#: How soon a ``Gauge`` reads again a count that rose (or its first after a pause).
RECHECK = 0.001


def runnable(path: str = LOADAVG) -> int | None:
    """The kernel's count of runnable tasks at this instant (the caller's thread among them),
    ``None`` where ``path`` cannot be read or parsed. A read is ~3 us here."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 256)
        finally:
            os.close(fd)
        return int(data.split()[3].partition(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None


def cpu_waits() -> int | None:
    """Microseconds, since boot, in which a runnable task waited for a CPU (``PSI``'s
    ``some total``); None where the kernel does not keep it."""
    try:
        with open(PSI, "rb") as f:
            return int(f.readline().split(b"total=")[1])
    except (OSError, ValueError, IndexError):
        return None


def cpus() -> int:
    """The CPUs this process may run on (its affinity, where the system has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return len(affinity(0))
    return os.cpu_count() or 1


class Gauge:
    """``runnable()`` for a caller that asks on every wait (thousands of times a second):
    ``least(now)`` is the lowest of the latest count and the two read before it (those of
    them that are recent: within ``2 * EVERY``), read again ``RECHECK`` after a count above
    the lowest of those two (or the first after a pause), and after one that was not twice as
    long after it as the time before, up to ``EVERY``.

    Why three: the count is of one instant, and on a quiet machine the instant often holds a
    task woken for a few microseconds (a kernel worker, a timer, a thread of our own), which
    no one waits for. A load that lasts is in every count; an instant's is in one, sometimes
    two in a row (``RECHECK`` apart). With the lower of two, a quiet run of ``benchmarks/run.py
    --quick`` still stopped polling for 20-40 of W2's 200 round trips at load ~1 (the lead's
    probe of 2026-12-04 22:05: at those readings the only other runnable task was a kernel
    thread, or none but ours), and W2's median went from ~0.058 to 0.064-0.067 ms. A rise is
    believed at its third reading, ~2 ``RECHECK`` after the first: a lasting load (two
    busy-loop hogs) is seen within ~2 ms of its start, and at once after a pause. Why read
    again soon: a burst of a few milliseconds (a short command) is over before ``EVERY``; a
    load that lasts is read every ``EVERY`` after the first ~30 ms. A quiet run missed W2 when
    the count was read once per ``EVERY``: its then 50 round trips took 4 ms, and the one count
    read at their start was 3 on 2 CPUs (15 runs at load 0.3-4.6: 4 read 3 there, and their
    W2 was 0.07-0.20 ms, the others' 0.043-0.051). On a loaded machine every count is high, so
    is the lowest of three: nothing changes there but a few more reads after each pause.

    Thread-safe: the state is one tuple, replaced whole; two threads may read at once.
    """

    __slots__ = ("_state", "path")

    def __init__(self, path: str = LOADAVG) -> None:
        self.path = path
        #: When read, until when kept, the lowest of the three counts, the latest count, the
        #: one before it and when it was read, the CPUs, how long it was kept.
        self._state: tuple[float, float, int | None, int | None, int | None, float, int, float] = (
            -1.0,
            -1.0,
            None,
            None,
            None,
            -1.0,
            1,
            RECHECK,
        )

    def least(self, now: float) -> tuple[int | None, int]:
        """The lowest of the three latest counts (``None``: unknown) and the CPUs this process
        may use, as read at most ``EVERY`` before ``now`` (``time.perf_counter``)."""
        when, until, least, latest, before, before_when, ncpu, kept = self._state
        if when <= now < until:
            return least, ncpu
        count = runnable(self.path)
        ncpu = cpus()
        # The two counts before this one, those recent enough to weigh against it.
        low = latest if latest is not None and 0 <= now - when <= 2 * EVERY else None
        if before is not None and 0 <= now - before_when <= 2 * EVERY:
            low = before if low is None or before < low else low
        if count is None:
            least, kept = None, EVERY
        elif low is None:  # the first after a pause: believed for ``RECHECK``
            least, kept = count, RECHECK
        elif count > low:  # above one of the two before: maybe an instant's, read again soon
            least, kept = low, RECHECK
        else:
            least, kept = count, min(2 * kept, EVERY)
        self._state = (now, now + kept, least, count, latest, when, ncpu, kept)
        return least, ncpu
