"""The content-addressed cache: resource directories under one root and their index.

Layout of the root::

    index.sqlite          resources, envs, which env uses which resource, references,
                          pins (resources a build in progress chose), the process groups
                          of running installers (see ``pgroups``)
    resources/<plugin>/<key>/   one built resource (key: sha256 of its URI)
    tmp/<pid>-<random>/   builds in progress; renamed into resources/ when complete
    locks/<key>.lock      cross-process lock while a resource is built or evicted
    logs/<env_id>.log     build logs
    shared/               caches plugins share (uv's package cache)

Everything here blocks (files, sqlite): the agent calls it through ``asyncio.to_thread``.
SQLite in WAL mode with a busy timeout keeps the index consistent between processes; a
resource enters the index only after its directory was renamed into place, so nothing
half-built is ever found.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import re
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock
import platformdirs

from ..context.model import CONTEXT_FORMAT
from ..errors import CacheUnavailable
from ..spec.ids import is_env_id, is_env_id_prefix
from .pgroups import end_group, owner_alive, self_identity, start_time
from .private import PRIVATE_DIR, describe, prepare_root, tighten_index

CACHE_ENV_VAR = "JUPYTER_RUNTIMEENV_CACHE"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS resources (
    uri TEXT PRIMARY KEY, plugin TEXT NOT NULL, path TEXT NOT NULL,
    size INTEGER NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL);
CREATE TABLE IF NOT EXISTS envs (
    env_id TEXT PRIMARY KEY, spec TEXT NOT NULL, context TEXT NOT NULL,
    created REAL NOT NULL, last_used REAL NOT NULL, fields TEXT);
CREATE TABLE IF NOT EXISTS env_resources (
    env_id TEXT NOT NULL, uri TEXT NOT NULL, PRIMARY KEY (env_id, uri));
CREATE TABLE IF NOT EXISTS refs (
    env_id TEXT NOT NULL, holder TEXT NOT NULL, pid INTEGER NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (env_id, holder));
CREATE TABLE IF NOT EXISTS pins (
    uri TEXT NOT NULL, env_id TEXT NOT NULL,
    owner_pid INTEGER NOT NULL, owner_started REAL NOT NULL,
    PRIMARY KEY (uri, env_id, owner_pid));
CREATE TABLE IF NOT EXISTS pgroups (
    pgid INTEGER NOT NULL, started REAL NOT NULL,
    owner_pid INTEGER NOT NULL, owner_started REAL NOT NULL,
    PRIMARY KEY (pgid, started));
"""


def default_cache_dir() -> Path:
    """``$JUPYTER_RUNTIMEENV_CACHE``, else the platform's user cache dir."""
    override = os.environ.get(CACHE_ENV_VAR)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("jupyter-runtimeenv"))


def resource_key(uri: str) -> str:
    return hashlib.sha256(uri.encode()).hexdigest()[:32]


