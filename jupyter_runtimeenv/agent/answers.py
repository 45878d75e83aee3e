"""A cached build answered before the spec is parsed: what the CLI printed for the same input.

Who calls it: the CLI's ``build`` (``cli.py``): ``remember`` after it found a parsed spec's env
in the index (``cache_hit``), ``recall`` at its next start, before it imports its argument
parser, typing, json, the spec parser or the plugins (issue 19 item 4: ``jupyter runtimeenv``
ready in ≤ 100 ms, of which jupyter's own dispatcher takes ~45-50 ms on this machine; a
cached build was ~90 ms of ours, an answered one is ~27). Nothing else reads or writes the
``answers`` table; the cache drops an env's rows with the env (``cache_envs.forget_env``,
``cache_resources``).

An answer is keyed by everything the parse of the input read: the input's bytes (the inline
JSON, or the spec file's content), where relative paths in it are resolved from (the working
directory, or the file's own), the interpreter, ``sys.path`` and this package's location. It
is only remembered for input whose parse reads nothing else (``closed``: no file named in it,
no tree, no plugin of another package), and holds while the code that parsed it stands: the
modules that parse loaded (this package's and any other but the standard library's) and the
directories of ``sys.path`` (an install or an upgrade changes them) keep their size and
modification time (``stamps``). A recalled answer is used only while the index still holds
the env as it was then (the same stored context), with every resource's directory present; its
use is recorded for LRU eviction as ``cache_hit`` records it, in one transaction. Anything
else is ``None``, and the caller parses.

Blocking (sqlite, stat). Imports sqlite3 and a sha256 only: no json, re, typing or pathlib
(``tests/agent/test_answers.py`` holds the answered build to that).
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time

from .cache_hit import in_one_transaction, index_uri, record_use, resources_present

TYPE_CHECKING = False  # typing's import (with re, enum, functools) is ~8 ms of this path
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

try:  # CPython's own sha256 (3.11: _sha256, 3.12+: _sha2): hashlib's OpenSSL import is ~3 ms
    from _sha2 import sha256  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    try:
        from _sha256 import sha256  # type: ignore[import-not-found,no-redef,unused-ignore]
    except ImportError:
        from hashlib import sha256  # type: ignore[assignment,unused-ignore]

__all__ = ["ANSWERS_TABLE", "ANSWER_FORMAT", "closed", "key_of", "recall", "remember", "stamps"]

#: The form of a key and of a row; another form is another key.
ANSWER_FORMAT = "1"
#: Top-level fields whose parse reads nothing but the value (``pip``/``uv`` only in the
#: plain form ``closed`` checks).
_CLOSED_FIELDS = frozenset({"env_vars", "pip", "uv", "config"})
_OURS = __name__.partition(".")[0] + ".plugins."
_MAX_FILE = 1 << 20


def key_of(spec: str) -> str | None:
    """The key of the CLI's spec argument (inline JSON, or a spec file's path), or None when
    it cannot be read (the parse says why)."""
    if spec.lstrip().startswith("{"):
        kind, where, content = "inline", os.getcwd(), os.fsencode(spec)
    else:
        try:
            where = os.path.realpath(spec)
            with open(where, "rb") as f:
                content = f.read(_MAX_FILE + 1)
        except (OSError, ValueError):
            return None
        if len(content) > _MAX_FILE:
            return None  # a spec file this large is parsed each time, not hashed here
        kind = "file"
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parts = [ANSWER_FORMAT, kind, where, sys.executable, sys.version, package, *sys.path]
    digest = sha256(b"\0".join(os.fsencode(p) for p in parts))
    digest.update(b"\0\0")
    digest.update(content)
    return str(digest.hexdigest())


def closed(data: Mapping[str, Any], plugins: Mapping[str, object]) -> bool:
    """Whether parsing ``data`` read nothing but ``data``: fields of ``_CLOSED_FIELDS`` only,
    handled by this package's own plugins (``plugins``: field -> plugin), ``pip``/``uv`` as a
    list of plain requirement lines (a name, plain versions) or a mapping of such a list
    with installer options that name no file to read."""
    from ..plugins._requirements import READ_OPTIONS, _canonical_simple

    if not set(data) <= _CLOSED_FIELDS:
        return False
    if any(not type(plugins.get(n)).__module__.startswith(_OURS) for n in data if n != "config"):
        return False
    for name in ("pip", "uv"):
        value = data.get(name)
        if value is None:
            continue
        options: Any = []
        if isinstance(value, dict):
            options = value.get("install_options", value.get("pip_install_options", []))
            options = value.get("uv_pip_install_options", options)
            value = value.get("packages")
        if not isinstance(value, list) or not isinstance(options, list):
            return False
        if not all(isinstance(v, str) and _canonical_simple(v.strip()) for v in value):
            return False
        for option in options:
            for word in str(option).split():
                if word.partition("=")[0] in READ_OPTIONS or word.startswith(("-r", "-c")):
                    return False
    return True


def stamps() -> str | None:
    """The size and modification time of every module loaded from outside the standard
    library and of every directory of ``sys.path``, one ``mtime_ns size path`` line each;
    None if one cannot be told (a path with a newline)."""
    paths = [p for p in sys.path if p]
    stdlib = sys.stdlib_module_names
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] in stdlib:
            continue
        path = getattr(module, "__file__", None)
        if isinstance(path, str):
            paths.append(path)
    lines = []
    for path in sorted(set(paths)):
        if "\n" in path:
            return None
        try:
            st = os.stat(path)
        except OSError:
            continue  # not there (a sys.path entry that does not exist): ``_unchanged`` agrees
        lines.append(f"{st.st_mtime_ns} {st.st_size} {path}")
    return "\n".join(lines)


def _unchanged(recorded: str) -> bool:
    for line in recorded.splitlines():
        mtime, size, path = line.split(" ", 2)
        try:
            st = os.stat(path)
        except OSError:
            return False
        if st.st_mtime_ns != int(mtime) or st.st_size != int(size):
            return False
    return True


#: The table (also in the index's schema, ``cache_index``; here for an index made by an
#: older version, which the answered path does not open through an agent).
ANSWERS_TABLE = (
    "CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, env_id TEXT NOT NULL,"
    " context TEXT NOT NULL, stamps TEXT NOT NULL, json_head TEXT NOT NULL,"
    " json_tail TEXT NOT NULL, text_head TEXT NOT NULL, text_tail TEXT NOT NULL)"
)


def remember(
    index: str,
    key: str,
    env_id: str,
    stamped: str,
    json_form: tuple[str, str],
    text_form: tuple[str, str],
) -> None:
    """Record what a build of ``key`` printed (each form: the text before and after its
    seconds) for env ``env_id``, with the context the index holds for it now. Best effort:
    a busy or read-only index records nothing (the next build parses again)."""
    try:
        db = sqlite3.connect(index_uri(index, "rw"), uri=True, timeout=1, isolation_level=None)
    except sqlite3.Error:
        return
    try:
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(ANSWERS_TABLE)
        db.execute("BEGIN IMMEDIATE")
        row = db.execute("SELECT context FROM envs WHERE env_id = ?", (env_id,)).fetchone()
        if row is not None:
            db.execute(
                "INSERT OR REPLACE INTO answers VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (key, env_id, row[0], stamped, *json_form, *text_form),
            )
        db.execute("COMMIT")
    except (sqlite3.Error, OSError):
        pass
    finally:
        db.close()


def recall(index: str, key: str, as_json: bool) -> tuple[str, str] | None:
    """What to print for ``key`` (the text before and after its seconds), its env's use
    recorded; None when there is no answer, or it no longer holds (see the module's doc)."""
    # None: no answers table yet, a busy or damaged index: the caller parses.
    return in_one_transaction(index, lambda db: _recall(db, key, as_json))


def _recall(db: sqlite3.Connection, key: str, as_json: bool) -> tuple[str, str] | None:
    forms = "json_head, json_tail" if as_json else "text_head, text_tail"
    row = db.execute(
        f"SELECT a.env_id, a.stamps, {forms} FROM answers a JOIN envs e"
        " ON e.env_id = a.env_id AND e.context = a.context WHERE a.key = ?",
        (key,),
    ).fetchone()
    if row is None or not _unchanged(row[1]) or not resources_present(db, row[0]):
        return None
    record_use(db, row[0], time.time())
    return row[2], row[3]
