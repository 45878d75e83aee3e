"""Issue 16 item 4: what a task writes in its working_dir reaches no other env, not the
content store, not a later build.

Real parts: an embedded agent on a fresh cache, real worker processes, tasks that write the
way users' code does (``chmod`` then a rewrite in place, ``open(..., "w")``, sqlite). The
suite runs as root in CI, where read-only bits stop nothing: exactly the case to guard.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.agent import RuntimeEnvAgent
from jupyter_runtimeenv.client import EmbeddedClient
from jupyter_runtimeenv.plugins import _sources, _spares
from jupyter_runtimeenv.workers import _cow, _entry

ORIGINAL = "original content\n"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[EmbeddedClient]:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    client = EmbeddedClient(RuntimeEnvAgent(cache))
    executor = jre.LocalExecutor(acquire=client.acquire_sync, release=client.release_sync)
    jre.init(executor=executor)
    try:
        yield client
    finally:
        executor.shutdown()
        jre.shutdown()
        client.close()


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    (root / "data" / "a.txt").write_text(ORIGINAL)
    (root / "b.txt").write_text("b\n")
    return root


def call(function: Any, env: dict[str, Any], *args: Any) -> Any:
    return jre.remote(function).options(runtime_env=env).remote(*args).result(120)


def chmod_and_rewrite(name: str, text: str) -> str:
    os.chmod(name, 0o644)
    with open(name, "r+") as f:
        f.write(text)
    with open(name) as f:
        return f.read()


def overwrite(name: str, text: str) -> str:
    with open(name, "w") as f:
        f.write(text)
    return os.getcwd()


def read(name: str) -> str:
    with open(name) as f:
        return f.read()


def sqlite_write(name: str) -> int:
    db = sqlite3.connect(name)
    db.execute("INSERT INTO t VALUES (2)")
    db.commit()
    (count,) = db.execute("SELECT count(*) FROM t").fetchone()
    db.close()
    return int(count)


def rewrite_from_a_subprocess(name: str) -> None:
    # Past the worker's Python: its guard cannot see this write.
    subprocess.run(
        ["sh", "-c", f"chmod u+w {name} && printf EVIL | dd of={name} conv=notrunc 2>/dev/null"],
        check=True,
    )


def blobs_of(cache: Path) -> dict[str, str]:
    """Every blob's name and content (text)."""
    out = {}
    for path in (cache / "shared" / "blobs").rglob("*"):
        if path.is_file():
            out[path.name] = path.read_text(errors="replace")
    return out


def env(src: Path, who: str) -> dict[str, Any]:
    return {"working_dir": str(src), "env_vars": {"WHO": who}}


def test_chmod_and_rewrite_in_place_reaches_no_other_env(
    client: EmbeddedClient, src: Path, tmp_path: Path
) -> None:
    sha = hashlib.sha256(ORIGINAL.encode()).hexdigest()
    before = call(read, env(src, "b"), "data/a.txt")  # env b exists before the write
    assert before == ORIGINAL

    edited = call(chmod_and_rewrite, env(src, "a"), "data/a.txt", "EDITED")
    assert edited == "EDITED" + ORIGINAL[6:]
    assert call(read, env(src, "a"), "data/a.txt") == edited  # the task's own env sees it

    assert call(read, env(src, "b"), "data/a.txt") == ORIGINAL  # another env: untouched
    assert blobs_of(tmp_path / "cache")[sha] == ORIGINAL  # the store: untouched
    assert call(read, env(src, "c"), "data/a.txt") == ORIGINAL  # an env built after
    (src / "b.txt").write_text("b changed\n")  # a later build of a new tree sharing the blob
    assert call(read, env(src, "a"), "data/a.txt") == ORIGINAL


