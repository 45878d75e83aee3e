"""A new tree's first build: written while it is hashed, put in the content store after its
env is ready (``plugins/_layout.py``: ``Layer``, ``defer_store``, ``settle``).

What must hold: the env's tree is the source byte for byte and mode for mode; once the
background step is done the store, the links and the stat cache are what the old path
(store while hashing, then link) made; a build that comes before that step finishes finds
the store as if it had; a SIGKILL in the middle, or a full disk, leaves no blob that holds
other content than its name says, and the env usable.

Real parts: real files, the real content store, the real hashing and spares threads, a real
agent and real worker processes, a child process killed by a real SIGKILL, a real tmpfs
(mounted here, unmounted in a finally) that runs out of inodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_spares import write

from jupyter_runtimeenv.errors import CacheUnavailable
from jupyter_runtimeenv.plugins import _blobs, _hashing, _layout, _spares, _statcache, _store
from jupyter_runtimeenv.plugins._hashing import Tree, blob_mode
from jupyter_runtimeenv.plugins._layout import LayOut

FILES = 60  # over _hashing._THREADS_FROM: hashed (and written) on threads


def source(root: Path) -> Path:
    """A tree with subdirectories, equal files, an executable, an owner-only file and one
    file larger than ``_hashing.WHOLE_MAX`` (hashed and written in chunks)."""
    write(root, {f"d{i % 4}/sub/f{i}.txt": f"content {i}\n" * (i + 1) for i in range(FILES)})
    write(root, {"same1.txt": "equal", "same2.txt": "equal", "empty.txt": ""})
    write(root, {"twin1.txt": "AAAA", "twin2.txt": "BBBB"})  # same size, other content
    (root / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "secret.txt").write_text("owner only")
    os.chmod(root / "secret.txt", 0o600)
    (root / "big.bin").write_bytes(os.urandom(_hashing.WHOLE_MAX + 12345))
    return root


def files_of(root: Path) -> dict[str, tuple[bytes, int]]:
    """Each file's bytes and permission bits, by relative path."""
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath, name)
            out[str(path.relative_to(root))] = (
                path.read_bytes(),
                stat.S_IMODE(path.stat().st_mode),
            )
    return out


def as_built(src: Path) -> dict[str, tuple[bytes, int]]:
    """The source as an env's tree holds it: same bytes, the blob mode of each file."""
    return {rel: (data, blob_mode(mode)) for rel, (data, mode) in files_of(src).items()}


def blobs_of(cache: Path) -> dict[str, tuple[int, int, int]]:
    """Each blob's name -> (inode, mode, mtime); fails on a blob whose content is not its
    name's, a blob not as stored, or anything else in the store (a temporary name)."""
    out = {}
    for dirpath, _dirs, names in os.walk(_store.blob_dir(cache)):
        for name in names:
            path = Path(dirpath, name)
            st = path.lstat()
            assert stat.S_ISREG(st.st_mode), path
            assert hashlib.sha256(path.read_bytes()).hexdigest() == name[:64], path
            assert st.st_mtime_ns == _blobs.BLOB_MTIME_NS, path
            out[name] = (st.st_ino, stat.S_IMODE(st.st_mode), st.st_mtime_ns)
    return out


def first_build(src: Path, cache: Path, target: Path) -> Tree:
    """What an agent's parse and build do for a tree never seen: hash it writing the
    lay-out, adopt it as the source's spare, build from it (the store step is deferred)."""
    store = str(_store.blob_dir(cache))
    family = f"0:{src}"
    _hashing.forget_stat_cache()
    layout = _spares.new_layout(store)
    tree = _hashing.hash_tree(src, store=store, lay_out=layout)
    assert layout.done
    _spares.adopt(store, family, tree, layout)
    target.mkdir()
    _spares.lay_out(tree, cache, target, family)
    return tree


