"""The driver's reused daemon threads (``workers/threads.py``)."""

from __future__ import annotations

import contextvars
import os
import threading
from typing import Any

import pytest

from jupyter_runtimeenv.workers import threads

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


def test_a_job_runs_named_and_a_finished_jobs_thread_takes_the_next() -> None:
    seen: list[tuple[str, int]] = []

    def record() -> None:
        seen.append((threading.current_thread().name, threading.get_ident()))

    first = threads.run(record, "first-job")
    first.join(10)
    assert not first.is_alive()
    second = threads.run(record, "second-job")
    second.join(10)
    assert [name for name, _ in seen] == ["first-job", "second-job"]
    assert seen[0][1] == seen[1][1]  # no new thread: the idle one took it


def test_a_job_knows_it_is_current_only_inside_its_thread() -> None:
    inside: list[bool] = []
    job: list[threads.Job] = []
    started = threading.Event()

    def check() -> None:
        started.wait(10)
        inside.append(job[0].is_current())

    job.append(threads.run(check, "check"))
    assert not job[0].is_current()
    started.set()
    job[0].join(10)
    assert inside == [True]
    assert not job[0].is_current()


def test_each_job_has_a_fresh_context_and_its_error_goes_to_excepthook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hooked: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", hooked.append)
    values: list[str] = []

    def set_and_fail() -> None:
        VAR.set("set by a job")
        raise ValueError("in a job")

    threads.run(set_and_fail, "failing").join(10)
    threads.run(lambda: values.append(VAR.get()), "reading").join(10)
    assert values == ["unset"]
    assert [type(h.exc_value) for h in hooked] == [ValueError]


def test_a_forked_child_runs_jobs_in_threads_of_its_own() -> None:
    threads.run(lambda: None, "warm").join(10)  # an idle thread in this process
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            done = threads.run(lambda: None, "in the child")
            done.join(5)
            os.write(write, b"ok" if not done.is_alive() else b"hung")
        finally:
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 16) == b"ok"
    finally:
        os.close(read)
        os.waitpid(pid, 0)


def test_with_wait_the_job_runs_before_run_returns() -> None:
    release = threading.Event()
    job = threads.run(lambda: release.wait(10), "waited for", wait=True)
    assert job.started.is_set()
    assert job.is_alive()
    release.set()
    job.join(10)
    assert not job.is_alive()
