"""What kernels report to the server: their worker pools and their declared environment.

Kernels that use the server's agent POST a report whenever their pools change (and every few
seconds while they have workers, for memory): ``KernelReports`` keeps the last report of each
running kernel, publishes a ``workers`` event on every change, and drops a kernel's report when
the kernel shuts down or dies (the same moments its env references are released). The sidebar
reads them to show workers under their env, and to save a kernel's declared env into its
notebook.

A worker may be stopped from the sidebar: the server cannot call into the kernel, so it kills
the worker's process itself (same user). A report is the kernel's word, and a kernel (any
code in it) can forge one; so only a process that is a worker of that kernel is killed: a pid
the kernel reported, whose parent is the kernel's process (where ``/proc`` tells), whose
command line is our worker bootstrap (``workers/_entry.py``) started for that kernel
(``--parent <kernel pid>``), and, when the report gives it, whose start time is the reported
one (not a recycled pid). The signal goes through a pidfd opened before those checks, so
the process checked is the process killed. The kernel's pool sees the worker die and fails
or replaces its task as for any dead worker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from ..errors import RuntimeEnvError, SpecError
from ..spec.ids import is_env_id
from ..spec.parse import check_plain
from ..spec.policy import DEFAULT_MAX_DEPTH
from ..workers import stops

WORKERS_SCHEMA_ID = "https://events.jupyter.org/jupyter_runtimeenv/workers/v1"
WORKERS_SCHEMA_PATH = Path(__file__).parent / "event_schemas" / "workers" / "v1.yaml"

MAX_POOLS = 64
MAX_WORKERS_PER_POOL = 1024
MAX_DECLARED = 64
MAX_NAME = 200
#: Workers in one report, all pools together: a report is published to every subscriber of
#: the events socket, so its size is bounded (with the body: ``MAX_REPORT_BYTES``).
MAX_WORKERS = 1024
MAX_REPORT_BYTES = 256 * 1024
_MAX_TEXT = 4096
_WORKER_KEYS = {"pid": int, "busy": bool, "tasks_done": int, "tasks_failed": int}


class ReportError(RuntimeEnvError, ValueError):
    """A kernel's report is malformed: names the field."""


def validate_report(data: Any) -> dict[str, Any]:
    """The report with only the fields we know, checked; ``ReportError`` naming the field."""
    if not isinstance(data, dict):
        raise ReportError("report: expected a JSON object")
    pools = data.get("pools", [])
    if not isinstance(pools, list) or len(pools) > MAX_POOLS:
        raise ReportError(f"pools: expected a list of at most {MAX_POOLS} pools")
    clean_pools = [_pool(pool, f"pools[{i}]") for i, pool in enumerate(pools)]
    total = sum(len(pool["workers"]) for pool in clean_pools)
    if total > MAX_WORKERS:
        raise ReportError(f"pools: {total} workers in all; at most {MAX_WORKERS} are reported")
    runtime_env = data.get("runtime_env")
    if runtime_env is not None and not isinstance(runtime_env, dict):
        raise ReportError("runtime_env: expected a JSON object or null")
    _plain(runtime_env, "runtime_env")
    cwd = data.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or len(cwd) > _MAX_TEXT):
        raise ReportError(f"cwd: expected a string of at most {_MAX_TEXT} characters")
    return {
        "pools": clean_pools,
        "declared": _declared(data.get("declared")),
        "runtime_env": runtime_env,
        "cwd": cwd,
    }


def _plain(spec: dict[str, Any] | None, where: str) -> None:
    """A spec in a report is depth-limited like a spec: it is parsed (notebook_env) and
    encoded again."""
    if spec is None:
        return
    try:
        check_plain(spec, DEFAULT_MAX_DEPTH)
    except SpecError as exc:
        raise ReportError(f"{where}.{exc}" if exc.field else f"{where}: {exc}") from None