@pytest.fixture
def no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The spares' thread never comes to the store step during the test (its spares are
    due in an hour): whoever settles the store does it."""
    monkeypatch.setattr(_spares, "AFTER_S", 3600.0)
    monkeypatch.setattr(_spares, "DEFER_S", 3600.0)


def test_the_first_tree_is_written_by_the_hashing_threads_not_stored(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = source(tmp_path / "src")
    _hashing.forget_stat_cache()
    written_by: set[int] = set()
    real = _blobs.create_at

    def create_at(*args: Any) -> int:
        written_by.add(threading.get_ident())
        return real(*args)

    monkeypatch.setattr(_blobs, "create_at", create_at)  # observed only
    layout = LayOut(str(cache / "tmp" / "pre"))
    _hashing.hash_tree(src, store=_store.blob_dir(cache), lay_out=layout)
    assert layout.done
    assert written_by
    assert threading.get_ident() not in written_by
    assert files_of(Path(layout.path)) == as_built(src)
    for dirpath, _dirs, names in os.walk(layout.path):
        for name in names:
            st = os.lstat(os.path.join(dirpath, name))
            assert st.st_nlink == 1  # its own file, as cp -r makes it
            assert st.st_mtime_ns == _blobs.BLOB_MTIME_NS  # stamped: a write would show
    assert not _store.blob_dir(cache).exists() or blobs_of(cache) == {}
    shutil.rmtree(layout.path)


def test_the_background_step_gives_what_the_old_path_gave(
    tmp_path: Path, cache: Path, no_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_statcache, "RACY_NS", 0)  # files just written are remembered too
    src = source(tmp_path / "src")
    env = tmp_path / "env"
    tree = first_build(src, cache, env)
    assert files_of(env) == as_built(src)
    assert _layout.pending(str(_store.blob_dir(cache))) == 1
    _layout.settle(str(_store.blob_dir(cache)))
    new_blobs = blobs_of(cache)
    new_stat = {e.source: _statcache.lookup(e.source, os.stat(e.source)) for e in tree.entries}

    # The old path, in a cache of its own: stored while hashed, then linked.
    old = tmp_path / "old-cache"
    _hashing.forget_stat_cache()
    old_tree = _hashing.hash_tree(src, store=_store.blob_dir(old))
    old_env = tmp_path / "old-env"
    _store.materialize(old_tree, old, old_env)
    assert old_tree == tree
    old_blobs = blobs_of(old)
    old_stat = {e.source: _statcache.lookup(e.source, os.stat(e.source)) for e in tree.entries}

    assert sorted(new_blobs) == sorted(old_blobs)
    assert {n: v[1:] for n, v in new_blobs.items()} == {n: v[1:] for n, v in old_blobs.items()}
    assert new_stat == old_stat
    assert None not in new_stat.values()
    assert files_of(env) == files_of(old_env)
    # Each file of the env is its blob (one inode), as a lay-out by links makes it; of two
    # equal files the first written is the blob and the other keeps its own inode.
    shared = 0
    for entry in tree.entries:
        ino = (env / entry.rel).lstat().st_ino
        shared += ino == new_blobs[entry.blob_name][0]
    assert shared == len({e.blob_name for e in tree.entries})


def test_a_build_before_the_background_step_stores_the_tree_first(
    tmp_path: Path, cache: Path, no_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step not started: the next build (here of another source with the same files)
    does it itself, then links: it stores nothing anew."""
    src = source(tmp_path / "src")
    first_build(src, cache, tmp_path / "env")
    store = str(_store.blob_dir(cache))
    assert _layout.pending(store) == 1
    other = tmp_path / "other"
    shutil.copytree(src, other, copy_function=shutil.copy2)
    other_tree = _hashing.hash_tree(other)  # no store: its build stores what is missing
    target = tmp_path / "env2"
    target.mkdir()
    stored = _spares.lay_out(other_tree, cache, target, f"0:{other}")
    assert stored == 0  # every blob was there: the first tree's, stored by this build
    assert _layout.pending(store) == 0
    assert files_of(target) == as_built(src)
    blobs = blobs_of(cache)
    for entry in other_tree.entries:
        assert (target / entry.rel).lstat().st_ino == blobs[entry.blob_name][0]


