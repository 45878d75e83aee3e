"""What the agent can tell: env status, listings, logs, holders, id prefixes.

Who calls it: the REST handlers (``server/handlers.py``, the panel), the CLI, the Dask node's
report, the kernel's client, and tests. A room of ``RuntimeEnvAgent`` (``agent.py``) on
``AgentCore``. What it owns: merging the state machine's records (builds of this agent) with
the cache's index (envs other processes built, or built before a restart) into one view;
nothing here starts or changes a build (``touch`` records a use).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..errors import EnvNotFound
from ..spec.ids import is_env_id, is_env_id_prefix
from .core import AgentCore, check_id
from .state import EnvState


class EnvQueries(AgentCore):
    """Status and listings: ``RuntimeEnvAgent``'s room for reading."""

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
        check_id(env_id)
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
        check_id(env_id)
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
        check_id(env_id)
        if env_id in self._logs:
            return self._logs[env_id].text()
        path = self.cache.log_path(env_id)
        try:
            return await asyncio.to_thread(path.read_text, encoding="utf-8")
        except FileNotFoundError:
            if self._machine.get(env_id) is not None or await self._known(env_id):
                return ""
            raise EnvNotFound(env_id) from None


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