def dir_size(path: Path) -> int:
    """Bytes used by the files below ``path`` (hardlinked files counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


@dataclass(frozen=True)
class Evicted:
    uri: str
    plugin: str
    path: Path
    size: int


def _current_context(text: str) -> dict[str, Any] | None:
    """A stored context, or None if it was recorded in an older form: before form 2 the
    agent expanded ``${NAME}`` in ``env_vars`` with its own environment (a server's secrets,
    say), which must be neither used nor served; such an env is rebuilt at its next use."""
    context: dict[str, Any] = json.loads(text)
    return context if context.get("format") == CONTEXT_FORMAT else None


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_OPEN_RETRY_SECONDS = 30.0


def _open_index(db: sqlite3.Connection) -> None:
    """WAL mode and the schema. Two processes opening a new index at once (a server and a
    CLI, two Dask nodes sharing a cache) can get SQLITE_BUSY here at once: SQLite does not run
    the busy handler while it switches the journal mode or recovers the WAL (it could
    deadlock), so the open is retried, bounded, instead of failing the agent's start."""
    deadline = time.monotonic() + _OPEN_RETRY_SECONDS
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA busy_timeout=30000")
            db.executescript(_SCHEMA)
            return
        except sqlite3.OperationalError as exc:
            busy = "locked" in str(exc) or "busy" in str(exc)
            if not busy or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Cache:
    """The cache at ``root``; safe to share between threads and between processes.

    The root is owner-only (see ``private``). ``CacheUnavailable`` (naming the root and the
    cause) when it cannot be opened: full or read-only disk, not ours, not a directory.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()
        self._lock = threading.RLock()
        prepare_root(self.root)
        db: sqlite3.Connection | None = None
        try:
            for sub in ("resources", "tmp", "locks", "logs", "shared"):
                (self.root / sub).mkdir(mode=PRIVATE_DIR, exist_ok=True)
            tighten_index(self.root)
            db = sqlite3.connect(
                self.root / "index.sqlite",
                timeout=30,
                check_same_thread=False,
                isolation_level=None,
            )
            _open_index(db)
        except (OSError, sqlite3.Error) as exc:
            if db is not None:
                db.close()
            raise CacheUnavailable(str(self.root), describe(exc, self.root)) from exc
        self._db = db
        try:
            self._migrate()
        except (OSError, sqlite3.Error) as exc:
            db.close()
            raise CacheUnavailable(str(self.root), describe(exc, self.root)) from exc

    def _migrate(self) -> None:
        """Indexes written before envs had a ``fields`` column (the names of the spec's fields,
        so that listing envs never decodes a stored spec) get it, filled in once."""
        with self._tx() as db:
            columns = {row[1] for row in db.execute("PRAGMA table_info(envs)")}
            if "fields" not in columns:
                db.execute("ALTER TABLE envs ADD COLUMN fields TEXT")
            for env_id, spec in list(
                db.execute("SELECT env_id, spec FROM envs WHERE fields IS NULL")
            ):
                db.execute(
                    "UPDATE envs SET fields = ? WHERE env_id = ?",
                    (json.dumps(_field_names(json.loads(spec))), env_id),
                )
            # Listing envs reads this covering index only: the columns of a row that come
            # after its spec and context would be reached through their overflow pages.
            db.execute(
                "CREATE INDEX IF NOT EXISTS envs_summary"
                " ON envs (env_id, created, last_used, fields)"
            )
            # A page of the listing, oldest first, reads only its rows of this one.
            db.execute(
                "CREATE INDEX IF NOT EXISTS envs_by_created"
                " ON envs (created, env_id, last_used, fields)"
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                # A COMMIT that failed (a full disk) leaves the transaction open: without
                # this rollback every later BEGIN would fail, after the disk has room again.
                with suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
                raise

    # -- start-up -------------------------------------------------------------------------

    def sweep(self) -> list[str]:
        """End the installers of agents that are gone, then remove what interrupted builds
        left and references of processes that are gone.

        Returns the paths removed. Called once when an agent starts.
        """
        self.end_orphan_groups()
        self.drop_dead_pins()
        removed: list[str] = []
        for entry in (self.root / "tmp").iterdir():
            pid_text = entry.name.split("-", 1)[0]
            if pid_text.isdigit() and _pid_alive(int(pid_text)):
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(str(entry))
        with self._tx() as db:
            pids = [row[0] for row in db.execute("SELECT DISTINCT pid FROM refs")]
            for pid in pids:
                if not _pid_alive(pid):
                    db.execute("DELETE FROM refs WHERE pid = ?", (pid,))
            # Index rows whose directory vanished (removed by hand) are dropped.
            for uri, path in list(db.execute("SELECT uri, path FROM resources")):
                if not Path(path).is_dir():
                    self._drop_resource(db, uri)
        return removed

    # -- process groups ---------------------------------------------------------------------

    def record_group(self, pgid: int) -> float | None:
        """Record a process group this process started; its leader's start time (None if
        it already ended)."""
        started = start_time(pgid)
        if started is None:
            return None
        owner_pid, owner_started = self_identity()
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO pgroups VALUES (?, ?, ?, ?)",
                (pgid, started, owner_pid, owner_started),
            )
        return started

    def forget_group(self, pgid: int) -> None:
        owner_pid, owner_started = self_identity()
        with self._tx() as db:
            db.execute(
                "DELETE FROM pgroups WHERE pgid = ? AND owner_pid = ? AND owner_started = ?",
                (pgid, owner_pid, owner_started),
            )

    def end_orphan_groups(self) -> list[int]:
        """End the recorded groups whose owner (pid and start time) is gone, and forget
        them; a live owner's groups (another agent on this cache) are left alone. Returns
        the pgids signalled."""
        with self._lock:
            rows = self._db.execute(
                "SELECT pgid, started, owner_pid, owner_started FROM pgroups"
            ).fetchall()
        gone = [(pgid, started) for pgid, started, pid, at in rows if not owner_alive(pid, at)]
        ended = [pgid for pgid, started in gone if end_group(pgid, started)]
        if gone:
            with self._tx() as db:
                db.executemany("DELETE FROM pgroups WHERE pgid = ? AND started = ?", gone)
        return ended

    # -- resources --------------------------------------------------------------------------

    def resource_path(self, plugin: str, uri: str) -> Path:
        # The plugin's name is a field name or an import path; anything else never becomes
        # a directory name.
        if not _SAFE_COMPONENT.fullmatch(plugin or "plugin"):
            plugin = "plugin-" + hashlib.sha256(plugin.encode()).hexdigest()[:16]
        return self.root / "resources" / (plugin or "plugin") / resource_key(uri)

    def lookup(self, uri: str) -> Path | None:
        """The directory of a complete resource, or None."""
        with self._lock:
            row = self._db.execute("SELECT path FROM resources WHERE uri = ?", (uri,)).fetchone()
        if row is None or not Path(row[0]).is_dir():
            return None
        return Path(row[0])

    def lock_for(self, uri: str) -> filelock.FileLock:
        # Not thread-local: the agent acquires and releases through asyncio.to_thread, which
        # may use two different pool threads.
        return filelock.FileLock(
            str(self.root / "locks" / f"{resource_key(uri)}.lock"), thread_local=False
        )

    def new_tmp(self) -> Path:
        path = self.root / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        path.mkdir()
        return path

    def commit(self, plugin: str, uri: str, tmp: Path, size: int | None) -> Path:
        """Move a finished build into place and record it; the last step of every build."""
        final = self.resource_path(plugin, uri)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():  # a stale directory the index does not know: never trust it
            shutil.rmtree(final)
        os.rename(tmp, final)
        if size is None or size <= 0:
            size = dir_size(final)
        now = time.time()
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO resources VALUES (?, ?, ?, ?, ?, ?)",
                (uri, plugin, str(final), size, now, now),
            )
        return final

    def touch(self, uris: Iterable[str]) -> None:
        now = time.time()
        with self._tx() as db:
            db.executemany(
                "UPDATE resources SET last_used = ? WHERE uri = ?", [(now, u) for u in uris]
            )

    def total_bytes(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT COALESCE(SUM(size), 0) FROM resources").fetchone()
        return int(row[0])

    def resources(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT uri, plugin, path, size, created, last_used FROM resources"
                " ORDER BY last_used"
            ).fetchall()
        referenced = self._referenced_uris()
        return [
            {
                "uri": r[0],
                "plugin": r[1],
                "path": r[2],
                "size": r[3],
                "created": r[4],
                "last_used": r[5],
                "referenced": r[0] in referenced,
            }
            for r in rows
        ]

    def _referenced_uris(self) -> set[str]:
        """URIs an env with a holder uses, or a build in progress chose (pinned)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT er.uri FROM env_resources er JOIN refs r ON r.env_id = er.env_id"
                " UNION SELECT uri FROM pins"
            ).fetchall()
        return {r[0] for r in rows}

    # -- pins: what a build in progress chose ------------------------------------------------

    def pin(self, env_id: str, uri: str) -> bool:
        """Reference the resource ``uri`` for the build of ``env_id`` in this process, from
        now until ``unpin_env`` (or ``record_env``): GC and DELETE (here or in another
        process sharing the cache) leave it alone. False if the resource is gone already
        (evicted since it was found: the build must get it again). Checked and recorded in
        one transaction, so an eviction is either before (False) or refused after."""
        owner_pid, owner_started = self_identity()
        with self._tx() as db:
            row = db.execute("SELECT path FROM resources WHERE uri = ?", (uri,)).fetchone()
            if row is None or not Path(row[0]).is_dir():
                return False
            db.execute(
                "INSERT OR REPLACE INTO pins VALUES (?, ?, ?, ?)",
                (uri, env_id, owner_pid, owner_started),
            )
        return True

    def unpin_env(self, env_id: str) -> None:
        """The build of ``env_id`` in this process ended: its pins go."""
        owner_pid, _ = self_identity()
        with self._tx() as db:
            db.execute("DELETE FROM pins WHERE env_id = ? AND owner_pid = ?", (env_id, owner_pid))

    def drop_dead_pins(self) -> int:
        """Forget the pins of builds whose process is gone (killed mid-build)."""
        with self._lock:
            owners = self._db.execute(
                "SELECT DISTINCT owner_pid, owner_started FROM pins"
            ).fetchall()
        dead = [(pid, at) for pid, at in owners if not owner_alive(pid, at)]
        if dead:
            with self._tx() as db:
                db.executemany("DELETE FROM pins WHERE owner_pid = ? AND owner_started = ?", dead)
        return len(dead)

    def eviction_candidates(self, max_bytes: int) -> list[Evicted]:
        """Unreferenced resources, least recently used first, whose removal brings the cache
        to at most ``max_bytes``."""
        self.drop_dead_pins()
        with self._lock:
            rows = self._db.execute(
                "SELECT uri, plugin, path, size FROM resources ORDER BY last_used, created"
            ).fetchall()
        referenced = self._referenced_uris()
        total = sum(r[3] for r in rows)
        chosen: list[Evicted] = []
        for uri, plugin, path, size in rows:
            if total <= max_bytes:
                break
            if uri in referenced:
                continue
            chosen.append(Evicted(uri, plugin, Path(path), size))
            total -= size
        return chosen

    def resource(self, uri: str) -> dict[str, Any] | None:
        """The index row of a complete resource (uri, plugin, path, size), or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT uri, plugin, path, size FROM resources WHERE uri = ?", (uri,)
            ).fetchone()
        if row is None or not Path(row[2]).is_dir():
            return None
        return {"uri": row[0], "plugin": row[1], "path": row[2], "size": row[3]}

    def forget_resource(self, uri: str) -> list[str] | None:
        """Drop a resource from the index (before its directory is removed); the env ids
        that used it (forgotten too), or None if it is referenced."""
        with self._tx() as db:
            if uri in self._referenced_uris():
                return None
            return self._drop_resource(db, uri)

    def _drop_resource(self, db: sqlite3.Connection, uri: str) -> list[str]:
        envs = [r[0] for r in db.execute("SELECT env_id FROM env_resources WHERE uri = ?", (uri,))]
        db.execute("DELETE FROM resources WHERE uri = ?", (uri,))
        for env_id in envs:
            db.execute("DELETE FROM envs WHERE env_id = ?", (env_id,))
            db.execute("DELETE FROM env_resources WHERE env_id = ?", (env_id,))
        return envs

    # -- environments -------------------------------------------------------------------

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
                    json.dumps(_field_names(spec)),
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
        return [
            {
                "env_id": r[0],
                "created": r[1],
                "last_used": r[2],
                "fields": json.loads(r[3] or "[]"),
                "holders": sorted(holders.get(r[0], [])),
            }
            for r in rows
        ]

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
            for chunk in _chunks([r[0] for r in rows]):
                marks = ",".join("?" * len(chunk))
                query = f"SELECT env_id, holder FROM refs WHERE env_id IN ({marks})"
                for env_id, holder in self._db.execute(query, chunk):
                    holders.setdefault(env_id, []).append(holder)
            stored: set[str] = set()
            for chunk in _chunks(known):
                marks = ",".join("?" * len(chunk))
                query = f"SELECT env_id FROM envs WHERE env_id IN ({marks})"
                stored.update(r[0] for r in self._db.execute(query, chunk))
        page = [
            {
                "env_id": r[0],
                "created": r[1],
                "last_used": r[2],
                "fields": json.loads(r[3] or "[]"),
                "holders": sorted(holders.get(r[0], [])),
            }
            for r in rows
        ]
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
            db.execute("UPDATE envs SET last_used = ? WHERE env_id = ?", (now, env_id))
            db.execute(
                "UPDATE resources SET last_used = ? WHERE uri IN "
                "(SELECT uri FROM env_resources WHERE env_id = ?)",
                (now, env_id),
            )
        return new

    def touch_env(self, env_id: str) -> None:
        """A use of the env now: its last use and its resources' (LRU eviction)."""
        now = time.time()
        with self._tx() as db:
            db.execute("UPDATE envs SET last_used = ? WHERE env_id = ?", (now, env_id))
            db.execute(
                "UPDATE resources SET last_used = ? WHERE uri IN "
                "(SELECT uri FROM env_resources WHERE env_id = ?)",
                (now, env_id),
            )

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

    # -- logs -------------------------------------------------------------------------------

    def log_path(self, env_id: str) -> Path:
        if not is_env_id(env_id):  # callers check first; a path is never built from anything else
            raise ValueError(f"not an env id: {env_id[:80]!r}")
        return self.root / "logs" / f"{env_id}.log"


