"""Process groups the agent starts (installers, build backends and their children).

Who calls it: ``ResourceBuild.run`` (``started``/``ended`` around every command), the
agent's ``stop``, the CLI's and the server's signal paths (``kill_live``), ``atexit``, and
``Cache.sweep`` (``orphans_to_end`` at the next start).

Every command a plugin runs starts a new session, so it is the leader of its own process
group and a signal to the agent does not reach it. Each group is therefore recorded twice:

- in memory, process-wide (``LIVE``), so that a signal handler or ``atexit`` can end every
  group at once, without a loop or a database;
- in the cache's index (``pgroups``), with the owner's pid and start time and the leader's
  start time, so that after the owner was SIGKILLed the next agent opening the cache ends
  the groups of owners that are gone, before it sweeps ``tmp/``.

Pids are recycled: a group is only signalled if it is still the one we started. While the
leader lives, its start time must match the record. Once the leader is gone, a pgid cannot
be given to a new process while any member of the old group lives, so remaining members
are ours. An owner counts as alive when a process with its pid and start time exists;
two live agents (a server and a CLI) share a cache and never end each other's groups.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading

__all__ = [
    "LIVE",
    "LiveGroups",
    "end_group",
    "owner_alive",
    "self_identity",
    "start_time",
]


#: Linux's /proc, read directly: ``import psutil`` was ~12 ms of every agent's start here.
_PROC = os.path.isdir("/proc/self")
_boot: float | None = None


def start_time(pid: int) -> float | None:
    """The process's start time (seconds since the epoch), None if there is no such process:
    psutil's ``create_time``, to the same float (records other processes wrote are compared
    with it), read from ``/proc/<pid>/stat`` where there is one."""
    if not _PROC:
        return _psutil_start_time(pid)
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except PermissionError:
        return 0.0  # exists, not ours to inspect
    # After the command's ")" (its name may hold spaces and parentheses): the state is field
    # 3 of proc(5), the start time in clock ticks since boot field 22.
    return float(fields[19]) / os.sysconf("SC_CLK_TCK") + _boot_time()


def _boot_time() -> float:
    """``btime`` of /proc/stat, as psutil's ``boot_time`` reads it (fixed while the machine
    runs: read once)."""
    global _boot
    if _boot is None:
        with open("/proc/stat", "rb") as stat:
            line = next(line for line in stat if line.startswith(b"btime"))
        _boot = float(line.split()[1])
    return _boot


def _psutil_start_time(pid: int) -> float | None:
    import psutil  # no /proc: another system

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return 0.0


def _same(a: float | None, b: float) -> bool:
    # create_time is derived from clock ticks since boot: stable for one process, to ~10 ms.
    return a is not None and abs(a - b) < 0.05


_self: tuple[int, float] | None = None


def self_identity() -> tuple[int, float]:
    """(pid, start time) of this process; recomputed after a fork."""
    global _self
    if _self is None or _self[0] != os.getpid():
        _self = (os.getpid(), start_time(os.getpid()) or 0.0)
    return _self


def owner_alive(pid: int, started: float) -> bool:
    """Whether the agent process recorded as (pid, start time) still runs."""
    if pid == os.getpid():
        return _same(self_identity()[1], started)
    return _same(start_time(pid), started)


def _pids() -> list[int]:
    if not _PROC:
        import psutil

        return list(psutil.pids())
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _members(pgid: int) -> list[int]:
    members = []
    for pid in _pids():
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pgid:
                members.append(pid)
    return members


def end_group(pgid: int, started: float | None) -> bool:
    """SIGKILL process group ``pgid`` if it is still the one whose leader started at
    ``started`` (None: trust the pgid, for groups this process is sure it owns). Returns
    whether a signal was sent."""
    if started is not None:
        leader = start_time(pgid)
        if leader is not None and not _same(leader, started):
            return False  # the pid was recycled: someone else's process
        if leader is None and not _members(pgid):
            return False  # all gone
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class LiveGroups:
    """The groups this process started and has not seen end (thread- and signal-safe)."""

    def __init__(self) -> None:
        self._groups: dict[int, float | None] = {}
        self._lock = threading.RLock()  # re-entrant: kill_all may run inside a signal handler
        self._hooked = False

    def add(self, pgid: int, started: float | None = None) -> None:
        with self._lock:
            self._groups[pgid] = started
            if not self._hooked:
                atexit.register(self.kill_all)
                self._hooked = True

    def remove(self, pgid: int) -> None:
        with self._lock:
            self._groups.pop(pgid, None)

    def pgids(self) -> list[int]:
        with self._lock:
            return list(self._groups)

    def kill_all(self) -> list[int]:
        """End every group still recorded; returns those signalled. Safe in a signal
        handler's callback and at exit (no loop, no database)."""
        with self._lock:
            groups = dict(self._groups)
            self._groups.clear()
        return [pgid for pgid, started in groups.items() if end_group(pgid, started)]


#: This process's live groups (one per process: signals and atexit are process-wide).
LIVE = LiveGroups()
