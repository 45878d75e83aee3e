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

Pipelining: a worker holds up to ``pipeline_depth`` calls (``WorkerProcess.held``): the one
it runs and the next ones, already in its socket, so it never waits for the driver between
two calls and the driver sends and reads them in batches. Only *short* calls are pipelined:
the pool keeps, per function, a decaying maximum of the durations its workers report, and a
call joins a worker's pipeline only if its function and the one the worker runs are under
``habits.SHORT_CALL`` (a first call, or a long one, runs alone: nothing waits behind it while
another worker could take it). Nor does a call join a pipeline when the pool may still start
a worker for it, or when its output goes elsewhere than the calls ahead of it (another cell:
output read in one batch could not be told apart). ``habits.PIPELINE_DEPTH`` was chosen by
measurement (``benchmarks/bench_pipeline.py``). What the pool learns lives in ``habits``.

A worker that dies fails the call it may have run (the one its status word names, see
``protocol``) with ``BrokenWorker``; every other call it held never started there and goes
back to the head of the queue, in order (``MAX_DELIVERIES`` times at most, counting only
deaths no call of theirs could have caused). A pool that closes when idle and is left empty
by a death becomes DRAINING at once, under the lock, so that a task submitted meanwhile goes
to a new pool instead of being cancelled by the close. Cancelling a call a worker holds
sends CANCEL (it skips the call) and kills the worker only if the call runs already; the
worker is then ``retired``: it takes no other call.

Learned imports: workers report the modules their calls imported from installed packages or
the standard library (``_serve``); the pool keeps them in order (up to ``habits.MAX_LEARNED``) and a
new worker imports them after HELLO, before it takes a call (PRELOAD/READY). A pool's second
worker then does not spend its first call importing scikit-learn while the first waits.

