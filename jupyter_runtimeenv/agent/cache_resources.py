"""The cache's resources: built directories, their index rows, pins and eviction.

Who calls it: the agent's ``Resources`` (``resources.py``: lookup, lock, build into ``new_tmp``,
``commit``), the agent's builds (``pin``/``unpin_env``: what a build in progress chose), its GC
(``eviction_candidates``, ``forget_resource``), the Dask node's store and staging, the REST
panel (``resources``, sizes). It is a room of ``Cache`` (``cache.py``), not used alone.

What it owns: ``resources/<plugin>/<key>/`` and the ``resources`` and ``pins`` tables. A
resource enters the index only after its directory was renamed into place (``commit``), so
nothing half-built is ever found; a resource an env with a holder uses, or a build pinned, is
never chosen for eviction. Blocking (files, sqlite): the agent calls it in a thread.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cache_index import Index
from .flock import FileLock
from .pgroups import owner_alive, self_identity


def resource_key(uri: str) -> str:
    return hashlib.sha256(uri.encode()).hexdigest()[:32]


#: The size of a resource committed without one, until a reader or the agent's ``Sizes``
#: measures it (``measure_pending``): its walk is not on the build's path.
UNMEASURED = -1


def dir_size(path: Path) -> int:
    """Bytes used by the files below ``path`` (hardlinked files counted once).

    What ``os.walk`` calls files counts, by its own ``lstat`` size: symbolic links to
    files and broken ones too, not links to directories, which are not followed; a file
    that cannot be stat'ed is skipped, and so is a directory that cannot be listed to its
    end, with what is below it. Read from ``os.scandir``'s entries, with no path joined
    and ``lstat``'ed per file: a built pip env is ~6,000 files (``tests/agent/
    test_dir_size.py`` compares it with ``os.walk``)."""
    size = _walk_size(path, None)
    assert size is not None  # nothing stops it
    return size


def _walk_size(path: Path, stop: threading.Event | None) -> int | None:
    """``dir_size``, or None as soon as ``stop`` is set (looked at once per directory)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [os.fspath(path)]
    while stack:
        if stop is not None and stop.is_set():
            return None
        files: list[os.stat_result] = []
        below: list[str] = []
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        is_dir = entry.is_dir()
                    except OSError:
                        is_dir = False
                    if is_dir:
                        if not entry.is_symlink():
                            below.append(entry.path)
                        continue
                    try:
                        files.append(entry.stat(follow_symlinks=False))
                    except OSError:
                        continue
        except OSError:
            continue
        stack.extend(below)
        for st in files:
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


@dataclass(frozen=True)
class Evicted:
    uri: str
    plugin: str
    path: Path
    size: int


_SAFE_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")


class ResourceIndex(Index):
    """Resources and pins: ``Cache``'s room for what builds make and what GC may take."""

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

    def lock_for(self, uri: str) -> FileLock:
        # Not tied to a thread: the agent acquires and releases through asyncio.to_thread,
        # which may use two different pool threads.
        return FileLock(str(self.root / "locks" / f"{resource_key(uri)}.lock"))

    def new_tmp(self) -> Path:
        path = self.root / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        path.mkdir()
        return path

    def commit(self, plugin: str, uri: str, tmp: Path, size: int | None) -> Path:
        """Move a finished build into place and record it; the last step of every build.
        ``size``: its bytes if the plugin knows them, else it is measured later."""
        final = self.resource_path(plugin, uri)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():  # a stale directory the index does not know: never trust it
            shutil.rmtree(final)
        os.rename(tmp, final)
        # Not measured here: a pip env of pandas and scikit-learn is ~6,000 files, a walk of
        # ~40 ms on every such build's path to READY; readers measure it (``measure_pending``)
        # and so does the agent, after the build (``sizes.Sizes``).
        if size is None or size <= 0:
            size = UNMEASURED
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

    def measure_pending(self, stop: threading.Event | None = None) -> bool:
        """Measure the resources committed without a size (``UNMEASURED``), each walked
        without the index's lock; False if ``stop`` was set first (what is left stays
        unmeasured). A resource evicted meanwhile is not brought back."""
        with self._lock:
            rows = self._db.execute("SELECT uri, path FROM resources WHERE size < 0").fetchall()
        for uri, path in rows:
            size = _walk_size(Path(path), stop)
            if size is None:
                return False
            with self._tx() as db:
                db.execute("UPDATE resources SET size = ? WHERE uri = ? AND size < 0", (size, uri))
        return True

    def total_bytes(self) -> int:
        self.measure_pending()
        with self._lock:
            row = self._db.execute(
                "SELECT COALESCE(SUM(MAX(size, 0)), 0) FROM resources"
            ).fetchone()
        return int(row[0])

    def resources(self) -> list[dict[str, Any]]:
        self.measure_pending()
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
        self.measure_pending()
        with self._lock:
            rows = self._db.execute(
                "SELECT uri, plugin, path, MAX(size, 0) FROM resources ORDER BY last_used, created"
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
        self.measure_pending()
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
            db.execute("DELETE FROM answers WHERE env_id = ?", (env_id,))
        return envs
