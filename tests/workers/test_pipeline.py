"""Pipelined calls (issue 19 item 3): a worker holds several calls, a function goes to a
worker once, and deaths and cancels fail exactly the call that may have run.

Real pools of real worker processes. White-box reads of ``Pool._workers`` and
``WorkerProcess.held`` only to know which calls a worker holds, always through a bounded
poll for the state a test needs (never a read right after a submit). ``warm`` raises the
pool's ``habits.short_call``: on a loaded machine a warm call of ``step`` may take longer
than the real threshold, and whether it is pipelined must not depend on that.
"""

from __future__ import annotations

import contextvars
import io
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.errors import BrokenWorker
from jupyter_runtimeenv.workers.future import RemoteFuture, Task
from jupyter_runtimeenv.workers.habits import PIPELINE_DEPTH
from jupyter_runtimeenv.workers.output import OutputTarget
from jupyter_runtimeenv.workers.pool import Pool
from jupyter_runtimeenv.workers.serialize import dump_call
from tests.workers.helpers import submit, wait_gone

MakePool = Callable[..., Pool]


def step(trigger: str, log: str, tag: str) -> int:
    """A short call, until ``trigger`` exists: then the first call to see it waits for it to
    go away (it is "running" for as long as the test wants). Each call logs its tag."""
    with open(log, "a") as f:
        f.write(f"{tag} {os.getpid()}\n")
    if os.path.exists(trigger) and tag == "blocker":
        Path(trigger + ".seen").write_text("yes")
        while os.path.exists(trigger):
            time.sleep(0.01)
    return os.getpid()


def ran(log: Path) -> list[tuple[str, int]]:
    if not log.exists():
        return []
    return [(t, int(p)) for t, p in (line.split() for line in log.read_text().splitlines())]


