"""``RuntimeEnvAgent``: builds, caches and hands out environments, on one event loop.

Who calls it: the Jupyter server extension (one agent per server), the embedded client in a
kernel or script when there is no server, the CLI, and tests. Every blocking call (the
cache's files and index, sync plugins) goes to a thread; subprocesses are
``create_subprocess_exec``; the loop is never blocked.

This module holds the requests (parse, ensure, wait, release, remove); the agent's other
rooms are ``core.py`` (its state, start/stop, events), ``building.py`` (builds, eviction,
GC) and ``queries.py`` (status, listings, logs).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from ..context import EnvContext
from ..errors import BuildError, EnvInUse, EnvNotFound, RuntimeEnvError
from ..spec import RuntimeEnvSpec, SpecPolicy, parse
from ..spec.ids import check_holder, is_env_id
from .building import Builds
from .core import check_id
from .queries import EnvQueries
from .state import EnvState, Transition


class RuntimeEnvAgent(EnvQueries, Builds):
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
        check_id(env_id)
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
        check_id(env_id)
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
        check_id(env_id)
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