def _declared(value: Any) -> list[dict[str, Any]]:
    """The kernel's declared envs: ``[{"name": str | None, "env_id", "spec"}]``."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_DECLARED:
        raise ReportError(f"declared: expected a list of at most {MAX_DECLARED} environments")
    out = []
    for i, entry in enumerate(value):
        where = f"declared[{i}]"
        if not isinstance(entry, dict):
            raise ReportError(f"{where}: expected a JSON object")
        name = entry.get("name")
        if name is not None and (not isinstance(name, str) or not 0 < len(name) <= MAX_NAME):
            raise ReportError(f"{where}.name: expected a name of 1 to {MAX_NAME} characters")
        env_id = entry.get("env_id")
        if not isinstance(env_id, str) or not is_env_id(env_id):
            raise ReportError(f"{where}.env_id: expected an env id (64 hex digits)")
        spec = entry.get("spec")
        if spec is not None and not isinstance(spec, dict):
            raise ReportError(f"{where}.spec: expected a JSON object or null")
        _plain(spec, f"{where}.spec")
        out.append({"name": name, "env_id": env_id, "spec": spec})
    return out


def _task(value: Any, where: str) -> dict[str, Any] | None:
    """What a busy worker runs: ``{"name", "started"}`` (epoch seconds), or null."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ReportError(f"{where}: expected a JSON object or null")
    name, started = value.get("name"), value.get("started")
    if not isinstance(name, str):
        raise ReportError(f"{where}.name: expected a string")
    if not isinstance(started, (int, float)) or isinstance(started, bool) or started < 0:
        raise ReportError(f"{where}.started: expected epoch seconds")
    return {"name": name[:MAX_NAME], "started": float(started)}


def _number(value: Any) -> bool:
    # bool is an int: true is not a number here; NaN and infinities never pass strict JSON.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _pool(pool: Any, where: str) -> dict[str, Any]:
    if not isinstance(pool, dict):
        raise ReportError(f"{where}: expected a JSON object")
    env_id = pool.get("env_id")
    if not isinstance(env_id, str) or not env_id or len(env_id) > 200:
        raise ReportError(f"{where}.env_id: expected a non-empty string (at most 200 characters)")
    workers = pool.get("workers", [])
    if not isinstance(workers, list) or len(workers) > MAX_WORKERS_PER_POOL:
        raise ReportError(f"{where}.workers: expected a list of at most {MAX_WORKERS_PER_POOL}")
    clean = []
    for j, worker in enumerate(workers):
        if not isinstance(worker, dict):
            raise ReportError(f"{where}.workers[{j}]: expected a JSON object")
        item: dict[str, Any] = {}
        for key, kind in _WORKER_KEYS.items():
            value = worker.get(key, kind())
            # bool is an int: a pid or a count must be a real int, busy a real bool.
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ReportError(f"{where}.workers[{j}].{key}: expected {kind.__name__}")
            item[key] = value
        if item["pid"] <= 1:
            raise ReportError(f"{where}.workers[{j}].pid: expected a process id")
        rss = worker.get("rss")
        if rss is not None and (not isinstance(rss, int) or isinstance(rss, bool) or rss < 0):
            raise ReportError(f"{where}.workers[{j}].rss: expected a byte count or null")
        item["rss"] = rss
        # What the worker is kept for (a %%remote namespace, issue 20 item 4), or null.
        sticky = worker.get("sticky")
        if sticky is not None and not isinstance(sticky, str):
            raise ReportError(f"{where}.workers[{j}].sticky: expected a string or null")
        item["sticky"] = sticky[:200] if sticky is not None else None
        item["task"] = _task(worker.get("task"), f"{where}.workers[{j}].task")
        cpu = worker.get("cpu")
        if cpu is not None and (not _number(cpu) or not 0 <= cpu <= 1e6):
            raise ReportError(f"{where}.workers[{j}].cpu: expected a percentage or null")
        item["cpu"] = None if cpu is None else round(float(cpu), 1)
        started = worker.get("started")
        if started is not None:
            if isinstance(started, bool) or not isinstance(started, (int, float)) or started < 0:
                raise ReportError(f"{where}.workers[{j}].started: expected a start time or null")
            item["started"] = float(started)
        clean.append(item)
    return {
        "env_id": env_id,
        "name": str(pool.get("name", ""))[:200],
        "state": str(pool.get("state", ""))[:40],
        "max_workers": pool.get("max_workers")
        if isinstance(pool.get("max_workers"), int)
        and not isinstance(pool.get("max_workers"), bool)
        else None,
        "workers": clean,
    }


