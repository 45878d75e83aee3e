"""The kernel's report to the Jupyter server: its worker pools and its declared environment.

In a kernel that uses the server's agent (``JUPYTER_RUNTIMEENV_URL`` is set and the kernel id
is known), a daemon thread POSTs ``kernels/{kernel id}`` whenever a pool changes (a worker
starts or dies, a task starts or ends, the default env changes; changes within
``debounce`` seconds are sent as one), and every ``interval`` seconds while there are
workers (their memory changes). The server drops the report when the kernel stops. Nothing
is sent when nothing changed; a failed POST is retried at the next change or interval, and
never reaches the notebook (the sidebar is an observer).

Who calls it: the public API calls ``install()`` once; from then on the reporter hears of
changes by observing the session (``session.observe``) and the pools (``pool.observe``):
nothing below reaches up to notify it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any

from .. import session
from .cluster import ClusterExecutor
from .commands import ensure_poller
from .pool import live_pools, observe

log = logging.getLogger(__name__)

_reporter: Reporter | None = None
_client: Any = None  # the ServerClient the reporter posts with
_disabled = False  # not a kernel of a server with the extension: never report
_installed = False
_lock = threading.Lock()


def rss_of(pid: int) -> int | None:
    """Resident memory of ``pid`` in bytes: psutil if installed, else ``/proc``; None if
    neither can tell."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            return int(psutil.Process(pid).memory_info().rss)
        except Exception:  # gone, or not ours to read
            return None
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as file:
            return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class CpuMeter:
    """Percent of one core each process used since the last look; at the first look, since
    the process started (a worker first seen busy shows its CPU at once, not one report
    interval later). None when it cannot be read (gone, not ours) or the process is too
    young to say (its start time has the kernel's clock-tick resolution)."""

    #: A first look at a process younger than this says nothing (seconds).
    MIN_AGE = 0.1

    def __init__(self) -> None:
        self._seen: dict[int, tuple[float, float]] = {}

    def percent(self, pid: int) -> float | None:
        try:
            import psutil

            process = psutil.Process(pid)
            times = process.cpu_times()
            started = None if pid in self._seen else process.create_time()
        except Exception:  # gone between the report's pids and now, or no psutil
            self._seen.pop(pid, None)
            return None
        used, now = float(times.user + times.system), time.monotonic()
        before = self._seen.get(pid)
        self._seen[pid] = (used, now)
        if before is None:
            age = time.time() - started if started is not None else 0.0
            return _share(used, age) if age >= self.MIN_AGE else None
        if now <= before[1]:
            return None
        return _share(used - before[0], now - before[1])

    def forget_except(self, pids: set[int]) -> None:
        for pid in [p for p in self._seen if p not in pids]:
            del self._seen[pid]


def _share(used: float, elapsed: float) -> float:
    return round(max(0.0, 100.0 * used / elapsed), 1)


_cpu = CpuMeter()
#: (session generation, sys.path) -> declared envs: resolving an env id may hash a
#: working_dir, too slow to repeat every few seconds for what rarely changes.
_declared_cache: tuple[Any, list[dict[str, Any]]] | None = None


def _declared() -> list[dict[str, Any]]:
    global _declared_cache
    from .envs import declared_envs

    key = (session.generation(), tuple(sys.path))
    if _declared_cache is None or _declared_cache[0] != key:
        try:
            _declared_cache = (key, declared_envs())
        except Exception as exc:  # a spec that no longer resolves: say nothing of it
            log.debug("declared envs not reported: %s", exc)
            _declared_cache = (key, [])
    return _declared_cache[1]


def snapshot() -> dict[str, Any]:
    """The report as it would be sent now."""
    pools = []
    pids: set[int] = set()
    for pool in live_pools():
        stats = pool.stats()
        if not stats["env_id"]:
            continue  # still waiting for its env: nothing to show yet
        workers: Any = stats["workers"]
        for worker in workers:
            worker["rss"] = rss_of(worker["pid"])
            worker["cpu"] = _cpu.percent(worker["pid"])
            pids.add(worker["pid"])
        pools.append(stats)
    _cpu.forget_except(pids)
    spec = session.default_runtime_env()
    return {
        "pools": pools,
        "declared": _declared(),
        "runtime_env": spec.to_json() if spec is not None else None,
        "cwd": os.getcwd(),
        "cluster": cluster_section(),
    }


