"""Where the milliseconds of a forked worker's first result go (the "W6 cold" shape).

    .venv/bin/python benchmarks/bench_fork.py [--reps N]

Each run: a new ``LocalExecutor`` and a new env (``env_vars`` with a fresh value) on one
embedded agent, one ``noop`` call, its result. The template of this interpreter is started
first and left out, as are the first three runs. The phases are read in the driver by
wrapping the methods that mark them (time since the call was submitted, medians):

- ``acquired``: the agent answered the pool's acquire (a new ``env_vars`` env: built);
- ``fork sent`` / ``forked``: ``zygote.Template.fork`` asked the template and got the pid;
- ``hello``: the worker's HELLO was read (the fork set itself up, the bootstrap ran);
- ``result``: ``future.result()`` returned (call sent, run, answered, read, settled).

Then run.py's rows of the same shape (``ours.py``), "W6 cold" (the phases' workload) and "W6
at once" (``%runtime_env`` then the call in the same cell), alternating round by round, and
right after them their floor "W6 fork" (the bare prototype: a template with cloudpickle
imported forks, runs the function, answers); medians, with the load average (the machine is
shared).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ours import Ours, fork_first_results

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.agent import RuntimeEnvAgent
from jupyter_runtimeenv.client import EmbeddedClient
from jupyter_runtimeenv.workers import process, protocol, zygote

PHASES = ("acquired", "fork sent", "forked", "hello", "result")


def noop() -> None:
    return None


class Marks:
    def __init__(self) -> None:
        self.t0 = 0.0
        self.at: dict[str, float] = {}

    def mark(self, name: str) -> None:
        self.at.setdefault(name, time.perf_counter())

    def wrap(self, owner: Any, attr: str, name: str, *, after: bool) -> None:
        original: Callable[..., Any] = getattr(owner, attr)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if not after:
                self.mark(name)
            result = original(*args, **kwargs)
            if after:
                self.mark(name)
            return result

        setattr(owner, attr, wrapped)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--rows", type=int, default=10, help="rounds of the run.py rows")
    args = parser.parse_args()
    phases(args.reps)
    if args.rows:
        rows(args.rows)


def rows(rounds: int) -> None:
    """run.py's W6 cold / W6 at once / W6 fork rows, round by round."""
    times: dict[str, list[float]] = {"W6 cold": [], "W6 at once": [], "W6 fork": []}
    with tempfile.TemporaryDirectory() as tmp:
        ours = Ours(Path(tmp), Path(tmp), Path(tmp), {"start": 1})
        with ours.agent() as client:
            for i in range(rounds + 1):
                env = {"env_vars": {"JRE_BENCH_RUN": uuid.uuid4().hex}}
                cold = ours.late(client, env)
                env = {"env_vars": {"JRE_BENCH_RUN": uuid.uuid4().hex}}
                at_once = ours.early(client, env, pause=0)
                if i:  # the first round starts the templates
                    times["W6 cold"].append(cold)
                    times["W6 at once"].append(at_once)
        zygote.stop_all()
        times["W6 fork"] = fork_first_results(rounds)
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f}; medians of {rounds} rounds")
    for name, values in times.items():
        low, high = min(values) * 1000, max(values) * 1000
        median = statistics.median(values) * 1000
        print(f"{name:10s} {median:7.2f} ms ({low:.2f}-{high:.2f})")


def phases(reps: int) -> None:
    marks = Marks()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        cache.mkdir(mode=0o700)
        client = EmbeddedClient(RuntimeEnvAgent(cache))
        try:
            client.acquire_sync({"env_vars": {"JRE_BENCH": "up"}}, "bench")
            marks.wrap(client, "acquire_sync", "acquired", after=True)
            marks.wrap(zygote.Template, "fork", "fork sent", after=False)
            marks.wrap(zygote.Template, "fork", "forked", after=True)
            notice = process.WorkerProcess._notice

            def noticed(worker: process.WorkerProcess, kind: int, payload: bytes) -> None:
                if kind == protocol.HELLO:
                    marks.mark("hello")
                notice(worker, kind, payload)

            process.WorkerProcess._notice = noticed  # type: ignore[method-assign]
            rows = []
            for i in range(reps + 4):
                executor = jre.LocalExecutor(
                    acquire=client.acquire_sync, release=client.release_sync
                )
                jre.init(executor=executor)
                try:
                    marks.at.clear()
                    env = {"env_vars": {"JRE_BENCH_RUN": uuid.uuid4().hex}}
                    t0 = time.perf_counter()
                    jre.remote(noop).options(runtime_env=env).remote().result(120)
                    marks.mark("result")
                    if i == 0:  # the template started with this one: it is spawned
                        while not [t for t in zygote.templates() if t.state == "ready"]:
                            time.sleep(0.01)
                    elif i >= 4:
                        rows.append({k: (v - t0) * 1000 for k, v in marks.at.items()})
                finally:
                    executor.shutdown()
                    jre.shutdown()
        finally:
            client.close()
            zygote.stop_all()
    forked = [r for r in rows if "forked" in r]
    print(f"load average {os.getloadavg()[0]:.1f}; {len(forked)} of {len(rows)} runs forked")
    for name in PHASES:
        values = [r[name] for r in forked if name in r]
        if values:
            print(f"{name:10s} {statistics.median(values):7.2f} ms after submit (median)")


if __name__ == "__main__":
    sys.exit(main())
