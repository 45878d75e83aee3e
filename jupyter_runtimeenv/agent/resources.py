"""Creating and evicting cached resources: once at a time, across tasks and processes.

Within a process, concurrent needs for one URI share one task (single flight); the work
is cancelled only when the last build waiting for it is. Across processes, a file lock per
URI serialises creation and eviction, and the index is checked again under the lock.
Called by ``RuntimeEnvAgent`` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BuildError, PluginNotFound
from ..plugins.base import RuntimeEnvPlugin, call_maybe_sync
from ..plugins.registry import PluginRegistry
from ..spec import RuntimeEnvSpec
from .build import EnvLog, ResourceBuild
from .cache import Cache
from .flock import FileLock, LockTimeout
from .limits import Limiter


@dataclass(frozen=True)
class ResourceJob:
    """One resource a build needs: ``plugin.create(uri, value, ...)`` for ``spec``'s env,
    logging to ``log`` under the step ``name`` (the plugin's field or import path)."""

    spec: RuntimeEnvSpec
    log: EnvLog
    name: str
    plugin: RuntimeEnvPlugin
    value: Any
    uri: str


class Resources:
    def __init__(self, cache: Callable[[], Cache], limiter: Limiter, registry: PluginRegistry):
        self._cache = cache
        self._limiter = limiter
        self._registry = registry
        self._tasks: dict[str, asyncio.Task[tuple[Path, bool]]] = {}
        self._waiters: dict[str, int] = {}
        #: Resources this process has committed to the cache so far (a build that saw none
        #: committed during it skips the check of the cache's size against its cap).
        self.commits = 0

    def building(self, uri: str) -> bool:
        return uri in self._tasks

    def tasks(self) -> list[asyncio.Task[tuple[Path, bool]]]:
        return list(self._tasks.values())

    async def need(self, job: ResourceJob) -> tuple[Path, bool]:
        """The resource ``uri`` (path, whether it was already cached), created at most once
        however many builds need it at the same time."""
        uri = job.uri
        task = self._tasks.get(uri)
        if task is None:
            task = asyncio.create_task(self._create(job))
            self._tasks[uri] = task
            task.add_done_callback(lambda _t: self._tasks.pop(uri, None))
        self._waiters[uri] = self._waiters.get(uri, 0) + 1
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done() and self._waiters[uri] == 1:
                task.cancel()  # the last build waiting for it: stop the work
                with contextlib.suppress(BaseException):
                    await task
            raise
        finally:
            self._waiters[uri] -= 1
            if not self._waiters[uri]:
                del self._waiters[uri]

    async def _create(self, job: ResourceJob) -> tuple[Path, bool]:
        spec, name, uri = job.spec, job.name, job.uri
        cache = self._cache()
        lock = cache.lock_for(uri)
        # Found, or ours to create (its lock taken, a tmp made): one trip to a thread where
        # the lock is free, as it nearly always is (four trips before: each a wake-up of a
        # pool thread and of the loop, 0.1-0.5 ms apiece on a new env's path).
        found, tmp = await _claim(cache, uri, lock)
        if found is not None:
            return found, True
        if tmp is None:  # another process holds the lock (it may be creating it): wait
            path, cached = await _claim_waiting(cache, uri, lock)
            if cached:
                return path, True
            tmp = path
        build = ResourceBuild(
            env_id=spec.env_id,
            spec=spec,
            uri=uri,
            step=name,
            target=tmp,
            cache_root=cache.root,
            log=job.log,
            limiter=self._limiter,
            resource_path=lambda u: cache.resource_path(name, u),
            groups=cache,
        )
        handed = False  # to the thread that commits, which then cleans up whatever happens
        try:
            size = await call_maybe_sync(
                job.plugin.create, uri, job.value, build, to_thread=asyncio.to_thread
            )
            handed = True
            path = await asyncio.shield(
                asyncio.to_thread(_commit, cache, name, uri, tmp, int(size or 0), lock)
            )
            self.commits += 1
            return path, False
        except BuildError as exc:
            exc.step = exc.step or name
            exc.output_tail = exc.output_tail or list(build.tail)
            raise
        except Exception as exc:
            raise BuildError(
                f"{type(exc).__name__}: {exc}",
                env_id=spec.env_id,
                step=name,
                output_tail=list(build.tail),
            ) from exc
        finally:
            if not handed:  # nothing half-built stays, and the lock goes
                await asyncio.shield(asyncio.to_thread(_drop, tmp, lock))

    async def evict(self, uri: str) -> list[str] | None:
        """Delete an unreferenced resource; the env ids that used it, or None if it was not
        evicted (referenced, being built here or by another process, or already gone)."""
        if self.building(uri):
            return None
        cache = self._cache()
        lock = cache.lock_for(uri)
        try:
            await asyncio.to_thread(lock.acquire, 0)
        except LockTimeout:
            return None
        try:
            row = await asyncio.to_thread(cache.resource, uri)
            if row is None:
                return None
            forgotten = await asyncio.to_thread(cache.forget_resource, uri)
            if forgotten is None:
                return None  # it became referenced meanwhile
            plugin = self._plugin_named(row["plugin"])
            if plugin is not None:
                with contextlib.suppress(Exception):
                    await call_maybe_sync(
                        plugin.delete, uri, Path(row["path"]), to_thread=asyncio.to_thread
                    )
            await asyncio.to_thread(shutil.rmtree, row["path"], True)
            return forgotten
        finally:
            await asyncio.to_thread(lock.release)

    def _plugin_named(self, name: str) -> RuntimeEnvPlugin | None:
        plugin = self._registry.for_field(name)
        if plugin is None and "." in name:
            with contextlib.suppress(PluginNotFound):
                plugin = self._registry.by_path(name)
        return plugin


async def _claim(cache: Cache, uri: str, lock: FileLock) -> tuple[Path | None, Path | None]:
    """``_try_claim`` in a thread; cancelled meanwhile, what it took is given back."""
    claim = asyncio.ensure_future(asyncio.to_thread(_try_claim, cache, uri, lock))
    try:
        return await asyncio.shield(claim)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):  # failed: it took nothing
            _found, tmp = await claim
            if tmp is not None:
                await asyncio.to_thread(_drop, tmp, lock)
        raise


