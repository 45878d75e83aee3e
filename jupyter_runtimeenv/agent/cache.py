"""The content-addressed cache: resource directories under one root and their index.

Who calls it: the agent (``RuntimeEnvAgent`` opens one per start, in a thread), the CLI, the
Dask node's store and staging, and tests. ``Cache`` is one object made of rooms, each a module:

    cache_index.py      the SQLite schema, opening and migrating it, transactions, and the
                        rule that a disk failure is one ``CacheUnavailable``
    cache_resources.py  built resources, pins (what a build in progress chose), eviction
    cache_envs.py       env records, which env uses which resource, references
    cache.py            (this) the default root, the sweep at start, installers' process
                        groups, log paths

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

import os
import shutil
from pathlib import Path

from ..spec.ids import is_env_id
from .cache_envs import EnvIndex
from .cache_hit import CACHE_ENV_VAR, default_cache_dir
from .cache_index import guard_disk_errors
from .pgroups import end_group, owner_alive, self_identity, start_time

__all__ = ["CACHE_ENV_VAR", "Cache", "default_cache_dir"]


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


class Cache(EnvIndex):
    """The cache at ``root`` (default: ``default_cache_dir()``); safe to share between
    threads and between processes.

    The root is owner-only (see ``private``). ``CacheUnavailable`` (naming the root and the
    cause) when it cannot be opened: full or read-only disk, not ours, not a directory.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        super().__init__(Path(root) if root is not None else default_cache_dir())

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

    # -- logs -------------------------------------------------------------------------------

    def log_path(self, env_id: str) -> Path:
        if not is_env_id(env_id):  # callers check first; a path is never built from anything else
            raise ValueError(f"not an env id: {env_id[:80]!r}")
        return self.root / "logs" / f"{env_id}.log"


# Every public method but those that touch no disk.
guard_disk_errors(Cache, skip=("lock_for", "log_path"))
