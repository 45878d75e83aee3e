"""Where the cache is, and an env the cache holds READY, found without starting an agent.

Who calls it: ``default_cache_dir`` everyone (``cache.py`` re-exports it); ``find_ready`` the
CLI's ``build`` (``cli.py``), before it starts an agent: a build of a cached env answers from
one transaction on the index instead of an agent's start (sweep, store, asyncio, psutil,
filelock) and stop, ~40 % of the command (issue 19 item 4: ``jupyter runtimeenv`` ready in
≤ 100 ms).

It finds an env the way ``EnvIndex.find_env`` does (recorded, every resource's directory
present, the context in the current form) and records the use as the agent does (the env's
and its resources' ``last_used``: LRU eviction). It changes nothing else and creates nothing:
anything that is not plainly a private cache with that env in it (no index yet, a root or
index file others may read, which the agent's start tightens or refuses, a busy or damaged
index, an error of the disk) is ``None``, and the caller starts the agent, which handles
each of those cases and says what is wrong. Blocking (sqlite, stat); imports no more than
sqlite3 (json and the context's form when it reads a context: ``answers`` imports this module
before any of them).
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time

TYPE_CHECKING = False  # typing, pathlib and json are imported where used: ``answers``
if TYPE_CHECKING:  # answers a build with this module and sqlite3 alone
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any, TypeVar

    T = TypeVar("T")

CACHE_ENV_VAR = "JUPYTER_RUNTIMEENV_CACHE"

_INDEX = "index.sqlite"

__all__ = [
    "CACHE_ENV_VAR",
    "default_cache_dir",
    "default_cache_root",
    "find_ready",
    "in_one_transaction",
    "index_uri",
    "private_index",
    "record_use",
    "resources_present",
]


def default_cache_dir() -> Path:
    """``$JUPYTER_RUNTIMEENV_CACHE``, else the platform's user cache dir."""
    from pathlib import Path

    return Path(default_cache_root())


def default_cache_root() -> str:
    """``default_cache_dir`` as a string, without pathlib (``cli``'s answered build)."""
    override = os.environ.get(CACHE_ENV_VAR)
    if override:
        return os.path.expanduser(override)
    import platformdirs  # only without the variable: ~2 ms of every command's start

    return str(platformdirs.user_cache_dir("jupyter-runtimeenv"))


def _ours_and_private(st: os.stat_result) -> bool:
    owner = not hasattr(os, "geteuid") or st.st_uid == os.geteuid()
    return owner and not stat.S_IMODE(st.st_mode) & 0o077


def private_index(root: str | os.PathLike[str]) -> str | None:
    """The index of the cache at ``root`` if the root is a directory and the index a file,
    both this user's and owner-only (and its ``-wal``/``-shm`` files too, when present);
    else None: the agent's start makes, tightens or refuses the root (``private.py``)."""
    index = os.path.join(root, _INDEX)
    try:
        st = os.stat(root)
        if not stat.S_ISDIR(st.st_mode) or not _ours_and_private(st):
            return None
        st = os.lstat(index)
        if not stat.S_ISREG(st.st_mode) or not _ours_and_private(st):
            return None
        for suffix in ("-wal", "-shm"):
            try:
                st = os.lstat(f"{index}{suffix}")
            except FileNotFoundError:
                continue  # SQLite creates it with the index's mode
            if not stat.S_ISREG(st.st_mode) or not _ours_and_private(st):
                return None
    except OSError:
        return None
    return index


def index_uri(index: str, mode: str) -> str:
    """SQLite's URI of the index file (``mode=rw``: never creates a file, so a root emptied
    meanwhile stays empty). A path's ``%``, ``?`` and ``#`` are escaped: SQLite decodes
    ``%HH`` and ends the path at the other two."""
    path = index.replace("%", "%25").replace("?", "%3f").replace("#", "%23")
    return f"file:{path}?mode={mode}"


def find_ready(index: str, env_id: str) -> dict[str, Any] | None:
    """The stored context of env ``env_id`` if the index records it with every resource's
    directory present and its context in the current form, its use recorded; else None.

    One write transaction, so that the env and its resources are read and touched as one
    (a concurrent eviction either went first, and the env is not found, or waits)."""
    # None for an index that cannot be used: the agent's start says what is wrong, if anything.
    return in_one_transaction(index, lambda db: _touch_if_ready(db, env_id))


def in_one_transaction(index: str, work: Callable[[sqlite3.Connection], T | None]) -> T | None:
    """``work(db)`` in one write transaction (``BEGIN IMMEDIATE``) on the index file
    ``index``, committed if it found something (not None), else rolled back; None also where
    the index cannot be opened or used (no such file or table, busy, damaged, a disk error).
    Never creates the file."""
    try:
        db = sqlite3.connect(index_uri(index, "rw"), uri=True, timeout=30, isolation_level=None)
    except sqlite3.Error:
        return None
    try:
        db.execute("PRAGMA synchronous=NORMAL")  # as the agent's connection (cache_index)
        db.execute("BEGIN IMMEDIATE")
        try:
            found = work(db)
            db.execute("COMMIT" if found is not None else "ROLLBACK")
        except BaseException:
            try:  # noqa: SIM105 (contextlib and functools are not imported on this path)
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise
        return found
    except (sqlite3.Error, OSError, ValueError):
        return None
    finally:
        db.close()


def _touch_if_ready(db: sqlite3.Connection, env_id: str) -> dict[str, Any] | None:
    import json

    from ..context.model import CONTEXT_FORMAT

    row = db.execute("SELECT context FROM envs WHERE env_id = ?", (env_id,)).fetchone()
    if row is None:
        return None
    context: dict[str, Any] = json.loads(row[0])
    if context.get("format") != CONTEXT_FORMAT:
        return None  # an older form: the agent rebuilds it (``cache_envs._current_context``)
    if not resources_present(db, env_id):
        return None
    record_use(db, env_id, time.time())
    return context


def resources_present(db: sqlite3.Connection, env_id: str) -> bool:
    """Whether every resource env ``env_id`` uses is recorded with its directory there."""
    paths = db.execute(
        "SELECT r.path FROM env_resources e LEFT JOIN resources r ON r.uri = e.uri"
        " WHERE e.env_id = ?",
        (env_id,),
    ).fetchall()
    return not any(path is None or not os.path.isdir(path) for (path,) in paths)


def record_use(db: sqlite3.Connection, env_id: str, now: float) -> None:
    """A use of ``env_id`` at ``now``: its last use and its resources' (LRU eviction), in
    the caller's transaction. The one place that says it (the CLI's hit here, the agent's
    ``EnvIndex.add_ref`` and ``touch_env``)."""
    db.execute("UPDATE envs SET last_used = ? WHERE env_id = ?", (now, env_id))
    db.execute(
        "UPDATE resources SET last_used = ? WHERE uri IN "
        "(SELECT uri FROM env_resources WHERE env_id = ?)",
        (now, env_id),
    )