_SAFE_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
#: OS errors that mean the cache's disk cannot be written (not a bug of ours).
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


def _guarded(method: Callable[..., Any]) -> Callable[..., Any]:
    """A cache method whose disk failures (a full or read-only disk, SQLite saying so) are a
    ``CacheUnavailable`` naming the cache and the cause: every caller (the agent, the REST
    API's 503, the CLI's exit code 1) handles that one error."""

    @functools.wraps(method)
    def guarded(self: Cache, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError):
            raise
        except sqlite3.DatabaseError as exc:
            raise CacheUnavailable(str(self.root), describe(exc, self.root)) from exc
        except OSError as exc:
            if exc.errno not in _DISK_ERRNOS:
                raise
            raise CacheUnavailable(str(self.root), describe(exc, self.root)) from exc

    return guarded


# Every public method but those that touch no disk.
for _name, _method in list(vars(Cache).items()):
    if not _name.startswith("_") and callable(_method) and _name not in ("lock_for", "log_path"):
        setattr(Cache, _name, _guarded(_method))


def _field_names(spec: dict[str, Any]) -> list[str]:
    return sorted(k for k in spec if k != "config")


def _chunks(items: list[str], size: int = 500) -> Iterator[list[str]]:
    """``items`` in lists of at most ``size`` (SQLite bounds the parameters of a query)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]
