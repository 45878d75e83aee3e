"""The cache's environments: env records, the resources each uses, and references.

Who calls it: the agent (``record_env`` when a build succeeds, ``find_env`` before building,
``add_ref``/``remove_ref``/``drop_refs`` for holders, ``forget_env`` on DELETE), its status
and listing (``envs``, ``env_summaries``/``env_summaries_page``, ``env_row``), the CLI, the
REST panel, and the Dask node (``link_resources``). It is a room of ``Cache`` (``cache.py``).

What it owns: the ``envs``, ``env_resources`` and ``refs`` tables. An env is found only while
all its resources are present and its context is in the current form; a holder's reference
keeps the env's resources from eviction (``ResourceIndex._referenced_uris``). Blocking
(sqlite): the agent calls it in a thread.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from typing import Any

from ..context.model import CONTEXT_FORMAT
from ..spec.ids import is_env_id, is_env_id_prefix
from .cache_hit import record_use
from .cache_index import chunks, field_names
from .cache_resources import ResourceIndex


def _current_context(text: str) -> dict[str, Any] | None:
    """A stored context, or None if it was recorded in an older form: before form 2 the
    agent expanded ``${NAME}`` in ``env_vars`` with its own environment (a server's secrets,
    say), which must be neither used nor served; such an env is rebuilt at its next use."""
    context: dict[str, Any] = json.loads(text)
    return context if context.get("format") == CONTEXT_FORMAT else None


def _summary(row: tuple[Any, ...], holders: dict[str, list[str]]) -> dict[str, Any]:
    """An env as the listings give it, from its (env_id, created, last_used, fields) row."""
    return {
        "env_id": row[0],
        "created": row[1],
        "last_used": row[2],
        "fields": json.loads(row[3] or "[]"),
        "holders": sorted(holders.get(row[0], [])),
    }


class EnvIndex(ResourceIndex):
    """Env records and references: ``Cache``'s room for what was built and who holds it."""

    def record_env(
        self, env_id: str, spec: dict[str, Any], context: dict[str, Any], uris: list[str]
    ) -> None:
        now = time.time()
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO envs VALUES (?, ?, ?, ?, ?, ?)",
                (
                    env_id,
                    json.dumps(spec, allow_nan=False),
                    json.dumps(context, allow_nan=False),
                    now,
                    now,
                    json.dumps(field_names(spec)),
                ),
            )
            db.execute("DELETE FROM env_resources WHERE env_id = ?", (env_id,))
            db.executemany("INSERT INTO env_resources VALUES (?, ?)", [(env_id, u) for u in uris])
            # The env now uses its resources the usual way (and holds them while held).
            db.execute("DELETE FROM pins WHERE env_id = ? AND owner_pid = ?", (env_id, os.getpid()))

    def link_resources(self, env_id: str, uris: Iterable[str]) -> None:
        """Record that env ``env_id`` also uses ``uris`` (resources made outside its build,
        e.g. the trees a Dask node laid out for it): they are kept while it is referenced,
        and evicting one forgets the env. A no-op for an env the index does not hold."""
        with self._tx() as db:
            if db.execute("SELECT 1 FROM envs WHERE env_id = ?", (env_id,)).fetchone() is None:
                return
            db.executemany(
                "INSERT OR IGNORE INTO env_resources VALUES (?, ?)", [(env_id, u) for u in uris]
            )

    def find_env(self, env_id: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(spec, context) of a recorded env whose resources are all present, else None."""
        with self._lock:
            row = self._db.execute(
                "SELECT spec, context FROM envs WHERE env_id = ?", (env_id,)
            ).fetchone()
            if row is None:
                return None
            uris = [
                r[0]
                for r in self._db.execute(
                    "SELECT uri FROM env_resources WHERE env_id = ?", (env_id,)
                )
            ]
        if any(self.lookup(u) is None for u in uris):
            return None
        context = _current_context(row[1])
        if context is None:
            return None  # recorded in an older form: rebuilt (its resources are reused)
        return json.loads(row[0]), context

    def knows_env(self, env_id: str) -> bool:
        with self._lock:
            row = self._db.execute("SELECT 1 FROM envs WHERE env_id = ?", (env_id,)).fetchone()
        return row is not None

    def env_uris(self, env_id: str) -> list[str]:
        with self._lock:
            return [
                r[0]
                for r in self._db.execute(
                    "SELECT uri FROM env_resources WHERE env_id = ?", (env_id,)
                )
            ]

    def envs(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT env_id, spec, context, created, last_used FROM envs"
            ).fetchall()
            refs = self._db.execute("SELECT env_id, holder FROM refs").fetchall()
        holders: dict[str, list[str]] = {}
        for env_id, holder in refs:
            holders.setdefault(env_id, []).append(holder)
        return [
            {
                "env_id": r[0],
                "spec": json.loads(r[1]),
                "context": _current_context(r[2]),
                "created": r[3],
                "last_used": r[4],
                "holders": sorted(holders.get(r[0], [])),
            }
            for r in rows
        ]

    def env_summaries(self) -> list[dict[str, Any]]:
        """Every recorded env without its spec and context (``env_row`` has them): the cost
        does not grow with the size of the stored specs."""
        with self._lock:
            rows = self._db.execute(
                "SELECT env_id, created, last_used, fields FROM envs"
            ).fetchall()
            holders = self._holders_by_env()
        return [_summary(r, holders) for r in rows]

    def env_summaries_page(
        self, first: int, known: Iterable[str] = ()
    ) -> tuple[list[dict[str, Any]], int, set[str]]:
        """The ``first`` oldest recorded envs (by created, then env id) as ``env_summaries``
        gives them, how many envs are recorded, and which of ``known`` are: a page of the
        listing costs its rows, not every env's (``RuntimeEnvAgent.summaries``)."""
        known = list(known)
        with self._lock:
            rows = self._db.execute(
                "SELECT env_id, created, last_used, fields FROM envs"
                " ORDER BY created, env_id LIMIT ?",
                (first,),
            ).fetchall()
            (total,) = self._db.execute("SELECT count(*) FROM envs").fetchone()
            holders: dict[str, list[str]] = {}
            for chunk in chunks([r[0] for r in rows]):
                marks = ",".join("?" * len(chunk))
                query = f"SELECT env_id, holder FROM refs WHERE env_id IN ({marks})"
                for env_id, holder in self._db.execute(query, chunk):
                    holders.setdefault(env_id, []).append(holder)
            stored: set[str] = set()
            for chunk in chunks(known):
                marks = ",".join("?" * len(chunk))
                query = f"SELECT env_id FROM envs WHERE env_id IN ({marks})"
                stored.update(r[0] for r in self._db.execute(query, chunk))
        page = [_summary(r, holders) for r in rows]
        return page, int(total), stored

    def env_row(self, env_id: str) -> dict[str, Any] | None:
        """One recorded env, spec and context included, or None."""
        if not is_env_id(env_id):
            return None
        with self._lock:
            row = self._db.execute(
                "SELECT env_id, spec, context, created, last_used FROM envs WHERE env_id = ?",
                (env_id,),
            ).fetchone()
            holders = [
                r[0]
                for r in self._db.execute("SELECT holder FROM refs WHERE env_id = ?", (env_id,))
            ]
        if row is None:
            return None
        return {
            "env_id": row[0],
            "spec": json.loads(row[1]),
            "context": _current_context(row[2]),
            "created": row[3],
            "last_used": row[4],
            "holders": sorted(holders),
        }

    def env_ids_with_prefix(self, prefix: str) -> list[str]:
        """The recorded env ids starting with ``prefix`` (hex; anything else finds none)."""
        if not is_env_id_prefix(prefix):
            return []
        with self._lock:
            rows = self._db.execute(
                "SELECT env_id FROM envs WHERE env_id >= ? AND env_id <= ?",
                (prefix, prefix + "g"),
            ).fetchall()
        return [r[0] for r in rows if r[0].startswith(prefix)]

    def refs(self) -> list[tuple[str, str]]:
        """Every (env id, holder) reference."""
        with self._lock:
            return [(r[0], r[1]) for r in self._db.execute("SELECT env_id, holder FROM refs")]

    def _holders_by_env(self) -> dict[str, list[str]]:
        holders: dict[str, list[str]] = {}
        for env_id, holder in self._db.execute("SELECT env_id, holder FROM refs"):
            holders.setdefault(env_id, []).append(holder)
        return holders

    def forget_env(self, env_id: str, *, keep_refs: bool = False) -> list[str]:
        """Drop an env (and its references, unless ``keep_refs``: a forced removal leaves its
        holders' claims, see ``RuntimeEnvAgent.remove``); returns the URIs no other env uses.
        A reference to an env that is not recorded holds no resource."""
        with self._tx() as db:
            uris = [
                r[0]
                for r in db.execute("SELECT uri FROM env_resources WHERE env_id = ?", (env_id,))
            ]
            db.execute("DELETE FROM envs WHERE env_id = ?", (env_id,))
            db.execute("DELETE FROM env_resources WHERE env_id = ?", (env_id,))
            db.execute("DELETE FROM answers WHERE env_id = ?", (env_id,))
            if not keep_refs:
                db.execute("DELETE FROM refs WHERE env_id = ?", (env_id,))
            still_used = {r[0] for r in db.execute("SELECT DISTINCT uri FROM env_resources")}
        return [u for u in uris if u not in still_used]

    # -- references -----------------------------------------------------------------------

    def add_ref(self, env_id: str, holder: str) -> bool:
        """Record ``holder``'s reference (and a use of the env); True if it is new."""
        now = time.time()
        with self._tx() as db:
            new = (
                db.execute(
                    "SELECT 1 FROM refs WHERE env_id = ? AND holder = ?", (env_id, holder)
                ).fetchone()
                is None
            )
            db.execute(
                "INSERT OR REPLACE INTO refs VALUES (?, ?, ?, ?)",
                (env_id, holder, os.getpid(), now),
            )
            record_use(db, env_id, now)
        return new

    def touch_env(self, env_id: str) -> None:
        """A use of the env now: its last use and its resources' (LRU eviction)."""
        now = time.time()
        with self._tx() as db:
            record_use(db, env_id, now)

    def remove_ref(self, env_id: str, holder: str) -> bool:
        """Drop ``holder``'s reference; True if there was one."""
        with self._tx() as db:
            cursor = db.execute(
                "DELETE FROM refs WHERE env_id = ? AND holder = ?", (env_id, holder)
            )
        return cursor.rowcount > 0

    def drop_refs(self, env_id: str) -> bool:
        """Drop every reference to ``env_id`` (its build failed); True if there were any."""
        with self._tx() as db:
            cursor = db.execute("DELETE FROM refs WHERE env_id = ?", (env_id,))
        return cursor.rowcount > 0

    def holders(self, env_id: str) -> list[str]:
        with self._lock:
            return sorted(
                r[0]
                for r in self._db.execute("SELECT holder FROM refs WHERE env_id = ?", (env_id,))
            )

    def drop_refs_of_pid(self, pid: int) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM refs WHERE pid = ?", (pid,))