def wait_for(condition: Callable[[], object], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def only_worker(pool: Pool) -> Any:
    (worker,) = list(pool._workers)
    return worker


def holds(pool: Pool, futures: list[RemoteFuture[Any]]) -> None:
    """Wait (bounded) until the pool's only worker holds exactly ``futures``, in order."""
    wait_for(lambda: [t.future for t in only_worker(pool).held] == futures)


def warm(pool: Pool, trigger: Path, log: Path) -> int:
    """A few calls: the pool knows ``step``'s duration and, its threshold raised for the
    test, counts it short and pipelines it from now on."""
    pool.habits.short_call = 60.0
    pids = {submit(pool, step, str(trigger), str(log), "warm").result(60) for _ in range(3)}
    (pid,) = pids
    log.unlink()
    return pid


def test_a_burst_of_short_calls_is_pipelined_and_all_answered(
    make_pool: MakePool, tmp_path: Path
) -> None:
    trigger, log = tmp_path / "trigger", tmp_path / "log"
    pool = make_pool(max_workers=1)
    worker_pid = warm(pool, trigger, log)
    trigger.write_text("hold")
    blocker = submit(pool, step, str(trigger), str(log), "blocker")
    burst = [submit(pool, step, str(trigger), str(log), f"c{i}") for i in range(20)]
    # Behind the running call, the worker holds up to the depth; the rest wait in the pool.
    holds(pool, [blocker, *burst[: PIPELINE_DEPTH - 1]])
    trigger.unlink()
    assert [f.result(60) for f in [blocker, *burst]] == [worker_pid] * 21
    assert [tag for tag, _ in ran(log)] == ["blocker"] + [f"c{i}" for i in range(20)]


def test_depth_one_turns_pipelining_off(make_pool: MakePool, tmp_path: Path) -> None:
    trigger, log = tmp_path / "trigger", tmp_path / "log"
    pool = make_pool(max_workers=1, pipeline_depth=1)
    warm(pool, trigger, log)
    trigger.write_text("hold")
    blocker = submit(pool, step, str(trigger), str(log), "blocker")
    rest = [submit(pool, step, str(trigger), str(log), f"c{i}") for i in range(3)]
    wait_for((tmp_path / "trigger.seen").exists)  # it runs: nothing may join it
    holds(pool, [blocker])
    trigger.unlink()
    assert len({f.result(60) for f in [blocker, *rest]}) == 1


def test_a_death_fails_the_running_call_and_the_held_ones_run_elsewhere_once(
    make_pool: MakePool, tmp_path: Path
) -> None:
    """The worker dies (SIGKILL) while it runs one call and holds K-1 more: exactly that
    call fails with BrokenWorker; the others never started there and each runs once on a
    fresh worker."""
    trigger, log = tmp_path / "trigger", tmp_path / "log"
    pool = make_pool(max_workers=1)
    victim = warm(pool, trigger, log)
    trigger.write_text("hold")
    blocker = submit(pool, step, str(trigger), str(log), "blocker")
    held = [submit(pool, step, str(trigger), str(log), f"h{i}") for i in range(PIPELINE_DEPTH - 1)]
    holds(pool, [blocker, *held])
    wait_for((tmp_path / "trigger.seen").exists)  # it runs: the others wait behind it
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(BrokenWorker, match="died while running step"):
        blocker.result(60)
    pids = [f.result(60) for f in held]
    assert victim not in pids
    calls = ran(log)
    assert [tag for tag, _ in calls] == ["blocker"] + [f"h{i}" for i in range(len(held))]
    assert calls[0][1] == victim
    wait_gone([victim])


def test_cancelling_a_held_call_skips_it_without_killing_the_worker(
    make_pool: MakePool, tmp_path: Path
) -> None:
    trigger, log = tmp_path / "trigger", tmp_path / "log"
    pool = make_pool(max_workers=1)
    worker_pid = warm(pool, trigger, log)
    trigger.write_text("hold")
    blocker = submit(pool, step, str(trigger), str(log), "blocker")
    skipped = submit(pool, step, str(trigger), str(log), "skipped")
    after = submit(pool, step, str(trigger), str(log), "after")
    holds(pool, [blocker, skipped, after])
    wait_for((tmp_path / "trigger.seen").exists)
    assert blocker.running()
    assert not skipped.running()
    assert skipped.cancel()
    trigger.unlink()
    assert blocker.result(60) == worker_pid  # not killed: the cancel was of a waiting call
    assert after.result(60) == worker_pid
    assert skipped.cancelled()
    assert [tag for tag, _ in ran(log)] == ["blocker", "after"]
    assert pool.pids == [worker_pid]


def test_cancelling_the_running_call_kills_only_it(make_pool: MakePool, tmp_path: Path) -> None:
    trigger, log = tmp_path / "trigger", tmp_path / "log"
    pool = make_pool(max_workers=1)
    victim = warm(pool, trigger, log)
    trigger.write_text("hold")
    blocker = submit(pool, step, str(trigger), str(log), "blocker")
    behind = [submit(pool, step, str(trigger), str(log), f"b{i}") for i in range(3)]
    wait_for((tmp_path / "trigger.seen").exists)
    wait_for(blocker.running)  # the worker's status word names it
    assert not any(f.running() for f in behind)
    assert blocker.cancel()
    wait_gone([victim])
    pids = [f.result(60) for f in behind]  # they never started there: they run elsewhere
    assert victim not in pids
    assert [tag for tag, _ in ran(log)] == ["blocker", "b0", "b1", "b2"]


class Counted:
    """A callable that counts its pickles (here) and its unpicklings (in the worker)."""

    pickled = 0
    loaded = 0

    def __call__(self) -> tuple[int, int]:
        return os.getpid(), Counted.loaded

    def __reduce__(self) -> tuple[Any, ...]:
        Counted.pickled += 1
        return (_load_counted, ())


def _load_counted() -> Counted:
    Counted.loaded += 1
    return Counted()


def test_a_function_is_pickled_once_and_sent_to_a_worker_once(make_pool: MakePool) -> None:
    pool = make_pool(max_workers=1)
    function = Counted()
    answers = {submit(pool, function).result(60) for _ in range(20)}
    (_pid, loaded) = answers.pop()
    assert not answers  # every call: the same worker, which unpickled it once
    assert loaded == 1
    assert Counted.pickled == 1


def test_output_of_calls_from_two_cells_goes_to_each_cell(make_pool: MakePool) -> None:
    """Calls whose output goes to different places never share a pipeline: each line
    reaches the target of the call that printed it. Bursts of calls of two cells in turns,
    waited for one by one: a line drained after its call's answer was handled (the reader
    thread acting on a poll made before it waited for the read lock) went to the next
    call's cell, the first line of b in about 1 of 25 bursts; 150 bursts find it."""
    pool = make_pool(max_workers=1)
    cells = {name: (io.StringIO(), io.StringIO()) for name in ("a", "b")}

    def call(cell: str, text: str) -> RemoteFuture[Any]:
        future: RemoteFuture[Any] = RemoteFuture("say")
        out, err = cells[cell]
        task = Task(b"", future, OutputTarget(f"say-{cell}", out, err, contextvars.Context()))
        task.payload = dump_call(task.id, print, (text,), {}, "print")
        assert pool.submit(task)
        return future

    for _ in range(3):  # print is short: it is pipelined from now on
        call("a", "warm a").result(60)
        call("b", "warm b").result(60)
    for _burst in range(150):
        futures = [call(cell, f"line {i} of {cell}") for i in range(30) for cell in ("a", "b")]
        for future in futures:
            future.result(60)
    for cell, (out, _err) in cells.items():
        lines = [line for line in out.getvalue().splitlines() if "line" in line]
        assert [line for line in lines if not line.endswith(f"of {cell}")] == []
        assert len(lines) == 150 * 30