class KernelReports:
    """The last report of each kernel; publishes a workers event on every change.

    Created by ``RuntimeEnvExtension`` with ``emit`` (the event logger's, bound to the schema)
    and ``kernel_pid`` (the process id of a running kernel, or None when it is not running).
    """

    def __init__(
        self,
        emit: Callable[[dict[str, Any]], object],
        kernel_pid: Callable[[str], int | None],
        used: Callable[[list[str]], object] = lambda env_ids: None,
        notes_dir: str | None = None,
    ) -> None:
        self._emit = emit
        #: Where a stop leaves its note for the kernel (``workers/stops.py``); None: no notes.
        self.notes_dir = notes_dir
        self._kernel_pid = kernel_pid
        #: Called with the env ids a report shows tasks ran in since the last one: a use.
        self._used = used
        self._reports: dict[str, dict[str, Any]] = {}

    def put(self, kernel_id: str, report: dict[str, Any]) -> None:
        """Record a kernel's (validated) report; an event when its pools changed.

        The event carries the pools only: the declared env may hold env_vars values, and
        events may be logged by handlers the operator configured; the sidebar reads it over
        REST when it saves it.
        """
        old = self._reports.get(kernel_id)
        self._reports[kernel_id] = {"kernel_id": kernel_id, **report, "updated": time.time()}
        cluster = report.get("cluster")
        declared = _names(report)
        if (
            old is None
            or old["pools"] != report["pools"]
            or _moved(old.get("cluster"), cluster)
            or _names(old) != declared
        ):
            event = {
                "kind": "report",
                "kernel_id": kernel_id,
                "pools": report["pools"],
                "declared": declared,
            }
            if cluster is not None:
                event["cluster"] = cluster
            self._emit(event)
        used = _envs_used(old["pools"] if old else [], report["pools"])
        if used:
            self._used(used)

    def get(self, kernel_id: str) -> dict[str, Any] | None:
        """The kernel's last report (None if it has not reported)."""
        return self._reports.get(kernel_id)

    def all(self) -> list[dict[str, Any]]:
        return list(self._reports.values())

    def drop(self, kernel_id: str) -> bool:
        """Forget a kernel (it stopped): an event saying its workers are gone."""
        if self._reports.pop(kernel_id, None) is None:
            return False
        self._emit({"kind": "gone", "kernel_id": kernel_id, "pools": []})
        return True

    def prune(self, running: set[str]) -> None:
        for kernel_id in [k for k in self._reports if k not in running]:
            self.drop(kernel_id)

    def stop_worker(self, kernel_id: str, pid: int, by: str | None = None) -> None:
        """Kill worker ``pid`` of kernel ``kernel_id``: it must be in the kernel's last report,
        where ``/proc`` tells a child of the kernel's process, and our worker bootstrap
        started for that kernel (``worker_problem``). ``LookupError`` if not. The kernel is
        told it was stopped from the sidebar (by user ``by``), not killed."""
        report = self._reports.get(kernel_id)
        entries = [
            w
            for pool in (report or {"pools": []})["pools"]
            for w in pool["workers"]
            if w["pid"] == pid
        ]
        if not entries:
            raise LookupError(f"kernel {kernel_id} reported no worker with pid {pid}")
        kernel_pid = self._kernel_pid(kernel_id)
        if kernel_pid is None:
            raise LookupError(f"kernel {kernel_id} has no local process: cannot check pid {pid}")
        with _ProcessHandle(pid) as handle:
            parent = parent_pid(pid)
            if parent is None:
                raise LookupError(f"no process {pid}: the worker has already stopped")
            if parent not in (kernel_pid, -1):  # -1: no /proc to tell
                raise LookupError(f"process {pid} is not a worker of kernel {kernel_id}")
            problem = worker_problem(pid, kernel_pid, entries[0].get("started"))
            if problem is not None:
                raise LookupError(f"process {pid} is not a worker of kernel {kernel_id}: {problem}")
            if self.notes_dir is not None:
                with contextlib.suppress(OSError):  # without its note it reads as a SIGKILL
                    stops.leave(self.notes_dir, pid, stopped_reason(by))
            try:
                handle.kill()
            except LookupError:
                if self.notes_dir is not None:
                    stops.withdraw(self.notes_dir, pid)
                raise