def test_a_first_tree_not_yet_in_the_store_is_guarded_before_and_after(
    client: EmbeddedClient, src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree read whole at parse (over ``_hashing._THREADS_FROM`` files) is written as the
    env's own files and put in the content store after the env is ready
    (``plugins/_layout.py``; held back here until the next build settles the store). A task
    that rewrites a file in place before that (its file is not shared yet: the guard lets it)
    puts nothing in the store under the old hash; once stored, a write gets a private copy."""
    from jupyter_runtimeenv.plugins import _hashing, _layout, _store

    monkeypatch.setattr(_spares, "AFTER_S", 3600.0)
    monkeypatch.setattr(_spares, "DEFER_S", 3600.0)
    for i in range(40):
        (src / "many" / f"m{i}.txt").parent.mkdir(exist_ok=True)
        (src / "many" / f"m{i}.txt").write_text(f"file {i}\n")
    _hashing.forget_stat_cache()
    store = str(_store.blob_dir(tmp_path / "cache"))
    sha = hashlib.sha256(ORIGINAL.encode()).hexdigest()

    edited = call(chmod_and_rewrite, env(src, "a"), "data/a.txt", "EDITED")
    assert edited == "EDITED" + ORIGINAL[6:]
    assert _layout.pending(store) == 1  # env a's files are not in the store yet
    assert sha not in blobs_of(tmp_path / "cache")

    assert call(read, env(src, "b"), "data/a.txt") == ORIGINAL  # built after: the store first
    assert _layout.pending(store) == 0
    assert blobs_of(tmp_path / "cache")[sha] == ORIGINAL
    cwd_a = Path(call(os.getcwd, env(src, "a")))
    assert os.stat(cwd_a / "many" / "m3.txt").st_nlink >= 2  # env a's file is a blob now
    assert (cwd_a / "data" / "a.txt").read_text() == edited  # its own write stayed its own

    call(chmod_and_rewrite, env(src, "b"), "data/a.txt", "AGAIN!")  # shared now: a copy
    assert blobs_of(tmp_path / "cache")[sha] == ORIGINAL
    assert call(read, env(src, "c"), "data/a.txt") == ORIGINAL


def test_overwriting_a_read_only_file_and_sqlite_get_private_copies(
    client: EmbeddedClient, src: Path, tmp_path: Path
) -> None:
    db = src / "data" / "db.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (x INTEGER)")
        conn.execute("INSERT INTO t VALUES (1)")
    conn.close()
    original_db = db.read_bytes()
    cwd = call(overwrite, env(src, "a"), "b.txt", "written")
    assert Path(cwd, "b.txt").read_text() == "written"
    assert call(sqlite_write, env(src, "a"), "data/db.sqlite") == 2
    assert call(read, env(src, "other"), "b.txt") == "b\n"
    other_db = call(os.path.abspath, env(src, "other"), "data/db.sqlite")
    assert Path(other_db).read_bytes() == original_db
    assert db.read_bytes() == original_db  # the user's own file was never the target


def test_a_blob_written_past_the_guard_is_not_linked_again(
    client: EmbeddedClient, src: Path, tmp_path: Path
) -> None:
    """A subprocess rewrites a file in place through its link: the guard cannot see it, the
    blob changed; the next build hashes the touched blob again and stores the content anew."""
    sha = hashlib.sha256(ORIGINAL.encode()).hexdigest()
    call(rewrite_from_a_subprocess, env(src, "a"), "data/a.txt")
    assert blobs_of(tmp_path / "cache")[sha].startswith("EVIL")  # what the guard cannot stop
    assert call(read, env(src, "later"), "data/a.txt") == ORIGINAL
    assert blobs_of(tmp_path / "cache")[sha] == ORIGINAL


def test_the_guard_covers_every_write_path_in_a_plain_process(tmp_path: Path) -> None:
    """Each guarded operation, in a process with the guard, on files that share an inode
    with an outside "blob": the blob never changes, and each file becomes private."""
    tree, store = tmp_path / "tree", tmp_path / "store"
    tree.mkdir()
    store.mkdir()
    names = ["w", "a", "rplus", "osopen", "chmod", "truncate", "utime", "sql"]
    for name in names:
        (store / name).write_bytes(b"blob")
        os.chmod(store / name, 0o444)
        os.link(store / name, tree / name)
    code = f"""
import os, sqlite3, sys
sys.path.insert(0, {os.path.dirname(_cow.__file__)!r})
import _cow
_cow.install([{str(tree)!r}])
os.chdir({str(tree)!r})
open("w", "w").write("x")
open("a", "a").write("x")
open("rplus", "r+").write("x")
os.close(os.open("osopen", os.O_WRONLY | os.O_TRUNC))
os.chmod("chmod", 0o644)
os.truncate("truncate", 1)
os.utime("utime", (1, 1))
try:
    sqlite3.connect("sql").execute("select 1")
except sqlite3.DatabaseError:
    pass  # not a database: the copy was made before sqlite read it
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    for name in names:
        assert (store / name).read_bytes() == b"blob", name
        assert os.stat(store / name).st_nlink == 1, name  # the tree's file is its own now
        assert os.stat(store / name).st_mode & 0o777 == 0o444, name


def test_the_guard_variable_is_one_name() -> None:
    assert _sources.TREES_VAR == _cow.TREES_VAR == _entry.TREES_VAR


def make_and_remove(name: str, gone: str) -> str:
    with open(name, "w") as f:
        f.write("a task's own file")
    os.remove(gone)
    return os.getcwd()


def wait_for_a_spare(family: str) -> None:
    deadline = time.monotonic() + 60
    while not any(f == family and ready for _s, f, ready in _spares.spares()):
        assert time.monotonic() < deadline, "no spare tree was laid out"
        time.sleep(0.02)


def test_a_tree_laid_out_from_a_spare_has_nothing_of_another_env(
    client: EmbeddedClient, src: Path, tmp_path: Path
) -> None:
    """From its second build on, an edited source's next tree is made from a spare copy
    (``plugins/_spares.py``) that shares its files' inodes with the blobs, and so with every
    env that links them. A task of such an env writes in place past the guard, makes a
    file and removes one; the next env, laid out from the spare, has the source's content
    and names only."""
    family = f"0:{src}"
    assert call(read, env(src, "one"), "b.txt") == "b\n"
    (src / "b.txt").write_text("b two\n")
    cwd = call(os.getcwd, env(src, "two"))  # the second build: a spare of it is laid out
    wait_for_a_spare(family)
    call(rewrite_from_a_subprocess, env(src, "two"), "data/a.txt")
    assert Path(cwd, "data", "a.txt").read_text().startswith("EVIL")  # the shared inode
    call(make_and_remove, env(src, "two"), "new.txt", "b.txt")
    (src / "b.txt").write_text("b three\n")
    three = call(os.getcwd, env(src, "three"))  # from the spare
    assert call(read, env(src, "three"), "data/a.txt") == ORIGINAL
    assert sorted(p.name for p in Path(three).iterdir()) == ["b.txt", "data"]
    assert Path(three, "b.txt").read_text() == "b three\n"
    assert Path(cwd, "new.txt").exists()  # what the task did stayed in its own env
    assert not Path(cwd, "b.txt").exists()