def test_a_build_racing_the_background_step_waits_for_it(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step under way on the spares' thread (held half-way here): a build of the same
    source waits for it and then finds every blob; the thread's spare is the next one."""
    src = source(tmp_path / "src")
    held, release = threading.Event(), threading.Event()
    real = _layout._link_in
    count = [0]

    def link_in(*args: Any) -> None:
        if threading.current_thread().name == "jre-tree-spares":
            count[0] += 1
            if count[0] == FILES // 2:
                held.set()
                assert release.wait(60)
        real(*args)

    monkeypatch.setattr(_layout, "_link_in", link_in)
    tree = first_build(src, cache, tmp_path / "env")
    assert held.wait(60), "the spares' thread never came to the store step"
    done: list[int] = []
    second = tmp_path / "env2"
    second.mkdir()
    builder = threading.Thread(
        target=lambda: done.append(_spares.lay_out(tree, cache, second, f"0:{src}"))
    )
    builder.start()
    builder.join(0.3)
    assert builder.is_alive()  # waiting for the thread's step (it cannot finish without it)
    release.set()
    builder.join(60)
    assert done == [0]  # nothing stored anew
    assert files_of(second) == as_built(src)
    blobs = blobs_of(cache)
    assert {e.blob_name for e in tree.entries} <= set(blobs)
    assert _layout.pending() == 0


_CHILD = """
import os, signal, sys
from pathlib import Path
sys.path[:0] = [{tests!r}]
from test_store_later import first_build, source
from jupyter_runtimeenv.plugins import _layout, _spares, _store
_spares.AFTER_S = _spares.DEFER_S = 3600.0
tmp, kill_at = Path(sys.argv[1]), int(sys.argv[2])
cache = tmp / "cache"
src = tmp / "src"
first_build(src, cache, tmp / "env")
real, done = _layout._link_in, [0]
def link_in(*args):
    real(*args)
    done[0] += 1
    if done[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
_layout._link_in = link_in
_layout.settle(str(_store.blob_dir(cache)))
"""


@pytest.mark.parametrize("kill_at", [1, FILES // 2])
def test_a_sigkill_in_the_background_step_leaves_a_store_a_rebuild_can_trust(
    tmp_path: Path, kill_at: int
) -> None:
    src = source(tmp_path / "src")
    (tmp_path / "cache" / "tmp").mkdir(parents=True)
    tests = str(Path(__file__).parent)
    child = subprocess.run(
        [sys.executable, "-c", _CHILD.format(tests=tests), str(tmp_path), str(kill_at)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    cache = tmp_path / "cache"
    blobs = blobs_of(cache)  # every blob holds its name's content; no temporary name
    assert 1 <= len(blobs) < FILES
    assert files_of(tmp_path / "env") == as_built(src)  # the env stayed whole
    # A rebuild in this process (which never saw the tree) is the source, every blob valid.
    _hashing.forget_stat_cache()
    tree = _hashing.hash_tree(src, store=_store.blob_dir(cache))
    again = tmp_path / "again"
    _store.materialize(tree, cache, again)
    assert files_of(again) == as_built(src)
    blobs = blobs_of(cache)
    for entry in tree.entries:
        assert blobs[entry.blob_name][1] == entry.mode
    shutil.rmtree(cache / "tmp", ignore_errors=True)


def test_a_file_written_before_the_background_step_is_not_stored(
    tmp_path: Path, cache: Path, no_thread: None
) -> None:
    """Before the step, the env's files are its own (one link: a worker's copy-on-write
    guard lets a task write in place). A file written, or swapped for a symlink, is not put
    in the store under the hash of what it held; a later tree gets the source's content."""
    src = source(tmp_path / "src")
    env = tmp_path / "env"
    tree = first_build(src, cache, env)
    victim = env / "d1" / "sub" / "f1.txt"
    os.chmod(victim, 0o644)
    with open(victim, "r+") as f:
        f.write("EVIL")
    swapped = env / "d2" / "sub" / "f2.txt"
    swapped.unlink()
    swapped.symlink_to("/etc/hostname")
    # A copy with its metadata over a file of the same size: size, mode and mtime (the
    # blob stamp) as written, only the ctime says it was written.
    os.chmod(env / "twin2.txt", 0o644)
    shutil.copy2(env / "twin1.txt", env / "twin2.txt")
    assert _blobs.valid((env / "twin2.txt").lstat(), 4, 0o444)
    _layout.settle(str(_store.blob_dir(cache)))
    blobs = blobs_of(cache)
    by_rel = {e.rel: e for e in tree.entries}
    assert by_rel["d1/sub/f1.txt"].blob_name not in blobs
    assert by_rel["d2/sub/f2.txt"].blob_name not in blobs
    assert by_rel["twin2.txt"].blob_name not in blobs
    assert len(blobs) == len({e.blob_name for e in tree.entries}) - 3
    later = tmp_path / "later"
    _store.materialize(tree, cache, later)
    assert files_of(later) == as_built(src)


@contextlib.contextmanager
def tmpfs(where: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at ``where`` meanwhile (unmounted in a finally); skips the test
    where mounting is not allowed."""
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs with few inodes (hard links count against them, Linux 5.x+)."""
    # Room for the cache's directories and the first tree's files, not for their links.
    inodes = FILES + 3 + 30 + 2 + 256 + 20
    with tmpfs(tmp_path / "disk", f"size=64m,nr_inodes={inodes}") as mnt:
        try:
            yield mnt
        finally:
            _spares.drop(str(_store.blob_dir(mnt / "cache")))


def test_a_full_disk_in_the_background_step_leaves_the_env_usable_and_the_store_sound(
    tmp_path: Path, small_disk: Path, no_thread: None, caplog: pytest.LogCaptureFixture
) -> None:
    src = source(tmp_path / "src")
    cache = small_disk / "cache"
    (cache / "tmp").mkdir(parents=True)
    _store.prepare(cache)  # the agent makes the 256 shards at its start
    env = small_disk / "env"
    first_build(src, cache, env)
    store = str(_store.blob_dir(cache))
    with caplog.at_level(logging.WARNING, logger="jupyter_runtimeenv"):
        _layout.settle(store)
    assert _layout.pending(store) == 0
    assert files_of(env) == as_built(src)  # usable: whole, as built
    blobs = blobs_of(cache)  # sound: each blob its name's content, stamped
    assert len(blobs) < FILES
    (message,) = [r.getMessage() for r in caplog.records if "is full" in r.getMessage()]
    assert store in message
    assert "ENOSPC" in message
    assert str(env) in message


async def test_a_full_disk_while_a_tree_is_parsed_is_the_cache_not_the_spec(
    tmp_path: Path, make_agent: Any
) -> None:
    """A parse in an agent's process stores what it hashes: the cache's disk full then is
    ``CacheUnavailable`` naming the store and the file (it was "invalid spec ... OSError:
    [Errno 28]"), for a small tree (stored while hashed) and a large one (written as its
    lay-out first, whose failure sends the rest to the store)."""
    small = tmp_path / "small"
    write(small, {"a.txt": "a", "b.txt": "b"})
    large = source(tmp_path / "large")
    with tmpfs(tmp_path / "disk", "size=24m") as disk:
        cache = disk / "cache"
        cache.mkdir(mode=0o700)
        agent = await make_agent(cache_dir=cache)
        filler = disk / "filler"
        with open(filler, "wb") as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
        try:
            for src in (small, large):
                _hashing.forget_stat_cache()
                with pytest.raises(CacheUnavailable) as caught:
                    await asyncio.to_thread(agent.parse, {"working_dir": str(src)})
                text = str(caught.value)
                assert text.startswith(f"cannot use the cache at {cache}: ")
                assert "No space left on device [ENOSPC] while storing " + str(src) in text
            filler.unlink()
            spec = await asyncio.to_thread(agent.parse, {"working_dir": str(large)})
            ctx = await agent.get_or_create(spec, "t")  # room again: the same tree builds
            assert ctx.cwd is not None
            assert files_of(Path(ctx.cwd)) == as_built(large)
        finally:
            filler.unlink(missing_ok=True)
            await agent.stop()
