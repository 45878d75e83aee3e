"""Building an env and evicting resources: the agent's build orchestration.

Who calls it: ``RuntimeEnvAgent.ensure`` starts ``_build`` (one task per env id, registered
before any await) and ``remove`` evicts through ``_evict``; ``gc`` is public (the REST API,
the CLI, and the agent itself after a build leaves the cache over its cap). A room of
``RuntimeEnvAgent`` (``agent.py``) on ``AgentCore``. What it owns: a build's steps (each
active plugin's URIs, their resources fetched concurrently and pinned, ``modify_context`` in
priority order), its deadline, its outcome in the state machine and the index, and the
step events around each resource.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from ..context import ContextBuilder, EnvContext
from ..errors import BuildError, BuildTimeout
from ..plugins.base import RuntimeEnvPlugin, call_maybe_sync, runs_inline
from ..redact import redact_text
from ..spec import RuntimeEnvSpec
from .build import EnvLog
from .core import AgentCore
from .resources import ResourceJob
from .state import EnvRecord, EnvState

#: A resource evicted between being found and being pinned is got again, this many times.
_PIN_ATTEMPTS = 3

Active = tuple[str, RuntimeEnvPlugin, Any]


class Builds(AgentCore):
    """Builds and evictions: ``RuntimeEnvAgent``'s room for what changes the cache."""

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
        recorded = False
        commits = self._resources.commits
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
            recorded = True  # and its pins dropped (the record holds its resources now)
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
                if not recorded:
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
        # Only what added to the cache meanwhile can have taken it over its cap: measured
        # in the agent's measuring thread, after the build (``sizes.py``).
        if self._resources.commits != commits and not self._stopping:
            loop = asyncio.get_running_loop()

            def over_cap() -> None:  # in the measuring thread
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(self._over_cap)

            self._sizes.after_build(cache, self.max_cache_bytes, over_cap)

    def _over_cap(self) -> None:
        """The measuring thread found the cache over its cap (on the loop)."""
        if not self._stopping:
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
                await call_maybe_sync(
                    plugin.uris,
                    value,
                    spec,
                    to_thread=asyncio.to_thread,
                    inline=runs_inline(plugin, "uris"),
                )
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
                    plugin.modify_context,
                    uris[name],
                    value,
                    ctx,
                    to_thread=asyncio.to_thread,
                    inline=runs_inline(plugin, "modify_context"),
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


def _label(job: ResourceJob) -> str:
    """The step as users read it (``pip: greeting==1.0``); the step's key keeps the URI."""
    describe = getattr(job.plugin, "describe", None)
    try:
        label = describe(job.uri, job.value, job.spec) if describe is not None else None
    except Exception:  # a plugin's label must not fail a build
        label = None
    return label if isinstance(label, str) and label else f"{job.name} {job.uri[:40]}"
