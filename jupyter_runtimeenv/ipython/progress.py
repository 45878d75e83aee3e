"""Build an environment now, printing its steps and installer lines as they come.

Who calls it: ``%runtime_env`` when the new default's ``config.eager_install`` is true.
With the embedded agent the build's events (``agent.add_listener``) are queued by the
agent's loop thread and printed by the calling thread, so every line lands in the cell
that ran the magic; with the server's agent (REST, no event stream to the kernel) only a
concise line before and the summary after are printed.

Given a ``BuildView`` (the ``BuildStatusWidget`` of ``widget.py``), the same events go to
it instead of ``out``; with the server's agent it is fed by polling ``GET envs/{id}`` and
the build log every ``POLL_SECONDS`` until the build ends. This module knows the view only
by that protocol: ``widget.py`` depends on this one, not the other way round.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from ..agent.events import Event
from ..client import AgentClient, EmbeddedClient
from ..context import EnvContext
from ..errors import BuildError, RemoteInterrupt, RuntimeEnvError
from ..spec import RuntimeEnvSpec

__all__ = ["BuildSummary", "BuildView", "build_now", "format_event", "kept", "step_label"]

#: The state a build widget ends in when the cell stopped waiting (the build goes on).
INTERRUPTED = "INTERRUPTED"
#: How often the widget asks the server's agent for the build's state and log.
POLL_SECONDS = 0.3


class BuildView(Protocol):
    """What shows a build live (``BuildStatusWidget``): fed events or snapshots, refreshed
    while it runs, finished with the outcome."""

    def handle(self, event: Event) -> None: ...

    def apply_status(self, env: dict[str, Any], log: str) -> None: ...

    def refresh(self, *, force: bool = False) -> None: ...

    def finish(self, state: str, seconds: float, error: dict[str, Any] | None = None) -> None: ...


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


def build_now(
    spec: RuntimeEnvSpec,
    client: AgentClient,
    holder: str,
    out: TextIO,
    widget: BuildView | None = None,
    *,
    name: str | None = None,
) -> BuildSummary:
    """Acquire ``spec`` for ``holder`` through ``client``, printing progress to ``out``
    (or showing it in ``widget``, which is finished with the outcome either way).

    Raises what the acquisition raises (``BuildError``, ``AgentUnavailable`` ...). An
    interrupt while it waits raises ``RemoteInterrupt``: one line saying that the env
    ``name`` (``None``: the default) stays as it was and the build goes on; the widget ends
    ``INTERRUPTED`` and ``holder``'s reference is dropped.
    """
    events: queue.Queue[Event] = queue.Queue()
    unsubscribe: Callable[[], None] | None = None
    env_id = spec.env_id
    if isinstance(client, EmbeddedClient):
        unsubscribe = client.agent.add_listener(
            lambda event: events.put(event) if event.env_id == env_id else None
        )
    elif widget is None:
        print(f"building {env_id[:12]} on the Jupyter server's agent ...", file=out)
    poll = _poller(client, env_id, widget) if widget is not None and unsubscribe is None else None
    started = time.perf_counter()
    built = False
    future = _in_thread(lambda: client.acquire_sync(spec, holder))
    try:
        next_poll = started
        while True:
            done = future.done()
            try:
                while True:
                    event = events.get(timeout=0 if done or poll else 0.1)
                    built = built or (event.kind == "state" and event.data["state"] == "BUILDING")
                    if widget is not None:
                        widget.handle(event)
                        continue
                    text = format_event(event)
                    if text is not None:
                        print(text, file=out, flush=True)
            except queue.Empty:
                pass
            if poll is not None and (done or time.perf_counter() >= next_poll):
                next_poll = time.perf_counter() + POLL_SECONDS
                poll()
            if done:
                break
            if widget is not None:
                widget.refresh()  # output lines coalesced since the last push
            if poll is not None:
                wait([future], timeout=POLL_SECONDS)
        try:
            context = future.result()
        except BuildError as exc:
            if widget is not None:
                widget.finish("FAILED", time.perf_counter() - started, exc.to_json())
            raise
        except BaseException:
            if widget is not None:
                widget.finish("FAILED", time.perf_counter() - started)
            raise
    except KeyboardInterrupt:
        # The stop button while the cell waited: the build goes on (another notebook may
        # wait for it too), this cell stops waiting and lets go of its reference.
        if widget is not None:
            widget.finish(INTERRUPTED, time.perf_counter() - started)
        _let_go(future, client, env_id, holder)
        raise RemoteInterrupt(interrupted_message(env_id, name)) from None
    finally:
        if unsubscribe is not None:
            unsubscribe()
    cached = unsubscribe is not None and not built
    seconds = time.perf_counter() - started
    if widget is not None:
        widget.finish("READY", seconds)
    return BuildSummary(spec.env_id, context, seconds, cached)


def interrupted_message(env_id: str, name: str | None) -> str:
    """What an interrupted ``%runtime_env`` says, in one line."""
    return (
        f"runtime_env: stopped waiting for the build of {env_id[:12]}; {kept(name)} (the"
        " build goes on in the background: run the cell again to use it)"
    )


def _let_go(future: Future[EnvContext], client: AgentClient, env_id: str, holder: str) -> None:
    """Drop ``holder``'s reference now and again once the acquisition ends (the request may
    not have reached the agent yet), on a daemon thread: nothing holds the env for a cell
    that stopped waiting, and the interrupted cell returns at once."""

    def release() -> None:
        with contextlib.suppress(RuntimeEnvError, OSError):
            client.release_sync(env_id, holder)

    def run() -> None:
        release()
        wait([future])
        release()

    threading.Thread(target=run, name="runtime-env-let-go", daemon=True).start()


def _poller(client: AgentClient, env_id: str, widget: BuildView) -> Callable[[], None] | None:
    """A function feeding the widget a snapshot of ``env_id`` from a client that can tell one
    (the server's: ``env_status_sync`` and ``log_sync``); ``None`` for others."""
    status = getattr(client, "env_status_sync", None)
    log = getattr(client, "log_sync", None)
    if status is None or log is None:
        return None

    def poll() -> None:
        try:
            env = status(env_id)
            text = log(env_id)
        except RuntimeEnvError:  # not known yet (the POST is on its way), or unreachable
            return
        widget.apply_status(env, text)

    return poll


def kept(name: str | None) -> str:
    """What a failed ``%runtime_env`` leaves, in the words of someone running a notebook."""
    if name:
        return f"the env {name!r} stays as it was"
    return "this notebook keeps the environment it had"


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
    step = step_label(data)
    if status == "running":
        return f"  > {step}"
    if status == "done":
        seconds = _duration(data)
        return f"  + {step}" + (f" ({seconds:.1f} s)" if seconds is not None else "")
    if status in ("cached", "failed", "cancelled"):
        return f"  {'x' if status == 'failed' else '+'} {step} ({status})"
    return None


def step_label(entry: dict[str, Any]) -> str:
    """A step as users read it: the plugin's ``label`` (``pip: greeting==1.0``), else its key."""
    return str(entry.get("label") or entry.get("step", ""))


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