#: The least time between two looks at a cluster (each asks every node).
CLUSTER_SECONDS = 1.0
_cluster_seen: tuple[int, float, dict[str, Any] | None] | None = None
_observed: set[int] = set()


def cluster_section() -> dict[str, Any] | None:
    """The session executor's cluster as the report shows it (``None`` when it runs on no
    cluster): asked of the nodes at most every ``CLUSTER_SECONDS``; the last answer when the
    cluster cannot be asked now. Starts observing that executor (its tasks' changes wake the
    reporter) and, in a kernel of a server, the sidebar's commands for it."""
    global _cluster_seen
    executor = session.executor()
    if not isinstance(executor, ClusterExecutor):
        return None
    if id(executor) not in _observed:
        _observed.add(id(executor))
        executor.observe(notify)
    client = _client
    if client is not None:
        ensure_poller(client.commands_sync, client.answer_sync, _cluster_executor)
    seen = _cluster_seen
    now = time.monotonic()
    if seen is not None and seen[0] == id(executor) and now - seen[1] < CLUSTER_SECONDS:
        return seen[2]
    try:
        section: dict[str, Any] | None = executor.cluster_report()
    except Exception as exc:  # the scheduler is unreachable now: the last look stands
        log.debug("runtime env cluster not reported: %s", exc)
        section = seen[2] if seen is not None and seen[0] == id(executor) else None
    _cluster_seen = (id(executor), now, section)
    return section


def _cluster_executor() -> ClusterExecutor | None:
    executor = session.executor()
    return executor if isinstance(executor, ClusterExecutor) else None


class Reporter:
    """The reporting thread. ``post(report)`` sends one report (raises on failure)."""

    def __init__(self, post: Any, *, interval: float = 5.0, debounce: float = 0.2) -> None:
        self._post = post
        self.interval = interval
        self.debounce = debounce
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last: Any = None
        self._thread = threading.Thread(target=self._run, name="runtimeenv-report", daemon=True)
        self._thread.start()

    def notify(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            woken = self._wake.wait(self.interval)
            if self._stop.is_set():
                return
            if woken:
                self._stop.wait(self.debounce)  # gather a burst of changes into one report
            self._wake.clear()
            report = snapshot()
            if report == self._last:
                continue
            if not woken and not report["pools"] and not report["cluster"] and self._last:
                continue  # periodic: only memory changes, and there are no workers
            try:
                self._post(report)
            except Exception as exc:
                log.debug("runtime env report not sent: %s", exc)
                continue
            self._last = report


def install() -> None:
    """Report from now on: observe the session and the pools. Idempotent and cheap (the
    reporter itself starts at the first change, and only in a kernel of a server)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    session.observe(notify)
    observe(notify)


def notify() -> None:
    """Something a report shows changed. Starts the reporter on first use in a kernel that
    uses the server's agent; elsewhere a no-op. Cheap: called from pools' threads."""
    reporter = _reporter
    if reporter is not None:
        reporter.notify()
    elif not _disabled:
        _start()


def _start() -> None:
    global _reporter, _disabled, _client
    from ..client import URL_ENV_VAR, get_client

    with _lock:
        if _reporter is not None or _disabled:
            return
        # Only a kernel of a server reports; anything else never creates a client here, and
        # never imports the server's client: a process without a server pays nothing for it.
        if not os.environ.get(URL_ENV_VAR):
            _disabled = True
            return
        from ..server.client import ServerClient, current_kernel_id

        client = get_client() if current_kernel_id() is not None else None
        if not isinstance(client, ServerClient) or not client.kernel_id:
            _disabled = True
            return
        reporter = _reporter = Reporter(client.report_sync)
        _client = client
    reporter.notify()
