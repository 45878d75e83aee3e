"""A thread waiting in ``result()`` reads its call's answer itself (``WorkerProcess.read_answer``).

Real pools and worker processes. The waiter reads only while its call is the one the worker
runs, and for a short window; the reader thread reads everything else. These tests show
that the waiter does read answers (polling for them first, on a machine with a CPU to
spare: every test runs both ways, the machine's load injected as the file the driver's
``_cpuload.Gauge`` reads), that output printed before an answer still reaches that
call's target before its result, that a worker's death and a cancel from another thread
still settle the call, and that interrupts landing anywhere in ``result()`` leave no call
hanging and the pool working (on main before this test, one landing just after the futures'
shared lock was taken left it taken: every future hung).
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from typing import Any

import pytest

from jupyter_runtimeenv.errors import BrokenWorker
from jupyter_runtimeenv.workers.future import RemoteFuture, Task
from jupyter_runtimeenv.workers.output import OutputTarget
from jupyter_runtimeenv.workers.pool import Pool
from jupyter_runtimeenv.workers.serialize import dump_call
from tests.workers.helpers import echo, nap, noop, submit

#: Every test runs with a CPU to spare and on a busy machine (conftest's ``machine``).
pytestmark = pytest.mark.usefixtures("machine")


def die() -> None:
    os._exit(7)


def test_the_waiting_thread_reads_answers(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(max_workers=1)
    assert submit(pool, noop).result(timeout=60) is None
    settled_in: list[threading.Thread] = []
    for _ in range(300):
        future = submit(pool, noop)
        future.add_done_callback(lambda _f: settled_in.append(threading.current_thread()))
        assert future.result(timeout=60) is None
    # Each answer is settled by the thread that read it: the reader thread, or this one
    # when it waited first (an answer can come before the wait on a loaded machine, so
    # not every one: but out of 300, some).
    assert threading.current_thread() in settled_in
    assert len(settled_in) == 300


def told_to_poll() -> bool:
    """In a worker: whether the call running (the last CALL its loop took in) told it a CPU
    is spare, i.e. whether it polls for its next call (``protocol.SPARE``, ``Spin.told``)."""
    import gc
    import sys

    serve = sys.modules["_jupyter_runtimeenv_serve"]
    (loop,) = [o for o in gc.get_objects() if isinstance(o, serve.Worker)]
    told: bool = loop.spin.told
    return told


def test_the_worker_polls_for_its_next_call_as_the_driver_read_the_machine(
    make_pool: Callable[..., Pool], machine: str
) -> None:
    """Both ends poll or neither: each call tells the worker what the driver's gauge read
    (``protocol.SPARE``). Before, the worker read the real machine itself, at other instants
    than the driver (no ``Spin.told``: the call raised)."""
    pool = make_pool(max_workers=1)
    spare = machine == "spare CPU"
    for _ in range(3):
        assert submit(pool, told_to_poll).result(timeout=60) is spare


def test_output_before_an_answer_goes_to_its_own_call_first(
    make_pool: Callable[..., Pool],
) -> None:
    """Each call's line reaches its own target before its result: on the waiter's short
    path for an idle worker's one call (no second poll for output, test_idle_path.py) and
    on the general one (the line's pipe seen with the answer)."""
    pool = make_pool(max_workers=1)
    for value in range(100):
        out = io.StringIO()
        target = OutputTarget("echo", out, io.StringIO(), contextvars.copy_context())
        future: RemoteFuture[Any] = RemoteFuture("echo")
        task = Task(b"", future, target)
        task.payload = dump_call(task.id, echo, (value,), {}, "echo")
        assert pool.submit(task)
        assert future.result(timeout=60) == value
        assert out.getvalue().endswith(f") line {value}\n"), (value, out.getvalue())


def test_a_death_and_a_cancel_while_the_waiter_reads_still_settle(
    make_pool: Callable[..., Pool],
) -> None:
    pool = make_pool(max_workers=1)
    assert submit(pool, noop).result(timeout=60) is None
    with pytest.raises(BrokenWorker):
        submit(pool, die).result(timeout=60)
    assert submit(pool, noop).result(timeout=60) is None  # a new worker
    # Cancelled from another thread while this one waits (a call within the window, and
    # one longer than it): the wait ends with the cancel.
    for seconds in (0.003, 0.5):
        future = submit(pool, nap, seconds)
        threading.Timer(0.001, future.cancel).start()
        with contextlib.suppress(CancelledError):
            assert future.result(timeout=60) == "rested"  # if it was done before the cancel
        assert future.done()
    assert submit(pool, nap, 0.0).result(timeout=60) == "rested"


# An interrupt that lands in a weakref callback or a finalizer run during the wait (a
# WeakSet's _remove, seen once under a CPU hog) is not raised by Python but reported as
# "Exception ignored", which pytest turns into a failure; it is lost as a real Ctrl-C there
# would be, and what this test checks (no call left hanging) holds either way.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_interrupts_anywhere_in_result_leave_no_call_hanging(
    make_pool: Callable[..., Pool],
) -> None:
    pool = make_pool(max_workers=1)
    assert submit(pool, noop).result(timeout=60) is None
    armed = False

    def interrupt(_signum: int, _frame: Any) -> None:
        if armed:
            raise KeyboardInterrupt

    futures = []
    interrupts = 0
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        for index in range(600):
            future = submit(pool, noop)
            futures.append(future)
            try:
                armed = True
                # somewhere in the wait: before the answer, while it is read, after it
                signal.setitimer(signal.ITIMER_REAL, 1e-6 * (1 + (index * 7) % 150))
                try:
                    future.result(timeout=60)
                finally:
                    armed = False
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except KeyboardInterrupt:
                interrupts += 1
                # the next call finds a worker again (the interrupted one may have gone)
                assert submit(pool, noop).result(timeout=60) is None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert interrupts  # the timer did fire inside result()
    deadline = time.monotonic() + 60
    while not all(f.done() for f in futures) and time.monotonic() < deadline:
        time.sleep(0.05)
    hanging = [f for f in futures if not f.done()]
    assert not hanging, f"{len(hanging)} of {len(futures)} calls never settled"
    for future in futures:
        if not future.cancelled():
            # BrokenWorker: its answer was being read when the interrupt came (the worker
            # went with it)
            with contextlib.suppress(BrokenWorker):
                assert future.result(timeout=0) is None
    assert submit(pool, noop).result(timeout=60) is None