Affinity: tasks with the same ``Task.affinity`` key run in one worker, kept for that key
(a *sticky* worker: a ``%%remote`` cell's remote namespace lives in it), one at a time, never
pipelined. The first such task binds an idle worker, or a new one started for it at once
(kept workers do not count towards ``max_workers``, so a cell never waits behind busy tasks,
nor holds them back); later ones queue for that worker only. A kept worker takes no other
task and is never stopped for being idle; ``release_affinity(key)`` stops it (after what it
runs), and its death unbinds the key (the next task of the key binds a new worker, whose
state starts empty).

Locking: one lock guards the queue, the worker set and each worker's ``held``/``outbox``;
nothing that blocks (sending, spawning, settling futures, releasing) runs under it.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from enum import Enum
from typing import Any

from ..context import EnvContext
from ..errors import BrokenWorker, WorkerError
from ._entry import WARM_VAR
from .channel import shared_arena
from .future import MAX_DELIVERIES, Task
from .habits import PIPELINE_DEPTH, Habits
from .process import WorkerProcess

log = logging.getLogger(__name__)


class PoolState(Enum):
    ACQUIRING = "acquiring"  # waiting for the environment
    READY = "ready"
    DRAINING = "draining"  # no new tasks; closes when the queued and running ones are done
    CLOSED = "closed"


class Pool:
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
        # affinity key <-> the worker kept for it (see the module docstring)
        self._sticky: dict[str, WorkerProcess] = {}
        self._bound: dict[WorkerProcess, str] = {}
        self._labels: dict[str, str] = {}
        self._releasing: set[WorkerProcess] = set()  # let go while busy: stop when done
        # task id -> when it started running (epoch seconds; under ``_lock``): the sidebar
        # shows what a busy worker runs and for how long.
        self._since: dict[int, float] = {}
        _live_pools.add(self)
        _register_atexit()
        _notify()  # a new pool is a change the kernel's report shows
        threading.Thread(
            target=self._acquire, args=(acquire,), name=f"{name}-acquire", daemon=True
        ).start()

    def __repr__(self) -> str:
        return f"<Pool {self.name} {self.state.value} workers={len(self._workers)}>"

    @property
    def closed(self) -> bool:
        return self.state in (PoolState.DRAINING, PoolState.CLOSED)

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
        if self.closed:
            return False
        task.call  # noqa: B018 - a payload that is no call fails here, not under the lock
        spawn = spare = None
        starting: list[WorkerProcess] = []
        with self._lock:
            if self.closed:
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
                    spare = self._reserve_spare()
                elif self._pipeline(task) is None:
                    self._queue.append(task)
                    spawn = self._reserve_worker()
                # else: it joined a busy worker's outbox, which that worker's reader thread
                # sends with its next answers (the calls ahead of it were sent, or are in
                # that batch): no system call here, where a burst of .remote() calls is made.
        if worker is not None:
            worker.flush()
            _notify()
        elif spawn is not None:
            self._start(spawn)
        if spare is not None:
            self._start_soon(spare)
        for each in starting:
            self._start(each)
        return True

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
        _notify()
        return True

    def label_affinity(self, key: str, label: str) -> None:
        """What ``stats()`` says ``key``'s worker is kept for (the sidebar shows it)."""
        with self._lock:
            if key in self._sticky:
                self._labels[key] = label[:200]
        _notify()

    def affinity_pid(self, key: str) -> int | None:
        """The pid of the live worker kept for ``key``, if there is one."""
        with self._lock:
            worker = self._sticky.get(key)
            return worker.pid if worker is not None and worker.pid else None

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
        _notify()

    # -- WorkerListener: called by the workers' reader threads ------------------------------

    def worker_hello(self, worker: WorkerProcess) -> list[str]:
        """The modules the new worker imports before it takes a call (learned imports)."""
        with self._lock:
            if worker.held:
                # It was sent its first call before its HELLO (the pool learned imports
                # only after deciding so): it runs that call now, as a ready worker.
                return []
            return self.habits.preload()

    def worker_ready(self, worker: WorkerProcess) -> None:
        with self._lock:
            self._refill(worker)
            spare = self._reserve_spare() if worker.held else None
        if spare is not None:
            self._start_soon(spare)

    def tasks_answered(self, worker: WorkerProcess, durations: list[int | None]) -> list[Task]:
        """The worker answered its oldest ``len(durations)`` calls (each RETURN's duration
        in ns, ``None`` for RAISE/SKIP): take them off it and hand it the next ones."""
        ok = 0
        with self._lock:
            held = worker.held
            done = []
            for duration in durations:
                if not held:
                    break
                task = held.popleft()
                done.append(task)
                self._since.pop(task.call.task_id, None)
                if held:  # the next call it holds runs now
                    self._since[held[0].call.task_id] = time.time()
                if duration is not None:
                    ok += 1
                    self.habits.timed(task.call.key, duration / 1e9)
            self._refill(worker)
        self._count(worker.pid, ok, len(done) - ok)
        return done

    def imports_learned(self, worker: WorkerProcess, modules: list[str]) -> None:
        with self._lock:
            self.habits.learned(modules)

    def worker_died(self, worker: WorkerProcess, error: WorkerError) -> None:
        failed: list[Task] = []
        broken: list[Task] = []
        handoff: list[WorkerProcess] = []
        with self._lock:
            self._workers.discard(worker)
            if worker in self._idle:
                self._idle.remove(worker)
            self._unbind(worker)
            held, running = list(worker.held), worker.running()
            worker.held.clear()
            worker.outbox.clear()
            for task in held:
                self._since.pop(task.call.task_id, None)
            # The call its status word names may have run: it fails. The others never
            # started there: back to the head of the queue, in their order.
            culprit = next((t for t in held if running and t.call.task_id == running), None)
            for task in reversed(held):
                if task is culprit:
                    broken.append(task)
                    continue
                if culprit is not None:
                    task.deliveries -= 1  # another call's death: not held against it
                if not self._redeliver(task):
                    broken.append(task)
            broken.reverse()
            for idle in list(reversed(self._idle)):  # idle workers take them now
                if not self._queue:
                    break
                self._idle.remove(idle)
                self._refill(idle)  # back among the idle if nothing was for it
                if idle.held:
                    handoff.append(idle)
            if worker.preloading and not self._closing:
                # It died (or hung) importing what the pool learned: the next one starts
                # without it rather than the same way. (Stopped by close(): no failure.)
                log.warning("worker pid %s failed to preload the pool's imports", worker.pid)
                self.habits.stop_learning()
            elif not worker.ready and not any(w.ready for w in self._workers):
                # It could not even start: the next one would not either. Fail the queue.
                failed, self._queue = list(self._queue), deque()
            spawn = self._reserve_worker()
            sticky = self._reserve_sticky()
            close = self._finished() or (self.close_when_idle and self._empty())
            if close and self.state is PoolState.READY:
                # Decided now, under the lock: a task submitted before the close thread
                # runs must go to a new pool, not be queued here and cancelled by close().
                self.state = PoolState.DRAINING
        self._count(worker.pid, 0, len(broken))
        for each in broken:
            each.future.settle_exception(_as_broken(error))
        for each in failed:
            each.future.settle_exception(error)
        for idle in handoff:
            idle.flush()
        if spawn is not None:
            self._start(spawn)
        for started in sticky:
            self._start(started)
        if close:
            self._close_soon()
        _notify()

    # -- internals (``_lock`` held unless said otherwise) ---------------------------------

    def _assign(self, worker: WorkerProcess, task: Task) -> None:
        if not worker.held:  # it runs at once: the sidebar shows it running since now
            self._since[task.call.task_id] = time.time()
        task.worker = worker  # the future asks it whether it runs the task yet
        task.future.mark_started()
        worker.held.append(task)
        worker.outbox.append(task)
        task.deliveries += 1

    def _pipeline(self, task: Task) -> WorkerProcess | None:
        """A busy worker that takes ``task`` into its pipeline now, if one should."""
        queued = any(t.affinity is None for t in self._queue)  # a key's calls wait apart
        if self.pipeline_depth < 2 or queued or not self.habits.short(task):
            return None
        general = self._general()
        if len(general) < self.max_workers or any(not w.ready for w in general):
            return None  # a worker should start for it (or is starting): the queue asks
        best: WorkerProcess | None = None
        for worker in general:
            held = worker.held
            if (
                held
                and len(held) < self.pipeline_depth
                and worker.ready
                and not worker.retired
                and (best is None or len(held) < len(best.held))
                and self.habits.may_follow(held, task)
            ):
                best = worker
        if best is not None:
            self._assign(best, task)
        return best

    def _refill(self, worker: WorkerProcess) -> None:
        """Give ``worker`` queued calls: one if it holds none, more while they are short and
        print where the calls ahead print; idle (or stopped, when draining) if none."""
        if worker not in self._workers or self.state is PoolState.CLOSED or worker.retired:
            return
        held, queue = worker.held, self._queue
        if worker in self._releasing:  # its key was let go while it ran
            if not held:
                self._releasing.discard(worker)
                worker.stop()
            return
        key = self._bound.get(worker)
        if key is not None:  # kept for a key: its key's calls, one at a time
            if not held and (task := self._take(key)) is not None:
                self._assign(worker, task)
            if held or self.state is not PoolState.DRAINING:
                return  # busy, or kept: not idle, never reaped
            self._unbind(worker)
        while queue and len(held) < self.pipeline_depth:
            task = queue[0]
            if task.affinity is not None:  # a key's call: _take finds it its worker
                break
            if held and not self.habits.may_follow(held, task):
                break
            queue.popleft()
            self._assign(worker, task)
        if not held and (task := self._take(None)) is not None:
            if task.affinity is not None:  # a key no worker is kept for: this one is now
                self._bind(task.affinity, worker)
            self._assign(worker, task)
        if held:
            return
        if self.state is PoolState.DRAINING:
            self._workers.discard(worker)
            worker.stop()
            if self._finished():
                self._close_soon()
            return
        worker.idle_since = time.monotonic()
        self._idle.append(worker)
        self._start_janitor()

    def _count(self, pid: int, done: int, failed: int) -> None:
        """Calls of worker ``pid`` ended: ``done`` returned, ``failed`` raised, were
        cancelled or broke with it (a RETURN whose value does not unpickle counts as done)."""
        if done or failed:
            with self._counts_lock:
                counts = self._counts.setdefault(pid, [0, 0])
                counts[0] += done
                counts[1] += failed
        _notify()

    def _redeliver(self, task: Task) -> bool:
        """Queue again, first, a call whose worker died before starting it (it never ran).
        ``False``: it is done already, was handed out too often, or the pool is closed."""
        if task.future.done() or task.deliveries >= MAX_DELIVERIES:
            return False
        if self.state is PoolState.CLOSED:
            return False
        task.worker = None
        task.future.mark_started(False)
        self._queue.appendleft(task)
        return True

    def _take(self, key: str | None) -> Task | None:
        """The next queued task for a worker kept for ``key``, or for a free worker
        (``None``): a general task, or the first task of a key no worker is kept for."""
        for index, task in enumerate(self._queue):
            if task.affinity == key or (
                key is None and task.affinity is not None and task.affinity not in self._sticky
            ):
                del self._queue[index]
                return task
        return None

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

    def _reserve_worker(self) -> WorkerProcess | None:
        if self.ctx is None or self.state is PoolState.CLOSED:
            return None
        general = self._general()
        if len(general) >= self.max_workers:
            return None  # first: a burst of calls on a full pool must not count the queue
        # Starting workers that hold no call yet will take queued ones (one that holds
        # its first call already, sent before its HELLO, takes no other).
        starting = sum(1 for w in general if not w.ready and not w.held)
        if starting >= sum(1 for t in self._queue if t.affinity is None):
            return None
        worker = WorkerProcess(self.ctx, self)
        self._workers.add(worker)
        return worker

    def _reserve_sticky(self) -> list[WorkerProcess]:
        """A worker, kept for its key at once, for each queued key no worker is kept for."""
        if self.ctx is None or self.state is PoolState.CLOSED:
            return []
        started = []
        for task in self._queue:
            key = task.affinity
            if key is not None and key not in self._sticky:
                worker = WorkerProcess(self.ctx, self)
                self._workers.add(worker)
                self._bind(key, worker)
                started.append(worker)
        return started

    def _reserve_spare(self) -> WorkerProcess | None:
        if not self.keep_spare or self.state is not PoolState.READY or self._idle:
            return None
        general = self._general()
        if any(not w.ready for w in general) or len(general) >= self.max_workers:
            return None
        if self.ctx is None:
            return None
        worker = WorkerProcess(self.ctx, self)
        self._workers.add(worker)
        return worker

    def _reserve_first(self) -> WorkerProcess | None:
        if self.ctx is None or self.state is not PoolState.READY or self._workers:
            return None
        warm = {**self.ctx.env_vars, WARM_VAR: "1"}
        worker = WorkerProcess(dataclasses.replace(self.ctx, env_vars=warm), self)
        self._workers.add(worker)
        return worker

    def _finished(self) -> bool:
        return self.state is PoolState.DRAINING and not self._queue and self._empty(busy_only=True)

    def _empty(self, busy_only: bool = False) -> bool:
        if busy_only:
            return not any(w.held for w in self._workers)
        return not self._workers and not self._queue and self.state is PoolState.READY

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
        _notify()

    def _first_call(self, worker: WorkerProcess) -> bool:
        """Give a worker that is starting the call it was started for, to be sent before
        its HELLO: it finds the call in its socket as it starts serving, instead of waiting
        for the driver to read the HELLO and answer (two wake-ups of a process on a loaded
        machine: 3-5 ms of a forked worker's ~15 ms first result at load 13,
        ``benchmarks/bench_fork.py``). Not when it will import learned modules first (the
        call would run before them). If it dies before HELLO, the call never started there:
        ``worker_died`` queues it again, as any held call its status word does not name."""
        if (
            worker not in self._workers
            or self.state is PoolState.CLOSED
            or worker.ready
            or worker.held
            or worker.retired
            or not worker.pid
            or self.habits.preload()
        ):
            return False
        key = self._bound.get(worker)
        if key is not None:
            task = self._take(key)
        else:
            task = next((t for t in self._queue if t.affinity is None), None)
            if task is not None:
                self._queue.remove(task)
        if task is None:
            return False
        self._assign(worker, task)
        return True

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
        if self._janitor is None or not self._janitor.is_alive():
            self._janitor = threading.Thread(
                target=self._reap_idle, name=f"{self.name}-janitor", daemon=True
            )
            self._janitor.start()

    def _reap_idle(self) -> None:
        """Janitor thread: stop workers idle longer than ``idle_timeout``; exits when none."""
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


def _as_broken(error: WorkerError) -> WorkerError:
    return error if isinstance(error, BrokenWorker) else BrokenWorker(str(error))


_live_pools: weakref.WeakSet[Pool] = weakref.WeakSet()
_observers: list[Callable[[], None]] = []


def _start_time(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds, as psutil tells it, as the server checks
    it), or None if it is gone. Read outside the pool's lock: it reads ``/proc``."""
    import psutil  # only when reporting: a kernel that never reports never imports it

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


def live_pools() -> list[Pool]:
    """Every pool of this process that is not closed yet."""
    return [pool for pool in list(_live_pools) if pool.state is not PoolState.CLOSED]


def observe(callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` whenever a pool's workers or tasks change. It runs on the pools'
    threads, sometimes under a pool's lock: it must only set a flag. Used by the reporter."""
    if callback not in _observers:
        _observers.append(callback)
    return lambda: _observers.remove(callback) if callback in _observers else None


def _notify() -> None:
    for callback in list(_observers):
        callback()


def close_all_pools() -> None:
    """Close every live pool; registered with ``atexit`` so no worker outlives the driver."""
    for pool in list(_live_pools):
        pool.close(timeout=2.0)


def _register_atexit() -> None:
    # Re-registering moves us last, so we run before handlers registered earlier (atexit is
    # LIFO), e.g. the agent client's close, which our releases need.
    atexit.unregister(close_all_pools)
    atexit.register(close_all_pools)
