"""A large new tree hashed into its lay-out by this thread and a helper process
(``plugins/_hashhelp.py``, ``plugins/_hash_child.py``): the same lay-out, digest and store as
the threads make, and every failure still the caller's.

Real parts: real files, the real content store, the real helper process.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_spares import write
from test_store_later import as_built, tmpfs
from test_store_later import files_of as built

from jupyter_runtimeenv.errors import CacheUnavailable, SpecError
from jupyter_runtimeenv.plugins import (
    _blobs,
    _hash_child,
    _hashhelp,
    _hashing,
    _layout,
    _spares,
    _statcache,
    _store,
    _walk,
)
from jupyter_runtimeenv.plugins._layout import LayOut
from jupyter_runtimeenv.spec.files import BadFile

FILES = 300  # over 2 * _hashhelp.STREAM_FROM: a stream begun during the walk


def source(root: Path) -> Path:
    write(root, {f"d{i % 7}/sub/f{i}.txt": f"content {i}\n" * (i % 50) for i in range(FILES)})
    (root / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "secret.txt").write_text("mine")
    os.chmod(root / "secret.txt", 0o600)
    return root


def files_of(root: Path) -> dict[str, tuple[bytes, int, int]]:
    """Each file's bytes, mode and mtime."""
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath, name)
            st = path.lstat()
            out[str(path.relative_to(root))] = (path.read_bytes(), st.st_mode, st.st_mtime_ns)
    return out