#: The worker bootstrap every worker process runs (``workers/process.py``).
_ENTRY = os.path.join("jupyter_runtimeenv", "workers", "_entry.py")


def worker_problem(pid: int, kernel_pid: int, started: float | None = None) -> str | None:
    """Why ``pid`` is not a worker started by the kernel ``kernel_pid``; None if it is one.
    A process that vanishes at any step is "already stopped"."""
    try:
        proc = psutil.Process(pid)
        cmdline = proc.cmdline()
        created = proc.create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return "it has already stopped"
    except psutil.AccessDenied:
        return "it cannot be inspected"
    if not any(arg.endswith(_ENTRY) for arg in cmdline):
        return "its command line is not the worker bootstrap"
    try:
        parent_arg = cmdline[cmdline.index("--parent") + 1]
    except (ValueError, IndexError):
        return "its command line names no parent"
    if parent_arg != str(kernel_pid):
        return f"it was started for process {parent_arg[:20]}, not for the kernel"
    # Both sides read it as psutil does (start ticks + /proc/stat's btime, whole seconds that
    # a clock adjustment may move by one between the kernel's read and ours): a recycled pid
    # started later than that, by the time its pid came round again.
    if started is not None and abs(created - started) > 1.5:
        return "its start time is not the reported one (a recycled pid)"
    return None


class _ProcessHandle:
    """A pidfd for ``pid`` (Linux), opened before the checks: ``kill`` signals the process
    that was checked, never a process that took its pid meanwhile. Elsewhere ``os.kill``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None

    def __enter__(self) -> _ProcessHandle:
        opener = getattr(os, "pidfd_open", None)
        if opener is not None:
            try:
                self.fd = opener(self.pid)
            except ProcessLookupError:
                raise LookupError(
                    f"no process {self.pid}: the worker has already stopped"
                ) from None
            except OSError:
                self.fd = None  # pidfds unsupported here: os.kill below
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def kill(self) -> None:
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            raise LookupError(f"no process {self.pid}: the worker has already stopped") from None


def stopped_reason(by: str | None) -> str:
    """What the kernel says of a worker stopped from the sidebar (after "worker pid N")."""
    return f"was stopped from the sidebar by {by}" if by else "was stopped from the sidebar"


def _moved(old: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
    """Whether a kernel's cluster changed, not counting when it was looked at."""
    strip = {"updated"}
    before = {k: v for k, v in (old or {}).items() if k not in strip} if old else None
    after = {k: v for k, v in (new or {}).items() if k not in strip} if new else None
    return before != after


def _names(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The declared envs by name and id only (events never carry specs: env_vars values)."""
    return [{"name": d["name"], "env_id": d["env_id"]} for d in report.get("declared", [])]


def _envs_used(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    """Env ids whose pools ran tasks between two reports (a worker ended more tasks than it
    had, a new worker ended some, or one is running): a task run in an env is a use of it."""
    before = {
        (p["env_id"], w["pid"]): w["tasks_done"] + w["tasks_failed"]
        for p in old
        for w in p["workers"]
    }
    used = set()
    for pool in new:
        for worker in pool["workers"]:
            ended = worker["tasks_done"] + worker["tasks_failed"]
            if worker["busy"] or ended > before.get((pool["env_id"], worker["pid"]), 0):
                used.add(pool["env_id"])
    return sorted(used)


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` from ``/proc`` (None: no such process; -1: cannot tell here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if not Path("/proc/self/stat").exists():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return None
            except PermissionError:
                return -1
            return -1
        return None
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    return int(stat.rsplit(")", 1)[1].split()[1])
