"""Task progress (``progress``, ``wait(progress=True)``) over real tasks in real workers."""

from __future__ import annotations

import io
import signal
import threading
import time
from collections.abc import Iterator

import pytest
from processes import alive

import jupyter_runtimeenv as jre
from jupyter_runtimeenv import api
from jupyter_runtimeenv.ipython.tasks import TaskProgress, TaskProgressWidget, count
from jupyter_runtimeenv.workers import LocalExecutor


@jre.remote
def nap(seconds: float, fail: bool = False) -> float:
    import os
    import time

    time.sleep(seconds)
    if fail:
        raise ValueError("asked to fail")
    return os.getpid()


def test_text_progress_ends_with_the_counts(capsys: pytest.CaptureFixture[str]) -> None:
    futures = [nap.remote(0.05 * (i % 3), fail=i == 4) for i in range(8)]
    assert jre.progress(futures, widget=False) == futures
    assert all(f.done() for f in futures)
    out = capsys.readouterr().out
    # Not a terminal: one final line, no carriage returns.
    assert out.startswith("tasks: 8/8 finished (7 done, 1 failed, 0 running, 0 queued) in ")
    assert out.endswith("/s\n")
    assert "\r" not in out


def test_a_terminal_gets_one_line_rewritten_in_place() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    futures = [nap.remote(0.3) for _ in range(3)]
    tracker = TaskProgress(futures, widget=False, out=out)
    tracker.wait(len(futures))
    text = out.getvalue()
    assert text.count("\n") == 1
    assert text.endswith("\n")
    updates = text.split("\r")[1:]
    assert len(updates) >= 2  # refreshed while waiting, then the final line
    assert updates[-1].startswith("tasks: 3/3 finished (3 done")


def test_wait_with_progress_returns_like_wait(capsys: pytest.CaptureFixture[str]) -> None:
    futures = [nap.remote(0.0), nap.remote(5.0)]
    ready, not_ready = jre.wait(futures, num_returns=1, timeout=30, progress=True)
    assert ready == futures[:1]
    assert not_ready == futures[1:]
    assert "tasks: 1/2 finished (1 done, 0 failed" in capsys.readouterr().out
    futures[1].cancel()


def test_the_widget_model_shows_the_segments_and_counts() -> None:
    futures = [nap.remote(0.0, fail=i == 0) for i in range(4)]
    jre.wait(futures, num_returns=4, timeout=60)
    widget = TaskProgressWidget()
    try:
        counts = count(futures, time.monotonic() - 2.0)
        widget.show(counts)
        value = widget.html.value
        assert 'title="done: 3" style="width:75.00%' in value
        assert 'title="failed: 1" style="width:25.00%' in value
        assert "running" not in value.split('<div style="font-family')[0]  # no empty segment
        assert "tasks: 4/4 finished (3 done, 1 failed, 0 running, 0 queued) in 2.0 s" in value
        bundle = widget._repr_mimebundle_()
        assert bundle["text/plain"] == counts.line()
    finally:
        widget.close()


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt here, as in a kernel, however the suite was started: a
    command run with ``&`` by a shell without job control inherits SIGINT ignored, and Python
    keeps an ignored SIGINT as it found it (the interrupt below then did nothing)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("sigint_raises")
def test_an_interrupt_cancels_the_tasks_and_kills_their_workers() -> None:
    pids_future = nap.remote(0.0)
    jre.get(pids_future, timeout=60)
    futures = [nap.remote(60.0) for _ in range(2)]
    deadline = time.monotonic() + 30
    while not all(f.running() for f in futures) and time.monotonic() < deadline:
        time.sleep(0.05)
    executor = api._executor()
    assert isinstance(executor, LocalExecutor)
    pids = [pid for pool in executor.pools for pid in pool.pids]
    assert pids
    main = threading.main_thread().ident
    assert main is not None
    timer = threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt) as info:
        jre.progress(futures, widget=False)
    assert info.value.args == ("cancelled 2 remote tasks of nap",)
    assert all(f.cancelled() for f in futures)
    gone_by = time.monotonic() + 3.0
    while any(alive(p) for p in pids):
        assert time.monotonic() < gone_by, "the workers outlived the interrupt"
        time.sleep(0.05)
