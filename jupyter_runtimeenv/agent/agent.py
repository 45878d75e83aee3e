"""``RuntimeEnvAgent``: builds, caches and hands out environments, on one event loop.

Who calls it: the Jupyter server extension (one agent per server), the embedded client in a
kernel or script when there is no server, the CLI, and tests. Every blocking call (the
cache's files and index, sync plugins) goes to a thread; subprocesses are
``create_subprocess_exec``; the loop is never blocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from ..context import ContextBuilder, EnvContext
from ..errors import (
    BuildError,
    BuildTimeout,
    CacheUnavailable,
    EnvInUse,
    EnvNotFound,
    RuntimeEnvError,
)
from ..plugins import _store
from ..plugins.base import RuntimeEnvPlugin, call_maybe_sync
from ..plugins.registry import PluginRegistry, default_registry
from ..redact import redact_text
from ..spec import TRUSTED, RuntimeEnvSpec, SpecPolicy, parse
from ..spec.ids import check_holder, is_env_id, is_env_id_prefix
from .build import EnvLog
from .cache import Cache
from .events import Event, EventBus, Listener
from .limits import Limiter
from .parsing import DEFAULT_MAX_PARSES, DEFAULT_PARSE_TIMEOUT, ParseRunner
from .private import describe
from .resources import ResourceJob, Resources
from .state import EnvRecord, EnvState, EnvStateMachine, Transition

DEFAULT_MAX_CACHE_BYTES = 10 * 2**30
#: A resource evicted between being found and being pinned is got again, this many times.
_PIN_ATTEMPTS = 3

Active = tuple[str, RuntimeEnvPlugin, Any]


class RuntimeEnvAgent:
    """Builds environments from specs, concurrently, each at most once.

    ``async with RuntimeEnvAgent(cache_dir) as agent: ctx = await agent.get_or_create(spec,
    holder)``. ``build_timeout`` caps every spec's ``config.setup_timeout_seconds``.
    ``policy`` is what specs given to it as data may ask for (``TRUSTED``: the user's own
    process; the Jupyter server's agent is ``SpecPolicy.untrusted``); a ``RuntimeEnvSpec``
    was judged by whoever parsed it.

    Every env id and holder name that comes in is checked against its alphabet first (an id
    that is not hex is ``EnvNotFound``, a bad holder ``InvalidName``): none reaches a path or
    a query unchecked.
    """

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
        self.events.close()
        self._detach_store()
        if self._cache is not None:
            cache, self._cache = self._cache, None
            await asyncio.to_thread(cache.drop_refs_of_pid, os.getpid())
            await asyncio.to_thread(cache.close)

    async def __aenter__(self) -> RuntimeEnvAgent:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def cache(self) -> Cache:
        if self._cache is None:
            raise RuntimeEnvError("the agent is not started (use 'async with' or 'await start()')")
        return self._cache

    # -- requests -------------------------------------------------------------------------

    def parse(self, data: Any, *, policy: SpecPolicy | None = None) -> RuntimeEnvSpec:
        """Parse with this agent's plugins, under ``policy`` (default: the agent's). Blocking
        (may hash files): use a thread on a loop."""
        return parse(data, registry=self.registry, policy=policy or self.policy)

    async def parse_async(self, data: Any, *, policy: SpecPolicy | None = None) -> RuntimeEnvSpec:
        """``parse`` from a loop: in a parse thread (``ParseRunner``), ``SpecError`` past the
        agent's ``parse_timeout``."""
        return await self.parses.run(self.parse, data, policy=policy)

    async def ensure(
        self, spec: RuntimeEnvSpec, holder: str, *, retry: bool = False
    ) -> dict[str, Any]:
        """Take a reference for ``holder`` and start building if needed; return the status
        now (``wait`` for the result)."""
        cache = self.cache
        env_id = spec.env_id
        check_holder(holder)
        if not is_env_id(env_id):
            raise RuntimeEnvError(f"not a parsed spec (env id {env_id[:80]!r}): use parse()")
        record = self._machine.get(env_id)
        if record is None or record.state is EnvState.READY:
            # Another process sharing the cache may have built it, or evicted it.
            found = await asyncio.to_thread(cache.find_env, env_id)
            record = self._machine.get(env_id)  # re-read: others ran during the await
            if found is None and record is not None and record.state is EnvState.READY:
                self._machine.forget(env_id)  # unheld, so nothing is lost: rebuild it
                record = None
            if record is None and found is not None:
                self._machine.adopt(env_id, found[0], found[1], time.time())
                self._publish_state(Transition(env_id, None, EnvState.READY))
        record, must_build, transitions = self._machine.request(
            env_id, spec.to_json(), holder, time.time(), retry=retry
        )
        for transition in transitions:
            self._publish_state(transition)
        if must_build:
            # Registered before any await, so concurrent requests find the build to wait on.
            self._logs[env_id] = self._new_log(env_id)
            done = self._done[env_id] = asyncio.get_running_loop().create_future()
            task = self._builds[env_id] = asyncio.create_task(
                self._build(spec), name=f"build {env_id[:12]}"
            )
            # However the task ends (a task cancelled before it ever ran skips its own
            # finally), its waiters are woken and its record does not stay PENDING.
            task.add_done_callback(lambda _t: self._settle(env_id, record, done))
        new_holder = record.state is not EnvState.FAILED and await asyncio.to_thread(
            cache.add_ref, env_id, holder
        )
        if new_holder:
            self._holders_changed(env_id)
        return record.to_json()

    async def wait(self, env_id: str) -> EnvContext:
        """The env's context once READY; the ``BuildError`` if it failed."""
        _check_id(env_id)
        record = self._record(env_id)
        while record.state in (EnvState.PENDING, EnvState.BUILDING):
            await asyncio.shield(self._done[env_id])
            current = self._record(env_id)  # EnvNotFound: removed meanwhile
            if current is record:
                break
            record = current  # rebuilt meanwhile: wait for the build that counts now
        if record.state is EnvState.FAILED:
            assert record.error is not None
            raise BuildError.from_json(record.error)
        assert record.context is not None
        return EnvContext.from_json(record.context)

    async def get_or_create(
        self, spec: RuntimeEnvSpec | Mapping[str, Any], holder: str, *, retry: bool = False
    ) -> EnvContext:
        """Build ``spec`` if needed (once, whoever else asks) and return its context."""
        if not isinstance(spec, RuntimeEnvSpec):
            spec = await self.parse_async(spec)
        status = await self.ensure(spec, holder, retry=retry)
        return await self.wait(status["env_id"])

    async def release(self, env_id: str, holder: str) -> bool:
        """Drop ``holder``'s reference; unreferenced resources become evictable."""
        _check_id(env_id)
        check_holder(holder)
        held = self._machine.release(env_id, holder)
        stored = await asyncio.to_thread(self.cache.remove_ref, env_id, holder)
        if held or stored:
            self._holders_changed(env_id)
        return held or stored

    async def release_holder(self, holder: str) -> list[str]:
        """Drop every reference of ``holder`` (a kernel that is gone); the env ids released."""
        check_holder(holder)
        released = [r.env_id for r in self._machine.records.values() if holder in r.holders]
        for env_id in released:
            await self.release(env_id, holder)
        return released

    async def remove(self, env_id: str, *, force: bool = False) -> list[str]:
        """Forget an env and delete the resources no other env uses; returns their URIs.

        ``EnvInUse`` while others hold it, unless ``force``. A forced removal deletes the
        env, not its holders' claims: their references stay (a reference's life follows its
        holder's, which still runs), so when a holder uses the env again it is built anew
        and held by all of them, as before; they are released when their holders go.
        """
        _check_id(env_id)
        holders = await asyncio.to_thread(self.cache.holders, env_id)
        record = self._machine.get(env_id)
        # Not "and not holders": references outlive a forced removal (see above), an env
        # that was removed is not found however many holders still claim it.
        if record is None and not await self._known(env_id):
            raise EnvNotFound(env_id)
        if holders and not force:
            raise EnvInUse(
                f"environment {env_id} is held by {', '.join(holders)}; use force to remove it"
            )
        if env_id in self._builds:
            self._builds[env_id].cancel()
            with contextlib.suppress(BaseException):
                await self._builds[env_id]
        self._machine.forget(env_id)
        orphaned = await asyncio.to_thread(self.cache.forget_env, env_id, keep_refs=True)
        removed = []
        for uri in orphaned:
            if await self._evict(uri):
                removed.append(uri)
        self._publish_state(
            Transition(env_id, record.state if record else None, EnvState.PENDING), removed=True
        )
        return removed

    # -- observation -------------------------------------------------------------------------

    async def status(self) -> list[dict[str, Any]]:
        """Every env this agent or its cache knows, with state, holders and steps."""
        out = {env_id: r.to_json() for env_id, r in self._machine.records.items()}
        for env in await asyncio.to_thread(self.cache.envs):
            if env["env_id"] not in out:
                out[env["env_id"]] = {
                    **env,
                    "state": EnvState.READY.value,
                    "error": None,
                    "steps": {},
                }
            else:
                out[env["env_id"]]["holders"] = sorted(
                    {*out[env["env_id"]]["holders"], *env["holders"]}
                )
        return sorted(out.values(), key=lambda e: e.get("created", 0))

    async def summaries(
        self, *, limit: int | None = None, offset: int = 0
    ) -> tuple[list[dict[str, Any]], int]:
        """One page of every env, oldest first, without specs or contexts (``env_status``
        has them), and how many envs there are. Reads no stored spec: its cost does not grow
        with the size of the stored envs."""
        out = {env_id: _summary(r.to_json()) for env_id, r in self._machine.records.items()}
        end = None if limit is None else offset + limit
        if end is None:
            stored = await asyncio.to_thread(self.cache.env_summaries)
            total = None
        else:
            # The first ``end`` of the union are among the records in memory and the first
            # ``end + len(records)`` stored ones (a record may be ordered by a time of its
            # own): a page costs its rows, not the whole cache's.
            stored, count, recorded = await asyncio.to_thread(
                self.cache.env_summaries_page, end + len(out), list(out)
            )
            total = count + len(out.keys() - recorded)
        for env in stored:
            known = out.get(env["env_id"])
            if known is None:
                out[env["env_id"]] = {**env, "state": EnvState.READY.value, "error": None}
            else:
                known["holders"] = sorted({*known["holders"], *env["holders"]})
                # Uses (declares, tasks) are recorded in the index, not in the record.
                known["last_used"] = env.get("last_used")
        ordered = sorted(out.values(), key=lambda e: (e.get("created", 0), e["env_id"]))
        return ordered[offset:end], len(ordered) if total is None else total

    async def touch(self, env_id: str) -> None:
        """Record a use of the env now (a task ran in it): its last use and its resources'
        (least recently used are evicted first)."""
        _check_id(env_id)
        await asyncio.to_thread(self.cache.touch_env, env_id)

    async def knows(self, env_id: str) -> bool:
        """Whether this agent or its cache knows the env ``env_id`` (a whole id)."""
        if not is_env_id(env_id):
            return False
        return self._machine.get(env_id) is not None or await self._known(env_id)

    async def holders_matching(self, prefix: str) -> list[tuple[str, str]]:
        """(env id, holder) of every reference whose holder starts with ``prefix``."""
        refs = await asyncio.to_thread(self.cache.refs)
        for env_id, record in self._machine.records.items():
            refs.extend((env_id, h) for h in record.holders)
        return sorted({(e, h) for e, h in refs if h.startswith(prefix)})

    async def resolve_id(self, text: str) -> str:
        """The env id that ``text`` (a whole id or an unambiguous prefix) names; ``EnvNotFound``
        for anything else, a text outside the hex alphabet included."""
        if not is_env_id_prefix(text):
            raise EnvNotFound(f"no environment {text[:80]!r} (an env id is lowercase hex)")
        if is_env_id(text) and (self._machine.get(text) is not None or await self._known(text)):
            return text
        found = {e for e in self._machine.records if e.startswith(text)}
        found.update(await asyncio.to_thread(self.cache.env_ids_with_prefix, text))
        if len(found) == 1:
            return found.pop()
        if not found:
            raise EnvNotFound(f"no environment {text!r}")
        shown = ", ".join(sorted(i[:12] for i in found)[:10])
        raise EnvNotFound(f"{text!r} is ambiguous: it starts {len(found)} env ids ({shown})")

    async def env_status(self, env_id: str) -> dict[str, Any]:
        """One env (a whole id): state, holders, steps, spec, context once READY."""
        _check_id(env_id)
        record = self._machine.get(env_id)
        stored = await asyncio.to_thread(self.cache.env_row, env_id)
        if record is not None:
            env = record.to_json()
            if stored is not None:
                env["holders"] = sorted({*env["holders"], *stored["holders"]})
                env["last_used"] = stored.get("last_used")
            return env
        if stored is None:
            raise EnvNotFound(env_id)
        return {**stored, "state": EnvState.READY.value, "error": None, "steps": {}}

    async def log(self, env_id: str) -> str:
        """The build log of an env (also after a restart, from its file)."""
        _check_id(env_id)
        if env_id in self._logs:
            return self._logs[env_id].text()
        path = self.cache.log_path(env_id)
        try:
            return await asyncio.to_thread(path.read_text, encoding="utf-8")
        except FileNotFoundError:
            if self._machine.get(env_id) is not None or await self._known(env_id):
                return ""
            raise EnvNotFound(env_id) from None

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

    async def gc(self, max_bytes: int | None = None) -> list[dict[str, Any]]:
        """Evict unreferenced resources, least recently used first, down to ``max_bytes``
        (default: the agent's ``max_cache_bytes``). Returns what was evicted."""
        limit = self.max_cache_bytes if max_bytes is None else max_bytes
        evicted: list[dict[str, Any]] = []
        async with self._gc_lock:
            for item in await asyncio.to_thread(self.cache.eviction_candidates, limit):
                if await self._evict(item.uri):
                    shown = redact_text(item.uri)
                    evicted.append({"uri": shown, "plugin": item.plugin, "size": item.size})
        return evicted

    # -- building --------------------------------------------------------------------------

    def _new_log(self, env_id: str) -> EnvLog:
        return EnvLog(
            self.cache.log_path(env_id),
            lambda step, line: self._publish(env_id, "log", step=step, line=line),
        )

    async def _known(self, env_id: str) -> bool:
        return await asyncio.to_thread(self.cache.knows_env, env_id)

    def _record(self, env_id: str) -> EnvRecord:
        record = self._machine.get(env_id)
        if record is None:
            raise EnvNotFound(env_id)
        return record

    def _active(self, spec: RuntimeEnvSpec) -> list[Active]:
        active: list[Active] = []
        for name, value in spec.fields.items():
            plugin = self.registry.for_field(name)
            if plugin is not None:
                active.append((name, plugin, value))
        for path, value in spec.plugins.items():
            active.append((path, self.registry.by_path(path), value))
        return sorted(active, key=lambda a: (a[1].priority, a[0]))

    def _deadline(self, spec: RuntimeEnvSpec) -> float | None:
        limits = [t for t in (spec.config.setup_timeout_seconds, self.build_timeout) if t]
        return min(limits) if limits else None

    def _settle(self, env_id: str, record: EnvRecord, done: asyncio.Future[None]) -> None:
        """A build task ended: wake its waiters; a build cancelled before it started (a
        DELETE or rebuild right after the request) fails its record instead of leaving it
        PENDING. Only this build's own record and future are touched: a newer build of the
        same env (after a rebuild) has its own."""
        if self._machine.get(env_id) is record and record.state is EnvState.PENDING:
            self._publish_state(self._machine.start(env_id, time.time()))
            self._fail(env_id, BuildError("the build was cancelled", env_id=env_id))
        if not done.done():
            done.set_result(None)

    async def _build(self, spec: RuntimeEnvSpec) -> None:
        env_id = spec.env_id
        cache = self.cache
        log = self._logs[env_id]
        # This build's own future and task: a rebuild may register newer ones for the env.
        done = self._done.get(env_id)
        this = asyncio.current_task()
        self._publish_state(self._machine.start(env_id, time.time()))
        deadline = self._deadline(spec)
        try:
            try:
                context, uris = await asyncio.wait_for(self._build_steps(spec, log), deadline)
            except asyncio.TimeoutError:
                running = [
                    n
                    for n, s in self._machine.records[env_id].steps.items()
                    if s.get("status") in ("running", "cancelled")
                ]
                raise BuildTimeout(
                    f"the build did not finish within {deadline:g} s"
                    " (config.setup_timeout_seconds); every step was cancelled"
                    " and its processes killed",
                    env_id=env_id,
                    step=", ".join(running),
                    output_tail=log.lines[-30:],
                    log_path=str(log.path),
                ) from None
            await asyncio.to_thread(
                cache.record_env, env_id, spec.to_json(), context.to_json(), uris
            )
            self._publish_state(self._machine.succeed(env_id, context.to_json(), time.time()))
        except asyncio.CancelledError:
            self._fail(
                env_id, BuildError("the build was cancelled", env_id=env_id, log_path=str(log.path))
            )
            raise
        except BuildError as exc:
            exc.env_id = exc.env_id or env_id
            exc.log_path = exc.log_path or str(log.path)
            self._fail(env_id, exc)
        except Exception as exc:  # a plugin bug must fail this env, not the agent
            self._fail(
                env_id,
                BuildError(f"{type(exc).__name__}: {exc}", env_id=env_id, log_path=str(log.path)),
            )
        finally:
            with contextlib.suppress(Exception):
                # Pins end with the build (a READY env's record took them over already).
                await asyncio.shield(asyncio.to_thread(cache.unpin_env, env_id))
            with contextlib.suppress(Exception):
                await asyncio.shield(log.flush())
            record = self._machine.get(env_id)
            if record is not None and record.state is EnvState.FAILED:
                # A holder of a failed env holds nothing (they ask again to retry): in the
                # index too, or the env would look held and GC would never take it.
                with contextlib.suppress(Exception):
                    if await asyncio.shield(asyncio.to_thread(cache.drop_refs, env_id)):
                        self._holders_changed(env_id)
            if done is not None and not done.done():
                done.set_result(None)
            if self._builds.get(env_id) is this:
                del self._builds[env_id]
        if not self._stopping and await asyncio.to_thread(cache.total_bytes) > self.max_cache_bytes:
            self._spawn(self.gc())

    def _fail(self, env_id: str, error: BuildError) -> None:
        if (
            env_id in self._machine.records
            and self._machine.records[env_id].state is EnvState.BUILDING
        ):
            self._publish_state(
                self._machine.fail(env_id, error.to_json(), time.time()), error=error.to_json()
            )

    async def _build_steps(self, spec: RuntimeEnvSpec, log: EnvLog) -> tuple[EnvContext, list[str]]:
        """The env's context and its resources' own URIs (steps show them redacted)."""
        env_id = spec.env_id
        active = self._active(spec)
        uris: dict[str, list[str]] = {}
        for name, plugin, value in active:
            uris[name] = list(
                await call_maybe_sync(plugin.uris, value, spec, to_thread=asyncio.to_thread)
            )
        jobs = [
            ResourceJob(spec, log, name, plugin, value, uri)
            for name, plugin, value in active
            for uri in uris[name]
        ]
        tasks = [asyncio.create_task(self._need_resource(job)) for job in jobs]
        try:
            paths = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        ctx = ContextBuilder(
            resource_paths={job.uri: str(path) for job, path in zip(jobs, paths, strict=True)}
        )
        for name, plugin, value in active:
            try:
                await call_maybe_sync(
                    plugin.modify_context, uris[name], value, ctx, to_thread=asyncio.to_thread
                )
            except BuildError:
                raise
            except Exception as exc:
                raise BuildError(
                    f"modify_context failed: {type(exc).__name__}: {exc}", env_id=env_id, step=name
                ) from exc
        return ctx.freeze(env_id), sorted({job.uri for job in jobs})

    async def _need_resource(self, job: ResourceJob) -> Path:
        """One step of a build: the resource ``uri``, with step events around it."""
        env_id, name, uri = job.spec.env_id, job.name, job.uri
        shown = redact_text(uri)  # a URL's query or password is never in a step or event
        step = f"{name} {shown}" if len(shown) < 80 else f"{name} {shown[:77]}..."
        label = redact_text(_label(job))
        self._step(env_id, step, status="running", uri=shown, label=label, started=time.time())
        status = "cancelled"
        try:
            path, cached = await self._need_pinned(job)
            status = "cached" if cached else "done"
            return path
        except asyncio.CancelledError:
            raise
        except BuildError as exc:
            status = "failed"
            exc.label = exc.label or label  # messages name the step as the widget does
            raise
        except BaseException:
            status = "failed"
            raise
        finally:
            self._step(env_id, step, status=status, ended=time.time())

    async def _need_pinned(self, job: ResourceJob) -> tuple[Path, bool]:
        """The resource, referenced for this build from the moment it is chosen (found in
        the cache or just built) until the build ends: a GC or a DELETE of another env that
        used it, in this process or another, cannot remove it under the build. If it was
        evicted between being found and being pinned, it is got again."""
        cache = self.cache
        for _ in range(_PIN_ATTEMPTS):
            path, cached = await self._resources.need(job)
            if await asyncio.to_thread(cache.pin, job.spec.env_id, job.uri):
                return path, cached
        raise BuildError(
            f"the resource {job.uri[:200]} was evicted {_PIN_ATTEMPTS} times while this build"
            " needed it (a GC running in a loop?); try again",
            env_id=job.spec.env_id,
            step=job.name,
        )

    async def _evict(self, uri: str) -> bool:
        forgotten = await self._resources.evict(uri)
        if forgotten is None:
            return False
        for env_id in forgotten:
            record = self._machine.get(env_id)
            if record is not None and not record.holders:
                self._machine.forget(env_id)
        return True

    # -- events ------------------------------------------------------------------------------

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


def _check_id(env_id: str) -> None:
    # Whole ids only here: prefixes are resolved first (``resolve_id``).
    if not is_env_id(env_id):
        raise EnvNotFound(f"no environment {str(env_id)[:80]!r} (an env id is 64 hex digits)")


_SUMMARY_KEYS = ("env_id", "state", "holders", "created", "updated", "last_used", "error")


def _summary(env: dict[str, Any]) -> dict[str, Any]:
    summary = {k: env[k] for k in _SUMMARY_KEYS if k in env}
    if summary.get("error"):
        summary["error"] = {
            "message": env["error"].get("message", ""),
            "step": env["error"].get("step", ""),
        }
    summary["fields"] = sorted(k for k in (env.get("spec") or {}) if k != "config")
    return summary


def _label(job: ResourceJob) -> str:
    """The step as users read it (``pip: greeting==1.0``); the step's key keeps the URI."""
    describe = getattr(job.plugin, "describe", None)
    try:
        label = describe(job.uri, job.value, job.spec) if describe is not None else None
    except Exception:  # a plugin's label must not fail a build
        label = None
    return label if isinstance(label, str) and label else f"{job.name} {job.uri[:40]}"
