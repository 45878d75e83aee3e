"""Helpers of the worker tests, imported by name (``from tests.workers.helpers import ...``):
``from conftest import`` took whichever ``conftest`` module pytest had imported last, so
``pytest tests/workers tests/test_cpuload.py`` failed with an ImportError."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import processes
from processes import worker_children

from jupyter_runtimeenv.workers.future import RemoteFuture, Task
from jupyter_runtimeenv.workers.output import OutputTarget
from jupyter_runtimeenv.workers.pool import Pool
from jupyter_runtimeenv.workers.serialize import dump_call

__all__ = ["submit", "wait_gone", "worker_children"]


def wait_gone(pids: list[int], timeout: float = 10.0) -> None:
    alive = processes.wait_gone(pids, timeout)
    assert not alive, f"processes still alive: {alive}"


def submit(pool: Pool, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Submit straight to a pool (what ``LocalExecutor.submit`` does)."""
    name = getattr(function, "__name__", type(function).__name__)
    future: RemoteFuture[Any] = RemoteFuture(name)
    task = Task(b"", future, OutputTarget.capture(name))
    task.payload = dump_call(task.id, function, args, kwargs, name)
    assert pool.submit(task)
    return future


# Tasks that several test modules run (picklable by reference: this module is importable in
# a worker, as the tests' own are).
def noop() -> None:
    return None


def echo(value: int) -> int:
    print(f"line {value}")
    return value


def nap(seconds: float) -> str:
    time.sleep(seconds)
    return "rested"