async def _claim_waiting(cache: Cache, uri: str, lock: FileLock) -> tuple[Path, bool]:
    """Wait for ``lock`` (another process holds it), then ``(path, True)`` if the resource
    was made meanwhile (the lock released again), else ``(tmp, False)``, the lock kept."""
    await _acquire(lock)
    try:
        found = await asyncio.to_thread(cache.lookup, uri)
        if found is None:
            return await asyncio.to_thread(cache.new_tmp), False
    except BaseException:
        await asyncio.shield(asyncio.to_thread(lock.release))
        raise
    await asyncio.shield(asyncio.to_thread(lock.release))
    return found, True


def _try_claim(cache: Cache, uri: str, lock: FileLock) -> tuple[Path | None, Path | None]:
    """``(path, None)`` if the resource is in the cache; ``(None, tmp)``, ``lock`` taken and
    ``tmp`` an empty directory, if it is ours to create; ``(None, None)`` if another process
    holds the lock. Blocking (a thread)."""
    found = cache.lookup(uri)
    if found is not None:
        return found, None
    try:
        lock.acquire(timeout=0)
    except LockTimeout:
        return None, None
    try:
        found = cache.lookup(uri)  # created by another process before we took the lock
        if found is not None:
            lock.release()
            return found, None
        return None, cache.new_tmp()
    except BaseException:
        lock.release()
        raise


def _commit(cache: Cache, plugin: str, uri: str, tmp: Path, size: int, lock: FileLock) -> Path:
    """Move the built ``tmp`` into place and record it, then drop what is left and the
    lock, whatever happened. Blocking (a thread)."""
    try:
        return cache.commit(plugin, uri, tmp, size)
    finally:
        _drop(tmp, lock)


def _drop(tmp: Path, lock: FileLock) -> None:
    """Remove ``tmp`` (if the commit did not rename it away) and release ``lock``."""
    try:
        shutil.rmtree(tmp, True)
    finally:
        lock.release()


async def _acquire(lock: FileLock) -> None:
    """Take a cross-process file lock without blocking the loop, staying cancellable: a try
    cut short by a cancel goes on in its thread, and what it takes is given back."""
    while True:
        attempt = asyncio.ensure_future(asyncio.to_thread(lock.acquire, 0.2))
        try:
            await asyncio.shield(attempt)
            return
        except LockTimeout:
            continue
        except asyncio.CancelledError:
            attempt.add_done_callback(_give_back(lock))
            raise


def _give_back(lock: FileLock) -> Callable[[asyncio.Future[None]], None]:
    def done(attempt: asyncio.Future[None]) -> None:
        if not attempt.cancelled() and attempt.exception() is None:
            lock.release()  # an unlock and a close: it does not block the loop

    return done
