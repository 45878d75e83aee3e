"""What a pool learns from its workers' answers: how long each function's calls take,
which decides which calls may share a worker's pipeline, and which modules its calls
import, which its next workers import before their first call. Plain data; the pool keeps
one ``Habits`` and uses it under its lock (see ``Pool``).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from .output import OutputTarget

if TYPE_CHECKING:
    from .future import Task

#: Calls a worker holds at most (the one it runs included); 1 turns pipelining off. Chosen
#: with ``benchmarks/bench_pipeline.py`` (see docs/workers.md).
PIPELINE_DEPTH = 8
#: A function whose calls take less than this (seconds, decaying maximum) is pipelined.
SHORT_CALL = 0.005
#: Modules a pool learns at most (a new worker imports them before its first call).
MAX_LEARNED = 5000
_MAX_TIMED_FUNCTIONS = 1024


class Habits:
    """Per function key, a decaying maximum of its calls' durations; the modules learned,
    in the order they were first imported (a dict as an ordered set)."""

    def __init__(self, learn_imports: bool = True) -> None:
        self.learn_imports = learn_imports
        #: Below this (seconds) a function counts as short (tests raise it: the durations a
        #: loaded machine reports must not decide what they check).
        self.short_call = SHORT_CALL
        self.durations: dict[bytes, float] = {}
        self.imports: dict[str, None] = {}

    def timed(self, key: bytes, seconds: float) -> None:
        """A call of function ``key`` took ``seconds``: a long one counts at once, short
        ones bring the mark down by a fifth each."""
        durations = self.durations
        old = durations.get(key)
        durations[key] = seconds if old is None else max(seconds, old * 0.8)
        if len(durations) > _MAX_TIMED_FUNCTIONS:
            del durations[next(iter(durations))]

    def short(self, task: Task) -> bool:
        """Whether ``task``'s function is known to be short (a Dask node's raw task never is:
        its output is told apart per task)."""
        if task.raw:
            return False
        duration = self.durations.get(task.call.key)
        return duration is not None and duration < self.short_call

    def may_follow(self, held: deque[Task], task: Task) -> bool:
        """Whether ``task`` may wait behind the calls a worker ``held``: it and the one
        running are short, and its output goes where the last one's goes."""
        return (
            self.short(task) and self.short(held[0]) and same_output(held[-1].output, task.output)
        )

    def learned(self, modules: list[str]) -> None:
        if not self.learn_imports:
            return
        for module in modules:
            if len(self.imports) >= MAX_LEARNED:
                break
            self.imports[module] = None

    def preload(self) -> list[str]:
        """What a new worker imports before its first call."""
        return list(self.imports) if self.learn_imports else []

    def stop_learning(self) -> None:
        """A worker died (or hung) importing the list: the next ones start without it."""
        self.learn_imports = False
        self.imports.clear()


def same_output(a: OutputTarget, b: OutputTarget) -> bool:
    """Whether two calls' output goes to the same place (same cell, streams and name): only
    then may they share a worker's pipeline (their output is read in one batch)."""
    if a is b:
        return True
    if type(a) is not OutputTarget or type(b) is not OutputTarget:
        return False  # a subclass (a Dask node's events) tells tasks apart: never mixed
    return (
        a.name == b.name
        and a.stdout is b.stdout
        and a.stderr is b.stderr
        and a.context == b.context  # the same variables: O(1) for copies of one context
    )
