"""How a pool's calls go to its workers, and what the workers' reader threads tell the pool:
the half of ``pool.Pool`` that runs under its lock on every call and every answer.

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
sends CANCEL (it skips the call; ``Pool.cancel_task``) and kills the worker only if the call
runs already; the worker is then ``retired``: it takes no other call.

Learned imports: workers report the modules their calls imported from installed packages or
the standard library (``_serve``); the pool keeps them in order (up to ``habits.MAX_LEARNED``) and a
new worker imports them after HELLO, before it takes a call (PRELOAD/READY). A pool's second
worker then does not spend its first call importing scikit-learn while the first waits.

``Dispatch`` is ``Pool``'s base class (and ``affinity.Affinity``'s subclass): ``pool`` makes
the pool, takes calls (``submit``), starts and stops workers and closes; this hands calls to
workers (``_assign``, ``_pipeline``, ``_refill``, ``_first_call``), decides which workers to
start for them (``_reserve_*``) and is the workers' ``WorkerListener``. The attributes named
below are made in ``Pool.__init__``, where each is described.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque

from ..context import EnvContext
from ..errors import BrokenWorker, WorkerError
from ._entry import WARM_VAR
from .affinity import Affinity
from .future import MAX_DELIVERIES, Task
from .habits import Habits
from .pool_state import PoolState, notify
from .process import WorkerProcess

# The pool's logger, as before ``pool`` was split (a user's logging set-up names it).
log = logging.getLogger("jupyter_runtimeenv.workers.pool")


class Dispatch(Affinity):
    """Calls to workers, answers and deaths back (under ``_lock``; see ``pool``)."""

    # Made in ``Pool.__init__`` (described there).
    ctx: EnvContext | None
    state: PoolState
    max_workers: int
    close_when_idle: bool
    keep_spare: bool
    pipeline_depth: int
    habits: Habits
    _queue: deque[Task]
    _closing: bool
    _counts: dict[int, list[int]]
    _counts_lock: threading.Lock
    _since: dict[int, float]

    # ``Pool``'s: they start threads and processes (``_start_janitor`` under the lock).
    def _start(self, worker: WorkerProcess) -> None:
        raise NotImplementedError

    def _start_soon(self, worker: WorkerProcess) -> None:
        raise NotImplementedError

    def _close_soon(self) -> None:
        raise NotImplementedError

    def _start_janitor(self) -> None:
        raise NotImplementedError

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
        since, timed = self._since, self.habits.timed
        with self._lock:
            held = worker.held
            done = []
            for duration in durations:
                if not held:
                    break
                task = held.popleft()
                done.append(task)
                call = task.call
                since.pop(call.task_id, None)
                if held:  # the next call it holds runs now
                    since[held[0].call.task_id] = time.time()
                if duration is not None:
                    ok += 1
                    timed(call.key, duration / 1e9)
            self._refill(worker)
        self._count(worker.pid, ok, len(done) - ok)
        return done

    def task_answered(self, worker: WorkerProcess, duration: int) -> Task | None:
        """``tasks_answered`` for one RETURN (``duration`` in ns), the answer of a worker that
        ran one call: the same steps without the lists (``None``: it held no call)."""
        since = self._since
        with self._lock:
            held = worker.held
            if not held:
                return None
            task = held.popleft()
            call = task.call
            since.pop(call.task_id, None)
            if held:  # the next call it holds runs now
                since[held[0].call.task_id] = time.time()
            self.habits.timed(call.key, duration / 1e9)
            self._refill(worker)
        self._count(worker.pid, 1, 0)
        return task

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
        notify()

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
        if not held and queue and (task := self._take(None)) is not None:
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
        notify()

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


def _as_broken(error: WorkerError) -> WorkerError:
    return error if isinstance(error, BrokenWorker) else BrokenWorker(str(error))
