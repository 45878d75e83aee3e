"""The cache's index: its SQLite schema, opening and migrating it, its transactions.

Who calls it: ``Cache`` (``cache.py``), whose rooms (``cache_resources``, ``cache_envs``)
are built on ``Index``; nothing else opens the index. What it owns: the tables (one schema,
created if missing), the upgrades of older indexes (``_migrate``), the connection and the
lock every query of the cache takes, and the rule that a disk failure anywhere in a public
method is one ``CacheUnavailable`` (``guard_disk_errors``).

Everything here blocks (sqlite, files): the agent calls the cache through ``asyncio.to_thread``.
SQLite in WAL mode with a busy timeout keeps the index consistent between processes.
"""

from __future__ import annotations

import errno
import functools
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from ..errors import CacheUnavailable
from .answers import ANSWERS_TABLE
from .private import PRIVATE_DIR, describe, prepare_root, tighten_index

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

#: The directories of a cache root (``cache.py``'s docstring draws the layout).
_LAYOUT = ("resources", "tmp", "locks", "logs", "shared")

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
            # In WAL mode NORMAL never corrupts the index; a power cut may lose its last
            # commits, which the start-up sweep and commit() treat like any interrupted
            # build. FULL fsynced every commit: 5-7 ms each at load 6, three per new env.
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA busy_timeout=30000")
            db.executescript(_SCHEMA)
            db.execute(ANSWERS_TABLE)  # the CLI's answers to cached builds (``answers``)
            db.execute("CREATE INDEX IF NOT EXISTS answers_by_env ON answers (env_id)")
            # The resources whose size is still to be measured (``measure_pending``, which
            # every listing calls): none, nearly always, found without a scan.
            db.execute(
                "CREATE INDEX IF NOT EXISTS resources_unmeasured ON resources (uri) WHERE size < 0"
            )
            return
        except sqlite3.OperationalError as exc:
            busy = "locked" in str(exc) or "busy" in str(exc)
            if not busy or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Index:
    """The root's directories and its open index; the base of ``Cache``.

    The root is owner-only (see ``private``). ``CacheUnavailable`` (naming the root and the
    cause) when it cannot be opened: full or read-only disk, not ours, not a directory.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.RLock()
        prepare_root(self.root)
        db: sqlite3.Connection | None = None
        try:
            for sub in _LAYOUT:
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
                    (json.dumps(field_names(json.loads(spec))), env_id),
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


def field_names(spec: dict[str, Any]) -> list[str]:
    """The names a stored env lists (its ``fields`` column): the spec's fields but config."""
    return sorted(k for k in spec if k != "config")


#: OS errors that mean the cache's disk cannot be written (not a bug of ours).
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


def _guarded(method: Callable[..., Any]) -> Callable[..., Any]:
    """A cache method whose disk failures (a full or read-only disk, SQLite saying so) are a
    ``CacheUnavailable`` naming the cache and the cause: every caller (the agent, the REST
    API's 503, the CLI's exit code 1) handles that one error."""

    @functools.wraps(method)
    def guarded(self: Index, *args: Any, **kwargs: Any) -> Any:
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


def guard_disk_errors(cls: type[Index], *, skip: tuple[str, ...]) -> None:
    """Give ``cls`` (the finished ``Cache``) a guarded twin of every public method it has,
    its own or its rooms', but those in ``skip`` (they touch no disk). The twins are set on
    ``cls`` itself, so a method calling another (``sweep`` calls ``drop_dead_pins``) calls
    the guarded one, whichever room defines it."""
    names = {name for klass in cls.__mro__[:-1] for name in vars(klass)}
    for name in sorted(names):
        method = getattr(cls, name)
        if not name.startswith("_") and callable(method) and name not in skip:
            setattr(cls, name, _guarded(method))


def chunks(items: list[str], size: int = 500) -> Iterator[list[str]]:
    """``items`` in lists of at most ``size`` (SQLite bounds the parameters of a query)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]
