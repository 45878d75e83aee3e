"""Looking at processes from tests, on a machine where they may exit at any moment.

Every question about another process is a race: between ``pid_exists`` and ``Process(pid)``,
between ``children()`` and ``cmdline()``, the process can exit (and be reaped), or its pid
can be taken by another. These helpers ask each question once, inside one ``try``, and
treat a process that vanished at any step (``NoSuchProcess``), or that is a zombie, as gone.
A process we may not inspect (``AccessDenied``) is not ours to wait for: also gone for them.

Imported by tests as ``from processes import alive, wait_gone, ...`` (``tests/`` is on
``sys.path``, like ``wheelhouse``); a name of its own, so it never shadows a folder's
``conftest``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

__all__ = [
    "Proc",
    "alive",
    "children",
    "cmdline",
    "descendants",
    "kill",
    "kill_all",
    "of",
    "survivors",
    "wait_for",
    "wait_gone",
    "worker_children",
]

_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)


def alive(pid: int | psutil.Process) -> bool:
    """Whether ``pid`` runs now: it exists and is not a zombie."""
    try:
        proc = pid if isinstance(pid, psutil.Process) else psutil.Process(pid)
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except _GONE:
        return False


def children(pid: int | None = None, *, recursive: bool = False) -> list[psutil.Process]:
    """The live children of ``pid`` (default: this process); ``[]`` if it is gone."""
    try:
        proc = psutil.Process(os.getpid() if pid is None else pid)
        found = proc.children(recursive=recursive)
    except _GONE:
        return []
    return [child for child in found if alive(child)]


def descendants(pid: int | None = None) -> list[psutil.Process]:
    """The live descendants of ``pid`` (default: this process)."""
    return children(pid, recursive=True)


def cmdline(proc: int | psutil.Process) -> list[str]:
    """The command line of ``proc``; ``[]`` if it is gone or a zombie."""
    try:
        process = proc if isinstance(proc, psutil.Process) else psutil.Process(proc)
        return list(process.cmdline())
    except _GONE:
        return []


#: The last argument of a bootstrap's process that is no worker: a template that forks
#: workers (``workers/zygote.py``), a hash helper a template forked (``plugins/_hashhelp``).
NOT_WORKERS = (["--zygote"], ["--hasher"])


def worker_children() -> list[psutil.Process]:
    """Our live worker processes (children running the bootstrap; not the templates that
    fork workers, nor the hash helpers forked from them)."""
    found = []
    for child in descendants():
        argv = cmdline(child)
        if any(part.endswith("_entry.py") for part in argv) and argv[-1:] not in NOT_WORKERS:
            found.append(child)
    return found


def kill(proc: int | psutil.Process) -> None:
    """SIGKILL ``proc`` if it still runs."""
    try:
        process = proc if isinstance(proc, psutil.Process) else psutil.Process(proc)
        process.kill()
    except _GONE:
        pass


def wait_gone(pids: Iterable[int | psutil.Process], timeout: float = 10.0) -> list[int]:
    """Wait up to ``timeout`` seconds for every process to be gone; returns the pids still
    alive then (empty when all are gone). Tests assert on the result."""
    pending = [p.pid if isinstance(p, psutil.Process) else p for p in pids]
    deadline = time.monotonic() + timeout
    while True:
        pending = [pid for pid in pending if alive(pid)]
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(0.02)


def wait_for(condition: Callable[[], object], timeout: float = 30.0, what: str = "") -> None:
    """Poll ``condition()`` until it is true; ``AssertionError`` naming ``what`` after
    ``timeout`` seconds (a bounded wait, never a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or condition}")
        time.sleep(0.02)


# -- by identity: a pid and its start time, so a recycled pid is never taken for ours --------


@dataclass(frozen=True)
class Proc:
    """One process as it was when we saw it."""

    pid: int
    started: float

    @classmethod
    def of(cls, pid: int) -> Proc | None:
        """The process ``pid`` now, or None if there is none."""
        try:
            return cls(pid, psutil.Process(pid).create_time())
        except _GONE:
            return None

    def alive(self) -> bool:
        """Running (not a zombie) and still the same process."""
        try:
            proc = psutil.Process(self.pid)
            return proc.create_time() == self.started and proc.status() != psutil.STATUS_ZOMBIE
        except _GONE:
            return False

    def describe(self) -> str:
        return f"{self.pid} {cmdline(self.pid) or '(gone)'}"


def of(pid: int) -> Proc:
    """The process ``pid``, which must exist."""
    proc = Proc.of(pid)
    assert proc is not None, f"no process {pid}"
    return proc


def survivors(procs: list[Proc], timeout: float) -> list[Proc]:
    """Those of ``procs`` still alive after waiting up to ``timeout`` seconds for all to go."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in procs if p.alive()]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def kill_all(procs: list[Proc]) -> None:
    """A test's own clean-up: SIGKILL whatever of ``procs`` is still alive."""
    for proc in procs:
        if proc.alive():
            kill(proc.pid)
