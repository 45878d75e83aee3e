"""Affinity: the workers a pool keeps for a key, the half of ``pool.Pool`` that knows them.

Tasks with the same ``Task.affinity`` key run in one worker, kept for that key
(a *sticky* worker: a ``%%remote`` cell's remote namespace lives in it), one at a time, never
pipelined. The first such task binds an idle worker, or a new one started for it at once
(kept workers do not count towards ``max_workers``, so a cell never waits behind busy tasks,
nor holds them back); later ones queue for that worker only. A kept worker takes no other
task and is never stopped for being idle; ``release_affinity(key)`` stops it (after what it
runs), and its death unbinds the key (the next task of the key binds a new worker, whose
state starts empty).

``Affinity`` is the base of ``dispatch.Dispatch`` (which hands queued calls to workers, kept
ones included) and so of ``Pool``; the attributes it declares without making them are made
in ``Pool.__init__``. Its methods whose names start with ``_`` run under the pool's lock.
"""

from __future__ import annotations

import threading

from .pool_state import notify
from .process import WorkerProcess


class Affinity:
    """Which worker is kept for which key; the three public calls about keys."""

    # Made in ``Pool.__init__`` (described there).
    _lock: threading.Lock
    _workers: set[WorkerProcess]
    _idle: list[WorkerProcess]

    def __init__(self) -> None:
        # affinity key <-> the worker kept for it (see the module docstring)
        self._sticky: dict[str, WorkerProcess] = {}
        self._bound: dict[WorkerProcess, str] = {}
        self._labels: dict[str, str] = {}
        self._releasing: set[WorkerProcess] = set()  # let go while busy: stop when done

    def release_affinity(self, key: str) -> bool:
        """Let ``key``'s worker go: it is stopped once it holds no call (its state with
        it). Who calls it: ``LocalExecutor.release_affinity`` (``%%remote --fresh``, an env
        that changed). Whether this pool had the key."""
        with self._lock:
            worker = self._sticky.pop(key, None)
            self._labels.pop(key, None)
            if worker is None:
                return False
            del self._bound[worker]
            idle = not worker.held and worker.ready
            if not idle:
                self._releasing.add(worker)  # stopped by _refill when its calls are done
        if idle:
            worker.stop()  # it exits; worker_died removes it
        notify()
        return True

    def label_affinity(self, key: str, label: str) -> None:
        """What ``stats()`` says ``key``'s worker is kept for (the sidebar shows it)."""
        with self._lock:
            if key in self._sticky:
                self._labels[key] = label[:200]
        notify()

    def affinity_pid(self, key: str) -> int | None:
        """The pid of the live worker kept for ``key``, if there is one."""
        with self._lock:
            worker = self._sticky.get(key)
            return worker.pid if worker is not None and worker.pid else None

    # -- under the pool's lock ------------------------------------------------------------

    def _sticky_worker(self, key: str) -> WorkerProcess | None:
        """The worker to run a task of ``key`` now: the key's, if it holds nothing, or an
        idle one, which is then kept for the key; ``None``: queue it."""
        worker = self._sticky.get(key)
        if worker is not None:
            free = not worker.held and worker.ready and not worker.retired
            return worker if free and worker not in self._releasing else None
        if self._idle:
            worker = self._idle.pop()
            self._bind(key, worker)
            return worker
        return None

    def _bind(self, key: str, worker: WorkerProcess) -> None:
        self._sticky[key] = worker
        self._bound[worker] = key

    def _unbind(self, worker: WorkerProcess) -> None:
        self._releasing.discard(worker)
        key = self._bound.pop(worker, None)
        if key is not None and self._sticky.get(key) is worker:
            del self._sticky[key]
            self._labels.pop(key, None)

    def _general(self) -> list[WorkerProcess]:
        """Workers not kept for a key: the ones ``max_workers`` counts."""
        return [w for w in self._workers if w not in self._bound]
