"""The agent's core: its state, its start and stop, and the events it publishes.

Who calls it: nobody directly; ``RuntimeEnvAgent`` (``agent.py``) is made of this and its
rooms, ``building.py`` (build orchestration, eviction) and ``queries.py`` (status, listings,
logs). What it owns: the constructor (every argument of ``RuntimeEnvAgent``), the cache
opened at ``start`` and closed at ``stop``, the tasks to cancel at stop, the state machine,
and publishing: build events on the ``EventBus``, holder changes to their listeners.
Everything here runs on the agent's loop; blocking calls go to a thread.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from ..errors import CacheUnavailable, EnvNotFound, RuntimeEnvError
from ..plugins import _store
from ..plugins.registry import PluginRegistry, default_registry
from ..spec import TRUSTED, SpecPolicy
from ..spec.ids import is_env_id
from .build import EnvLog
from .cache import Cache
from .events import Event, EventBus, Listener
from .limits import Limiter
from .parsing import DEFAULT_MAX_PARSES, DEFAULT_PARSE_TIMEOUT, ParseRunner
from .private import describe
from .resources import Resources
from .sizes import Sizes
from .state import EnvRecord, EnvStateMachine, Transition

DEFAULT_MAX_CACHE_BYTES = 10 * 2**30

_Agent = TypeVar("_Agent", bound="AgentCore")


class AgentCore:
    """What every room of ``RuntimeEnvAgent`` shares (its docstring says what the arguments
    mean)."""

    def __init__(
        self,
        cache_dir: str | os.PathLike[str] | None = None,
        *,
        max_cache_bytes: int = DEFAULT_MAX_CACHE_BYTES,
        max_concurrent_installs: int = 2,
        max_concurrent_downloads: int = 4,
        build_timeout: float | None = None,
        registry: PluginRegistry | None = None,
        failure_ttl: float = 30.0,
        policy: SpecPolicy = TRUSTED,
        parse_timeout: float | None = DEFAULT_PARSE_TIMEOUT,
        max_concurrent_parses: int = DEFAULT_MAX_PARSES,
    ) -> None:
        self._cache_dir = cache_dir
        self.policy = policy
        self.max_cache_bytes = max_cache_bytes
        self.build_timeout = build_timeout
        self.registry = registry or default_registry()
        self.limiter = Limiter(max_concurrent_installs, max_concurrent_downloads)
        #: Where specs are parsed from a loop: daemon threads, bounded in number and time.
        self.parses = ParseRunner(max_concurrent_parses, parse_timeout)
        self.events = EventBus()
        self._machine = EnvStateMachine(failure_ttl)
        self._cache: Cache | None = None
        self._builds: dict[str, asyncio.Task[None]] = {}
        self._done: dict[str, asyncio.Future[None]] = {}
        self._resources = Resources(lambda: self.cache, self.limiter, self.registry)
        self._logs: dict[str, EnvLog] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._gc_lock = asyncio.Lock()
        self._stopping = False
        self._holder_listeners: list[Callable[[str], None]] = []
        self._detach_store: Callable[[], None] = lambda: None
        self._sizes = Sizes()

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Open the cache and sweep what interrupted builds left. Called by the owner."""
        if self._cache is None:
            cache = await asyncio.to_thread(Cache, self._cache_dir)  # CacheUnavailable
            try:
                await asyncio.to_thread(cache.sweep)
                await asyncio.to_thread(_store.prepare, cache.root)
            except (OSError, sqlite3.Error) as exc:
                await asyncio.to_thread(cache.close)
                raise CacheUnavailable(str(cache.root), describe(exc, cache.root)) from exc
            self._cache = cache
            # Specs parsed in this process store what they hash into this cache (one pass).
            self._detach_store = _store.attach(cache.root)

    async def stop(self) -> None:
        """Cancel every build (killing its processes), drop this process's references, close."""
        self._stopping = True
        tasks = [*self._builds.values(), *self._resources.tasks(), *self._background]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(self._sizes.stop)
        self.events.close()
        await asyncio.to_thread(self._detach_store)  # removes spare trees: blocking
        if self._cache is not None:
            cache, self._cache = self._cache, None
            await asyncio.to_thread(cache.drop_refs_of_pid, os.getpid())
            await asyncio.to_thread(cache.close)

    async def __aenter__(self: _Agent) -> _Agent:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def cache(self) -> Cache:
        if self._cache is None:
            raise RuntimeEnvError("the agent is not started (use 'async with' or 'await start()')")
        return self._cache

    # -- events ------------------------------------------------------------------------------

    def subscribe(self) -> AsyncIterator[Event]:
        return self.events.subscribe()

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        return self.events.add_listener(listener)

    def on_holders(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call ``listener(env_id)`` (on the loop; it must not block) whenever a reference to
        an env is taken or dropped; returns its remover. Apart from the event bus: holders
        are bookkeeping for observers (the sidebar), not build progress."""
        self._holder_listeners.append(listener)
        return lambda: self._holder_listeners.remove(listener)

    def _holders_changed(self, env_id: str) -> None:
        for listener in list(self._holder_listeners):
            listener(env_id)

    def _step(self, env_id: str, step: str, **info: Any) -> None:
        if self._machine.get(env_id) is None:
            return
        entry = self._machine.step(env_id, step, **info)
        self._publish(env_id, "step", step=step, **entry)

    def _publish_state(self, transition: Transition, **extra: Any) -> None:
        self._publish(
            transition.env_id,
            "state",
            old=transition.old.value if transition.old else None,
            state=transition.new.value,
            **extra,
        )

    def _publish(self, env_id: str, kind: Any, **data: Any) -> None:
        self.events.publish(Event(kind, env_id, data))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- records ----------------------------------------------------------------------------

    async def _known(self, env_id: str) -> bool:
        return await asyncio.to_thread(self.cache.knows_env, env_id)

    def _record(self, env_id: str) -> EnvRecord:
        record = self._machine.get(env_id)
        if record is None:
            raise EnvNotFound(env_id)
        return record


def check_id(env_id: str) -> None:
    """``EnvNotFound`` for anything but a whole env id."""
    # Whole ids only here: prefixes are resolved first (``resolve_id``).
    if not is_env_id(env_id):
        raise EnvNotFound(f"no environment {str(env_id)[:80]!r} (an env id is 64 hex digits)")