def hashed(src: Path, cache: Path, name: str, helper: bool) -> tuple[_hashing.Tree, LayOut]:
    _hashing.forget_stat_cache()
    layout = LayOut(str(cache / "tmp" / name))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(_hashhelp.ENV_VAR, "1" if helper else "0")
        tree = _hashing.hash_tree(src, store=_store.blob_dir(cache), lay_out=layout)
    return tree, layout


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def open_files() -> set[str]:
    """What this process's descriptors point at (``pipe:[inode]``, paths)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
    return out


def test_a_large_new_tree_is_laid_out_with_the_helper_as_the_threads_lay_it_out(
    tmp_path: Path, cache: Path
) -> None:
    """The helper is given every file (from the front), in frames sent as the walk finds
    them (the last one ends the job), and the lay-out is the one the threads make of the
    same tree: bytes, modes (0444, 0555, 0400), blob stamps, the digest; each file's
    (inode, ctime) as written is recorded for the store step. (Which of the two did which
    file depends on who got a core first.)"""
    src = source(tmp_path / "src")
    frames: list[tuple[list[Any], bool]] = []
    real = _hashhelp.Helper.send

    def send(self: _hashhelp.Helper, root: str, files: list[Any], more: bool = False) -> None:
        frames.append((files, more))
        real(self, root, files, more)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_hashhelp.Helper, "send", send)  # observed only
        tree, layout = hashed(src, cache, "helper", True)
    assert layout.done
    assert len(frames) > 1  # some sent while the walk went on
    assert [more for _files, more in frames] == [True] * (len(frames) - 1) + [False]
    assert [f[2] for files, _more in frames for f in files] == [e.rel for e in tree.entries]
    threads, by_threads = hashed(src, cache, "threads", False)
    assert tree == threads
    assert files_of(Path(layout.path)) == files_of(Path(by_threads.path))
    modes = {stat.S_IMODE(m) for _data, m, _t in files_of(Path(layout.path)).values()}
    assert modes == {0o444, 0o555, 0o400}
    assert set(layout.made) == {e.rel for e in tree.entries}
    for rel, (ino, ctime_ns) in layout.made.items():
        st = os.lstat(Path(layout.path) / rel)
        assert (st.st_ino, st.st_ctime_ns) == (ino, ctime_ns)
        assert _blobs.valid(st, st.st_size, stat.S_IMODE(st.st_mode))


def test_the_helper_program_writes_what_it_claims_and_stops_where_the_caller_began(
    tmp_path: Path,
) -> None:
    """``_hash_child.run`` (the helper's loop, run here): each file it claims is written
    whole with its mode and the stamp and answered with its sha256, inode and ctime; a file
    that is not its stat (here: a /proc file, longer than its size) is left out and its
    claim removed; the first file found claimed (the caller's) ends the job."""
    src = tmp_path / "src"
    write(src, {f"f{i}.txt": f"text {i}" * i for i in range(6)})
    (src / "proc").symlink_to("/proc/version")
    root = tmp_path / "lay"
    root.mkdir()
    (root / "f1.txt").write_text("the caller's")
    names = ["f5.txt", "proc", "f4.txt", "f3.txt", "f2.txt", "f1.txt", "f0.txt"]
    files = []
    for i, name in enumerate(names):
        st = os.stat(src / name)
        files.append((i, str(src / name), name, st.st_dev, st.st_ino, st.st_size, 0o444))
    done = _hash_child.run(str(root), _blobs.BLOB_MTIME_NS, files, os.umask(0o022))
    os.umask(0o022)
    assert [d[0] for d in done] == [0, 2, 3, 4]  # not "proc"; stopped at f1
    for index, sha, ino, ctime_ns in done:
        out = root / names[index]
        data = out.read_bytes()
        assert data == (src / names[index]).read_bytes()
        assert sha == hashlib.sha256(data).hexdigest()
        st = out.stat()
        assert (st.st_ino, st.st_ctime_ns) == (ino, ctime_ns)
        assert _blobs.valid(st, len(data), 0o444)
    assert sorted(p.name for p in root.iterdir()) == [
        "f1.txt",
        "f2.txt",
        "f3.txt",
        "f4.txt",
        "f5.txt",
    ]
    assert (root / "f1.txt").read_text() == "the caller's"


def test_the_tree_stored_after_the_build_is_the_one_hashed(tmp_path: Path, cache: Path) -> None:
    """The build takes the helper's lay-out as the source's spare, and the store step after
    it links the files in: the store then holds each blob, valid, one of the env's inodes."""
    src = source(tmp_path / "src")
    tree, layout = hashed(src, cache, "pre", True)
    store = str(_store.blob_dir(cache))
    family = f"0:{src}"
    _spares.adopt(store, family, tree, layout)
    target = tmp_path / "env"
    target.mkdir()
    _spares.lay_out(tree, cache, target, family)
    _layout.settle(store)
    inodes: dict[str, set[int]] = {}
    for entry in tree.entries:
        inodes.setdefault(entry.blob_name, set()).add((target / entry.rel).stat().st_ino)
    for entry in tree.entries:  # (equal files: the blob is one of them)
        blob = Path(_store.blob_path(cache, entry.blob_name))
        assert _blobs.valid(blob.lstat(), entry.size, entry.mode)
        assert blob.stat().st_ino in inodes[entry.blob_name]
        assert _blobs.sha256_of(str(blob)) == entry.sha256


def test_a_pseudo_file_fails_the_hash_and_leaves_nothing(tmp_path: Path, cache: Path) -> None:
    """A file whose content is not its size (a /proc file through a symlink, as a file being
    written would be): the helper leaves it, this thread reads it and raises ``BadFile`` as
    before; the lay-out is removed and no descriptor is left; the next tree hashes whole."""
    src = source(tmp_path / "src")
    (src / "d3" / "sub" / "version").symlink_to("/proc/version")
    before = fds()
    layout = LayOut(str(cache / "tmp" / "bad"))
    _hashing.forget_stat_cache()
    with pytest.raises(BadFile, match="longer than its size"):
        _hashing.hash_tree(src, store=_store.blob_dir(cache), lay_out=layout)
    assert not layout.done
    assert not os.path.exists(layout.path)
    assert fds() <= before  # (the helper's pipes closed: it was stopped)
    (src / "d3" / "sub" / "version").unlink()
    tree, layout = hashed(src, cache, "good", True)
    assert layout.done
    assert len(tree.entries) == FILES + 2


def test_a_helper_gone_leaves_its_files_to_this_thread(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper killed (SIGKILL) before it answers: its share is read here, the lay-out is
    whole and the same; the next hash starts another helper."""
    src = source(tmp_path / "src")
    real = _hashhelp.take
    killed: list[int] = []

    def take() -> _hashhelp.Helper | None:
        helper = real() or _hashhelp.Helper()
        os.kill(helper.pid, 9)
        killed.append(helper.pid)
        return helper

    monkeypatch.setattr(_hashhelp, "take", take)
    tree, layout = hashed(src, cache, "killed", True)
    monkeypatch.undo()
    assert killed
    assert layout.done
    _threads_tree, by_threads = hashed(src, cache, "threads", False)
    assert files_of(Path(layout.path)) == files_of(Path(by_threads.path))
    again, layout = hashed(src, cache, "again", True)
    assert again == tree
    assert layout.done
    helper = _hashhelp.take()
    assert helper is not None
    assert helper.pid not in killed
    _hashhelp.give_back(helper)


def test_the_helper_ends_with_its_input() -> None:
    """No helper outlives its caller: the end of its input (the caller's end closed, as when
    the caller dies) ends it."""
    helper = _hashhelp.Helper()
    os.close(helper.to_w)
    deadline = time.monotonic() + 30
    while os.waitpid(helper.pid, os.WNOHANG) == (0, 0):
        assert time.monotonic() < deadline, "the helper outlived its input"
        time.sleep(0.01)
    os.close(helper.from_r)


def test_an_idle_helper_is_ended_and_reaped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A helper given back and not taken again is ended by this process and reaped: it was
    left to end itself after 20 s idle and stayed a zombie until the next hash or this
    process's end (seen under a server: ``[python] <defunct>``)."""
    no_helper()
    monkeypatch.setattr(_hashhelp, "RETIRE_S", 0.2)
    helper = _hashhelp.Helper()
    _hashhelp.give_back(helper)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{helper.pid}"):  # a zombie's entry stays until reaped
        assert time.monotonic() < deadline, "the idle helper was not ended and reaped"
        time.sleep(0.01)
    assert _hashhelp.take() is not helper


def test_a_helper_taken_back_before_its_retirement_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    no_helper()
    monkeypatch.setattr(_hashhelp, "RETIRE_S", 0.5)
    helper = _hashhelp.Helper()
    _hashhelp.give_back(helper)
    assert _hashhelp.take() is helper
    time.sleep(1.0)  # past the retirement it would have had
    assert running(helper.pid)
    helper.stop()


def test_giving_a_helper_back_again_starts_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each new tree gives the helper back between its hash and its digest: a thread started
    there (a ``threading.Timer`` per give-back, before) waited for a core on that path. The
    helper's one retirer still ends it once it is idle, and ends with it."""
    no_helper()
    monkeypatch.setattr(_hashhelp, "RETIRE_S", 0.5)
    helper = _hashhelp.Helper()
    _hashhelp.give_back(helper)
    for _ in range(3):
        assert _hashhelp.take() is helper
        before = set(threading.enumerate())
        _hashhelp.give_back(helper)
        assert set(threading.enumerate()) - before == set()
    retirers = [t for t in threading.enumerate() if t.name == "jupyter-runtimeenv-hashhelp"]
    assert len(retirers) == 1
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{helper.pid}"):
        assert time.monotonic() < deadline, "the idle helper was not ended and reaped"
        time.sleep(0.01)
    retirers[0].join(10)
    assert not retirers[0].is_alive()
    assert _hashhelp._idle == []


async def test_a_full_disk_while_a_large_tree_is_parsed_is_the_cache_not_the_spec(
    tmp_path: Path, make_agent: Any
) -> None:
    """The helper's path meets a full cache disk as the threads' did: ``CacheUnavailable``
    naming the cache and a file (the lay-out failed, the rest went to the store), and the
    same tree builds once there is room."""
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
            _hashing.forget_stat_cache()
            with pytest.raises(CacheUnavailable) as caught:
                await asyncio.to_thread(agent.parse, {"working_dir": str(large)})
            text = str(caught.value)
            assert text.startswith(f"cannot use the cache at {cache}: ")
            assert "No space left on device [ENOSPC] while storing " + str(large) in text
            filler.unlink()
            _hashing.forget_stat_cache()
            spec = await asyncio.to_thread(agent.parse, {"working_dir": str(large)})
            ctx = await agent.get_or_create(spec, "t")
            assert ctx.cwd is not None
            assert built(Path(ctx.cwd)) == as_built(large)
        finally:
            filler.unlink(missing_ok=True)
            await agent.stop()


HASH_AND_DIE = """
import os, sys
from pathlib import Path
from jupyter_runtimeenv.plugins import _hashhelp, _hashing, _store
from jupyter_runtimeenv.plugins._layout import LayOut
helper = _hashhelp.take()
_hashhelp.give_back(helper)
print(helper.pid, flush=True)
sys.stdin.readline()
cache = sys.argv[2]
store = str(_store.blob_dir(Path(cache)))
_hashing.hash_tree(sys.argv[1], store=store, lay_out=LayOut(cache + "/tmp/l"))
"""


def test_a_caller_killed_mid_hash_leaves_no_helper(tmp_path: Path, cache: Path) -> None:
    """SIGKILL of the hashing process while the helper works: the helper ends with its job
    (its input closed, its answer nowhere to go)."""
    src = tmp_path / "src"
    write(src, {f"d{i % 20}/f{i}.bin": "x" * 20_000 for i in range(3000)})
    child = subprocess.Popen(
        [sys.executable, "-c", HASH_AND_DIE, str(src), str(cache)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdin is not None
    helper = int(child.stdout.readline())
    child.stdin.write("go\n")
    child.stdin.flush()
    deadline = time.monotonic() + 30
    while not (cache / "tmp" / "l").exists():  # the hash has begun
        assert time.monotonic() < deadline
        time.sleep(0.001)
    kill_and_outlive(child, helper)


def kill_and_outlive(child: subprocess.Popen[str], helper: int) -> None:
    """SIGKILL ``child`` and wait (30 s at most) until its hash helper ``helper`` has ended
    too: its input closed, nothing else tells it."""
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    deadline = time.monotonic() + 30
    while running(helper):
        assert time.monotonic() < deadline, "the helper outlived its process"
        time.sleep(0.01)


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def no_helper() -> None:
    """End this process's idle helper, if any."""
    helper = _hashhelp.take()
    if helper is not None:
        helper.stop()


def test_the_walk_of_a_large_new_tree_starts_the_helper_a_small_one_none(
    tmp_path: Path, cache: Path
) -> None:
    """The walk of a new tree takes the helper (starting it) once it has found
    ``STREAM_FROM`` files, before it lists the rest of the tree (the helper's start and its
    first files overlap the rest of the walk), and only once; a tree of 40 files takes none."""
    src = source(tmp_path / "src")
    small = tmp_path / "small"
    write(small, {f"d{i % 4}/f{i}.txt": str(i) for i in range(40)})
    listed: list[str] = []
    taken: list[int] = []
    take, list_dir = _hashhelp.take, _walk.Walk._list

    def listing(self: _walk.Walk, dirpath: str) -> Any:
        listed.append(dirpath)
        return list_dir(self, dirpath)

    def taking() -> _hashhelp.Helper | None:
        taken.append(len(listed))
        return take()

    no_helper()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_walk.Walk, "_list", listing)  # observed only
        mp.setattr(_hashhelp, "take", taking)
        _tree, layout = hashed(small, cache, "small", True)
        assert taken == []
        assert _hashhelp._idle == []
        listed.clear()
        _tree, layout = hashed(src, cache, "large", True)
    assert layout.done
    assert len(taken) == 1
    assert 0 < taken[0] < len(listed) - 1
    assert len(_hashhelp._idle) == 1  # given back, for the next tree


def test_a_walk_that_fails_after_the_helper_began_leaves_nothing(
    tmp_path: Path, cache: Path
) -> None:
    """A tree found over its limit after the walk began handing files to the helper: the
    ``SpecError`` as before, the helper stopped (it may have been writing), the lay-out
    removed, no descriptor left; the next tree hashes whole with a new helper."""
    src = tmp_path / "src"
    write(src, {f"d{i % 20:02d}/f{i}.bin": "x" * 1000 for i in range(400)})
    no_helper()
    layout = LayOut(str(cache / "tmp" / "over"))
    taken: list[_hashhelp.Helper] = []
    pipes: set[str] = set()
    take = _hashhelp.take

    def taking() -> _hashhelp.Helper | None:
        helper = take()
        if helper is not None:
            taken.append(helper)
            pipes.update(os.readlink(f"/proc/self/fd/{fd}") for fd in (helper.to_w, helper.from_r))
        return helper

    _hashing.forget_stat_cache()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_hashhelp, "take", taking)
        with pytest.raises(SpecError, match="over the limit"):
            _hashing.hash_tree(
                src,
                store=_store.blob_dir(cache),
                lay_out=layout,
                limit=300_000,
                field="working_dir",
            )
    (helper,) = taken
    assert not running(helper.pid)
    assert not layout.done
    assert not os.path.exists(layout.path)
    # No descriptor of its pipes or of the lay-out left (counting all of them raced other
    # tests' background threads in the full suite).
    left = open_files()
    assert len(pipes) == 2
    assert not pipes & left
    assert not [f for f in left if f.startswith(layout.path)]
    tree, layout = hashed(src, cache, "whole", True)
    assert layout.done
    assert len(tree.entries) == 400


def test_the_helper_program_imports_only_what_it_uses() -> None:
    """The helper's start (a new ``python -I -S``) is on the path of a process's first large
    tree: its program imports the few standard modules it uses and none of what
    ``contextlib`` would bring (``collections``, ``functools``: ~5 of its ~20 ms here)."""
    child = str(Path(_hash_child.__file__))
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-X", "importtime", child],
        stdin=subprocess.DEVNULL,  # the end of its input: it ends at once
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert {"hashlib", "marshal", "select", "struct"} <= imported
    assert not imported & {"contextlib", "collections", "functools", "typing"}


@pytest.mark.parametrize("layout_kind", ["dirs", "flat"])
def test_a_tree_the_stat_cache_knows_is_not_read_again(
    tmp_path: Path, cache: Path, layout_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same files walked with other excludes (a memo this process does not have, a stat
    cache that knows every file): no helper and no lay-out; nothing is read again. Both the
    stream begun during the walk (files in many directories) and the one begun after it (all
    in one directory) are checked."""
    if layout_kind == "dirs":
        src = source(tmp_path / "src")
    else:
        src = tmp_path / "src"
        write(src, {f"f{i}.txt": f"flat {i}\n" * (i % 50) for i in range(FILES)})
    monkeypatch.setattr(_statcache, "RACY_NS", 0)  # files just written are remembered too
    first, layout = hashed(src, cache, "first", True)
    assert layout.done
    _spares.drop(str(_store.blob_dir(cache)))
    shutil.rmtree(layout.path, ignore_errors=True)
    taken: list[int] = []
    take = _hashhelp.take

    def taking() -> _hashhelp.Helper | None:
        taken.append(1)
        return take()

    reads: list[str] = []
    hash_one = _hashing._hash_one

    def reading(path: str, *args: Any, **kwargs: Any) -> str:
        reads.append(path)
        return hash_one(path, *args, **kwargs)

    again = LayOut(str(cache / "tmp" / "again"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_hashhelp, "take", taking)
        mp.setattr(_hashing, "_hash_one", reading)
        mp.setenv(_hashhelp.ENV_VAR, "1")
        tree = _hashing.hash_tree(
            src, ["nothing-matches-this"], store=_store.blob_dir(cache), lay_out=again
        )
    assert tree.digest == first.digest
    assert taken == []
    assert reads == []
    assert not again.done
    assert not os.path.exists(again.path)
