"""Build an environment now, printing its steps and installer lines as they come.

Who calls it: ``%runtime_env`` when the new default's ``config.eager_install`` is true.
With the embedded agent the build's events (``agent.add_listener``) are queued by the
agent's loop thread and printed by the calling thread, so every line lands in the cell
that ran the magic; with the server's agent (REST, no event stream to the kernel) only a
concise line before and the summary after are printed.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TextIO

from ..agent.events import Event
from ..client import AgentClient, EmbeddedClient
from ..context import EnvContext
from ..spec import RuntimeEnvSpec

__all__ = ["BuildSummary", "build_now", "format_event"]


@dataclass(frozen=True)
class BuildSummary:
    env_id: str
    context: EnvContext
    seconds: float
    #: Nothing was built: the env was ready (in this agent or its cache) already.
    cached: bool

    def line(self) -> str:
        how = "cached, " if self.cached else ""
        return (
            f"runtime env {self.env_id[:12]} ready: python {self.context.python}"
            f" ({how}{self.seconds:.2f} s)"
        )


def build_now(spec: RuntimeEnvSpec, client: AgentClient, holder: str, out: TextIO) -> BuildSummary:
    """Acquire ``spec`` for ``holder`` through ``client``, printing progress to ``out``.

    Raises what the acquisition raises (``BuildError``, ``AgentUnavailable`` ...).
    """
    events: queue.Queue[Event] = queue.Queue()
    unsubscribe: Callable[[], None] | None = None
    if isinstance(client, EmbeddedClient):
        env_id = spec.env_id
        unsubscribe = client.agent.add_listener(
            lambda event: events.put(event) if event.env_id == env_id else None
        )
    else:
        print(f"building {spec.env_id[:12]} on the Jupyter server's agent ...", file=out)
    started = time.perf_counter()
    built = False
    try:
        future = _in_thread(lambda: client.acquire_sync(spec, holder))
        while True:
            done = future.done()
            try:
                while True:
                    event = events.get(timeout=0 if done else 0.1)
                    built = built or (event.kind == "state" and event.data["state"] == "BUILDING")
                    text = format_event(event)
                    if text is not None:
                        print(text, file=out, flush=True)
            except queue.Empty:
                pass
            if done:
                break
        context = future.result()
    finally:
        if unsubscribe is not None:
            unsubscribe()
    cached = unsubscribe is not None and not built
    return BuildSummary(spec.env_id, context, time.perf_counter() - started, cached)


def format_event(event: Event) -> str | None:
    """One printed line for an agent event, or ``None`` for events not worth a line."""
    data = event.data
    if event.kind == "state":
        if data["state"] == "BUILDING":
            return f"building runtime env {event.env_id[:12]}"
        return None
    if event.kind == "log":
        return f"    {data['line']}"
    status = data.get("status")
    step = data.get("step", "")
    if status == "running":
        return f"  > {step}"
    if status == "done":
        seconds = _duration(data)
        return f"  + {step}" + (f" ({seconds:.1f} s)" if seconds is not None else "")
    if status in ("cached", "failed", "cancelled"):
        return f"  {'x' if status == 'failed' else '+'} {step} ({status})"
    return None


def _duration(data: dict[str, Any]) -> float | None:
    started, ended = data.get("started"), data.get("ended")
    if isinstance(started, (int, float)) and isinstance(ended, (int, float)):
        return max(0.0, float(ended) - float(started))
    return None


def _in_thread(call: Callable[[], EnvContext]) -> Future[EnvContext]:
    """Run ``call`` in a daemon thread: an interrupted cell must not wait for the build."""
    future: Future[EnvContext] = Future()

    def run() -> None:
        try:
            future.set_result(call())
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name="runtime-env-build", daemon=True).start()
    return future
