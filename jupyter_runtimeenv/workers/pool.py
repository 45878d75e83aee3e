"""``Pool``: the workers of one environment, in the driver.

Owned by ``LocalExecutor`` (one pool per resolved env id); tests build pools directly. The
pool gets its ``EnvContext`` from ``acquire`` in a background thread (an agent build can take
minutes and ``.remote()`` must not block), queues tasks meanwhile, starts workers on demand
up to ``max_workers``, reuses idle ones (most recently used first: warm caches), stops those
idle for ``idle_timeout`` seconds, and calls ``release`` (the agent reference) exactly once
when it closes. Every live pool is closed at interpreter exit.

With ``keep_spare``, the pool keeps one started worker in reserve: one more as soon as the
environment is known, and another whenever a task takes the last idle worker, so that the
next task does not wait for a process start (~80 ms: the interpreter, ``site``, pickle and
cloudpickle). The spare counts towards ``max_workers``, is never started while another
worker is still starting, and is stopped by the idle timeout like any idle worker.

``prestart`` asks for the first worker before the first task: it starts as soon as the
environment is known (at once if it already is), counts towards ``max_workers``, is stopped
by the idle timeout if no task comes, and is never started once the pool is closing. Having
time, it also imports cloudpickle after its HELLO (``_entry.WARM_VAR``), which a function
defined in a notebook (pickled by value) needs: the first call pays neither cost.

Where the rest lives: ``dispatch`` hands calls to workers and hears what they answer (the
pipelines, a worker's death, learned imports); ``affinity`` keeps workers for keys;
``pool_state`` has the pool states and the observers of pools' changes (``observe``,
re-exported here).

Locking: one lock guards the queue, the worker set and each worker's ``held``/``outbox``;
nothing that blocks (sending, spawning, settling futures, releasing) runs under it.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from ..context import EnvContext
from ..errors import WorkerError
from . import threads
from .channel import shared_arena
from .dispatch import Dispatch, log
from .future import Task
from .habits import PIPELINE_DEPTH, Habits
from .pool_state import PoolState, notify, observe
from .process import WorkerProcess

__all__ = ["Pool", "PoolState", "close_all_pools", "live_pools", "observe"]

#: The states of a pool that takes no new task (``Pool.closed``).
_ENDING = (PoolState.DRAINING, PoolState.CLOSED)


class Pool(Dispatch):
    """Workers for one environment. ``submit`` returns ``False`` once the pool is closing."""

    def __init__(
        self,
        acquire: Callable[[], EnvContext],
        release: Callable[[EnvContext], None] | None = None,
        *,
        max_workers: int | None = None,
        idle_timeout: float = 60.0,
        close_when_idle: bool = False,
        keep_spare: bool = False,
        name: str = "pool",
        pipeline_depth: int = PIPELINE_DEPTH,
        learn_imports: bool = True,
    ) -> None:
        self.max_workers = max_workers or os.cpu_count() or 1
        self.idle_timeout = idle_timeout
        self.close_when_idle = close_when_idle
        self.keep_spare = keep_spare
        self.name = name
        self.pipeline_depth = max(1, pipeline_depth)
        #: Call durations per function and the modules calls imported (``habits``).
        self.habits = Habits(learn_imports)
        self.ctx: EnvContext | None = None
        self.state = PoolState.ACQUIRING
        self._release = release
        self._lock = threading.Lock()
        self._queue: deque[Task] = deque()
        self._workers: set[WorkerProcess] = set()
        self._idle: list[WorkerProcess] = []
        self._janitor_wake = threading.Event()
        self._janitor: threading.Thread | None = None
        self._closing = False
        self._prestart = False
        # worker pid -> [tasks done, tasks failed]; a lock of its own: a future's done-callback
        # may run at once, inside _assign, under _lock.
        self._counts: dict[int, list[int]] = {}
        self._counts_lock = threading.Lock()
        super().__init__()  # the affinity keys' state (``affinity``)
        # task id -> when it started running (epoch seconds; under ``_lock``): the sidebar
        # shows what a busy worker runs and for how long.
        self._since: dict[int, float] = {}
        _live_pools.add(self)
        _register_atexit()
        notify()  # a new pool is a change the kernel's report shows
        threads.run(lambda: self._acquire(acquire), f"{name}-acquire", wait=True)

    def __repr__(self) -> str:
        return f"<Pool {self.name} {self.state.value} workers={len(self._workers)}>"

    @property
    def closed(self) -> bool:
        return self.state in _ENDING

    @property
    def pids(self) -> list[int]:
        with self._lock:
            return sorted(w.pid for w in self._workers if w.pid)

    def stats(self) -> dict[str, object]:
        """What the pool looks like now (for the kernel's report to the server): its env,
        state and each started worker's pid, busy flag, tasks done/failed and the call it
        runs (``{"name", "started"}``: the oldest it holds, since it became the oldest)."""
        with self._counts_lock:
            counts = {pid: tuple(c) for pid, c in self._counts.items()}
        now = time.time()
        with self._lock:
            workers: list[dict[str, Any]] = [
                {
                    "pid": w.pid,
                    "busy": bool(w.held),
                    "tasks_done": counts.get(w.pid, (0, 0))[0],
                    "tasks_failed": counts.get(w.pid, (0, 0))[1],
                    # what a kept worker is kept for (a %%remote namespace), else None
                    "sticky": self._labels.get(self._bound[w], self._bound[w])
                    if w in self._bound
                    else None,
                    "task": {
                        "name": w.held[0].name,
                        "started": self._since.get(w.held[0].call.task_id, now),
                    }
                    if w.held
                    else None,
                }
                for w in sorted(self._workers, key=lambda w: w.pid)
                if w.pid
            ]
        for worker in workers:  # its identity: Stop checks it (server/kernels.py)
            worker["started"] = _start_time(worker["pid"])
        return {
            "env_id": self.ctx.env_id if self.ctx is not None else "",
            "name": self.name,
            "state": self.state.value,
            "max_workers": self.max_workers,
            "workers": workers,
        }

    # -- called by the executor -----------------------------------------------------------
    def submit(self, task: Task) -> bool:
        """Run ``task`` on an idle worker, or queue it (starting a worker if allowed)."""
        if self.state in _ENDING:  # ``closed``, without a property's call: on every call
            return False
        task.call  # noqa: B018 - a payload that is no call fails here, not under the lock
        spawn = spare = None
        starting: list[WorkerProcess] | tuple[()] = ()
        with self._lock:
            if self.state in _ENDING:
                return False
            task.pool = self  # cancelling its future calls cancel_task
            if task.affinity is not None:
                worker = self._sticky_worker(task.affinity)
                if worker is not None:
                    self._assign(worker, task)
                else:
                    self._queue.append(task)
                    starting = self._reserve_sticky()
            else:
                worker = self._idle.pop() if self._idle else None
                if worker is not None:
                    self._assign(worker, task)
                    spare = self._reserve_spare() if self.keep_spare else None
                elif self._pipeline(task) is None:
                    self._queue.append(task)
                    spawn = self._reserve_worker()
                # else: it joined a busy worker's outbox, which that worker's reader thread
                # sends with its next answers (the calls ahead of it were sent, or are in
                # that batch): no system call here, where a burst of .remote() calls is made.
        if worker is not None:
            worker.flush()
            notify()
        elif spawn is not None:
            self._start(spawn)
        if spare is not None:
            self._start_soon(spare)
        for each in starting:
            self._start(each)
        return True

    def prestart(self) -> None:
        """Start one worker now if the pool has none, so the first task finds it started
        (at once if the environment is known, else as soon as it is). Who calls it:
        ``LocalExecutor.prestart``, when a notebook has just made the environment READY."""
        with self._lock:
            self._prestart = True
            worker = self._reserve_first()
        if worker is not None:
            self._start_soon(worker)

    def drain(self) -> None:
        """Take no new tasks; close once the queued and running ones are done."""
        with self._lock:
            if self.state is PoolState.CLOSED:
                return
            self.state = PoolState.DRAINING
            finished = self._finished()
        if finished:
            self.close()

    def close(self, timeout: float = 5.0) -> None:
        """Cancel queued and running tasks, end every worker, release the environment."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self.state = PoolState.CLOSED
            queued, self._queue = list(self._queue), deque()
            workers = list(self._workers)
            busy = [w for w in workers if w.held]
            held = [t for w in busy for t in w.held]
            for worker in busy:
                worker.held.clear()
                worker.outbox.clear()
            self._idle.clear()
        self._janitor_wake.set()
        for worker in busy:
            worker.kill()  # what it runs is cancelled: it must not run on
        for task in queued + held:
            task.future.cancel()
        for worker in workers:
            worker.stop()
        for worker in workers:
            worker.join(timeout)
        arena = shared_arena()
        if arena is not None:
            arena.trim()  # warm shared memory is for a busy pool, not a closed one
        self._release_env()
        notify()

    def _close_soon(self) -> None:
        # Not in the calling (reader) thread: close() joins reader threads.
        threading.Thread(target=self.close, name=f"{self.name}-close", daemon=True).start()

    def _start(self, worker: WorkerProcess) -> None:
        """Launch a reserved worker, and send it its first call at once. Lock not held."""
        try:
            worker.start()
        except WorkerError as exc:
            self.worker_died(worker, exc)
        else:
            with self._lock:
                first = self._first_call(worker)
            if first:
                worker.flush()
        notify()

    def _start_soon(self, worker: WorkerProcess) -> None:
        """Launch a reserved spare from a short thread: the caller (``.remote()``, a reader
        thread about to send a task) must not wait for ``Popen``. Lock not held."""
        threading.Thread(
            target=self._start, args=(worker,), name=f"{self.name}-spare", daemon=True
        ).start()

    def cancel_task(self, task: Task) -> None:
        """``task``'s future was cancelled: take the task back (``future.Holder``). Lock
        not held."""
        victim: WorkerProcess | None = None
        with self._lock:
            try:
                self._queue.remove(task)
                return
            except ValueError:
                pass
            victim = next((w for w in self._workers if task in w.held), None)
            if victim is None:
                return
            try:
                victim.outbox.remove(task)  # not sent yet: it simply never goes
            except ValueError:
                pass  # sent: the worker must skip it, or die if it runs it already
            else:
                victim.held.remove(task)
                if not victim.held:
                    self._refill(victim)
                self._count(victim.pid, 0, 1)
                return
        if victim.cancel(task):
            with self._lock:
                victim.retired = True  # it may finish first: it must take no other call

    def _acquire(self, acquire: Callable[[], EnvContext]) -> None:
        """Background thread: get the environment, then start workers for the queue."""
        try:
            ctx = acquire()
        except BaseException as exc:
            with self._lock:
                self.state = PoolState.CLOSED
                queued, self._queue = list(self._queue), deque()
            _live_pools.discard(self)
            for task in queued:
                task.future.settle_exception(exc)
            return
        spawn: list[WorkerProcess] = []
        with self._lock:
            self.ctx = ctx
            if self.state is PoolState.ACQUIRING:
                self.state = PoolState.READY
            while (worker := self._reserve_worker()) is not None:
                spawn.append(worker)
            spawn += self._reserve_sticky()
            closed = self.state is PoolState.CLOSED
            if (
                self.keep_spare
                and not closed
                and not spawn
                and len(self._workers) < self.max_workers
            ):
                spawn.append(worker := WorkerProcess(ctx, self))
                self._workers.add(worker)
            elif self._prestart and not closed and (worker := self._reserve_first()):
                spawn.append(worker)
        if closed:
            self._release_env()
        for worker in spawn:
            self._start(worker)

    def _release_env(self) -> None:
        """Drop the agent reference, once. Lock not held."""
        with self._lock:
            ctx = self.ctx
            if ctx is None:  # closed while acquiring: ``_acquire`` releases when it gets it
                return
            release, self._release = self._release, None
        _live_pools.discard(self)
        if release is not None and ctx is not None:
            try:
                release(ctx)
            except Exception:
                log.warning("could not release environment %s", ctx.env_id, exc_info=True)

    def _start_janitor(self) -> None:
        # ``_janitor`` is None again once the janitor is over (it says so under the lock
        # as it decides to end, or as it fails): no ``is_alive()`` after every answer.
        if self._janitor is None:
            janitor = threading.Thread(
                target=self._reap_idle, name=f"{self.name}-janitor", daemon=True
            )
            janitor.start()  # may raise (no thread to be had): not recorded, tried again
            self._janitor = janitor

    def _reap_idle(self) -> None:
        """Janitor thread: stop workers idle longer than ``idle_timeout``; exits when none."""
        try:
            self._reap_idle_loop()
        except BaseException:
            with self._lock:
                self._janitor = None
            raise

    def _reap_idle_loop(self) -> None:
        while True:
            with self._lock:
                if self.state is PoolState.CLOSED or not self._idle:
                    self._janitor = None
                    return
                now = time.monotonic()
                expired = [w for w in self._idle if now - w.idle_since >= self.idle_timeout]
                for worker in expired:
                    self._idle.remove(worker)
                oldest = min((w.idle_since for w in self._idle), default=now)
            for worker in expired:
                worker.stop()  # it exits; worker_died removes it and may close the pool
            self._janitor_wake.wait(max(0.01, oldest + self.idle_timeout - time.monotonic()))
            self._janitor_wake.clear()


def _start_time(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds, as psutil tells it, as the server checks
    it), or None if it is gone. Read outside the pool's lock: it reads ``/proc``."""
    import psutil  # only when reporting: a kernel that never reports never imports it

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


_live_pools: weakref.WeakSet[Pool] = weakref.WeakSet()


def live_pools() -> list[Pool]:
    """Every pool of this process that is not closed yet."""
    return [pool for pool in list(_live_pools) if pool.state is not PoolState.CLOSED]


def close_all_pools() -> None:
    """Close every live pool; registered with ``atexit`` so no worker outlives the driver."""
    for pool in list(_live_pools):
        pool.close(timeout=2.0)


def _register_atexit() -> None:
    # Re-registering moves us last, so we run before handlers registered earlier (atexit is
    # LIFO), e.g. the agent client's close, which our releases need.
    atexit.unregister(close_all_pools)
    atexit.register(close_all_pools)
