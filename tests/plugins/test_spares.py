"""Spare trees (``plugins/_spares.py``): the next version of an edited tree is laid out as
the difference from a spare copy of the last, and is exactly the tree a whole lay-out makes.

Real parts: real files, the real content store, the real background thread.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from jupyter_runtimeenv import _cpuload
from jupyter_runtimeenv.plugins import _hashing, _spares, _store
from jupyter_runtimeenv.plugins._hashing import Tree

#: No spare may be left in the cache's tmp after a test (``conftest.cache``).
SPARES_LEFT = False


def write(root: Path, files: dict[str, str | None]) -> None:
    """Write (str) or remove (None) each file; an empty directory left is removed."""
    for rel, text in files.items():
        path = root / rel
        if text is None:
            path.unlink()
            parent = path.parent
            while parent != root and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


def shape(root: Path) -> dict[str, tuple[str, int, int]]:
    """Each file's content, mode and inode; each directory as ('dir', mode, 0)."""
    out: dict[str, tuple[str, int, int]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs:
            path = Path(dirpath, name)
            out[str(path.relative_to(root))] = ("dir", stat.S_IMODE(path.lstat().st_mode), 0)
        for name in files:
            path = Path(dirpath, name)
            st = path.lstat()
            out[str(path.relative_to(root))] = (path.read_text(), stat.S_IMODE(st.st_mode), 0)
    return out


def wait_ready(family: str, count: int = 1) -> None:
    """Wait (bounded) until ``count`` spares of ``family`` are laid out."""
    deadline = time.monotonic() + 30
    while sum(f == family and ready for _s, f, ready in _spares.spares()) < count:
        assert time.monotonic() < deadline, "the spare was never laid out"
        time.sleep(0.01)


def hashed(src: Path, cache: Path) -> Tree:
    return _hashing.hash_tree(src, store=_store.blob_dir(cache))


def counting_links(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Observe the links this thread makes (the store's ``place`` links each file it lays
    out; the spares' thread, laying out the next spare meanwhile, is not counted)."""
    made: list[str] = []
    real: Callable[..., None] = os.link
    me = threading.get_ident()

    def link(src: str, dst: str, *args: object, **kwargs: object) -> None:
        if threading.get_ident() == me:
            made.append(dst)
        real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", link)
    return made


def test_each_version_is_the_tree_a_whole_lay_out_makes(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    write(src, {f"pkg/m{i}.py": f"# {i}\n" for i in range(20)})
    write(src, {"top.txt": "top", "data/deep/x.csv": "1,2", "gone/a.txt": "a", "f": "file"})
    (src / "run.sh").write_text("#!/bin/sh\n")
    family = f"0:{src}"
    _hashing.forget_stat_cache()
    versions = [
        {},  # the first lay-out of the source: whole (no spare yet), and a spare is made
        {"pkg/m1.py": "# changed\n"},  # the second, from the spare of the first
        {  # the third, from the spare of the second: every kind of difference
            "pkg/m2.py": "# changed too\n",
            "gone/a.txt": None,  # a file and its directory go
            "f": None,  # a file becomes a directory
            "f/inside.txt": "in",
            "data/deep/x.csv": None,
            "data/deep": "a directory became a file",
            "new/dir/n.txt": "new",
        },
        {"top.txt": "top", "pkg/m3.py": None},  # a file rewritten with the same content
        {"run.sh": "#!/bin/sh\necho\n"},
    ]
    for i, change in enumerate(versions):
        write(src, change)
        if i == 4:
            os.chmod(src / "run.sh", 0o755)  # the mode changes too
        time.sleep(0.01)
        tree = hashed(src, cache)
        if i >= 1:
            wait_ready(family)
        made = counting_links(monkeypatch)
        target = tmp_path / f"v{i}"
        target.mkdir()
        _spares.lay_out(tree, cache, target, family)
        monkeypatch.undo()
        whole = tmp_path / f"whole{i}"
        _store.materialize(tree, cache, whole)
        assert shape(target) == shape(whole)
        for entry in tree.entries:  # links to the blobs, as a whole lay-out makes them
            blob = Path(_store.blob_path(cache, entry.blob_name))
            assert (target / entry.rel).stat().st_ino == blob.stat().st_ino
        if i == 0:
            assert len(made) == len(tree.entries)
        else:  # only what differs is linked
            changed = {1: 1, 2: 4, 3: 0, 4: 1}[i]
            assert len(made) == changed, made


def test_a_file_written_through_another_link_is_not_kept(tmp_path: Path, cache: Path) -> None:
    """The spare shares its files' inodes with the blobs and every env using them: a write
    in place through another link (a subprocess past the workers' guard) changes the spare
    too. The next version does not keep it: it gets the content the source has."""
    src = tmp_path / "src"
    write(src, {"a.txt": "original", "b.txt": "b"})
    family = f"0:{src}"
    _hashing.forget_stat_cache()
    for i in range(2):
        target = tmp_path / f"v{i}"
        target.mkdir()
        _spares.lay_out(hashed(src, cache), cache, target, family)
    wait_ready(family)
    victim = tmp_path / "v1" / "a.txt"  # an env's link to the blob the spare links too
    os.chmod(victim, 0o644)
    with open(victim, "r+") as f:
        f.write("EVIL")
    write(src, {"b.txt": "b2"})
    target = tmp_path / "v2"
    target.mkdir()
    _spares.lay_out(hashed(src, cache), cache, target, family)
    assert (target / "a.txt").read_text() == "original"
    assert (target / "b.txt").read_text() == "b2"
    assert stat.S_IMODE((target / "a.txt").stat().st_mode) == 0o444


def test_a_spare_that_cannot_be_updated_gives_a_whole_lay_out(tmp_path: Path, cache: Path) -> None:
    """A spare whose files are not what it was made with (here removed by hand) fails its
    update half-way: the target is laid out whole instead, nothing of the spare is left."""
    src = tmp_path / "src"
    write(src, {"a.txt": "a", "d/b.txt": "b"})
    family = f"0:{src}"
    _hashing.forget_stat_cache()
    for i in range(2):
        target = tmp_path / f"v{i}"
        target.mkdir()
        _spares.lay_out(hashed(src, cache), cache, target, family)
    wait_ready(family)
    (spare,) = [p for p in (cache / "tmp").iterdir() if "-spare-" in p.name]
    (spare / "d" / "b.txt").unlink()  # the update must unlink it: ENOENT
    write(src, {"d/b.txt": "b changed"})
    target = tmp_path / "v2"
    target.mkdir()
    _spares.lay_out(hashed(src, cache), cache, target, family)
    assert shape(target) == {
        "a.txt": ("a", 0o444, 0),
        "d": ("dir", shape(tmp_path / "v0")["d"][1], 0),
        "d/b.txt": ("b changed", 0o444, 0),
    }
    assert not spare.exists()


@pytest.mark.parametrize("idle", [True, False])
def test_a_spare_is_due_at_once_only_when_a_core_is_free(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, idle: bool
) -> None:
    """After a lay-out (the first of its source too) a spare is laid out ``AFTER_S`` later
    when a core is free, and ``DEFER_S`` later when none is: its links then wait for the
    env's first task."""
    src = tmp_path / "src"
    write(src, {"a.txt": "a"})
    family = f"0:{src}"
    monkeypatch.setattr(_spares, "_free", lambda mark: idle)
    before = time.monotonic()
    target = tmp_path / "v0"
    target.mkdir()
    _spares.lay_out(hashed(src, cache), cache, target, family)
    after = time.monotonic()
    with _spares._lock:
        spare = _spares._spares[(str(_store.blob_dir(cache)), family)]
    assert _spares.AFTER_S < _spares.DEFER_S
    if idle:
        assert spare.due <= after + _spares.AFTER_S
    else:
        assert spare.due >= before + _spares.DEFER_S
    wait_ready(family)


def test_a_core_is_free_when_fewer_threads_than_cores_are_runnable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``_idle`` reads the kernel's count of runnable threads (``_cpuload``), which counts the
    caller; an unknown count is no free core."""
    monkeypatch.setattr(_spares, "cpus", lambda: 1)
    assert not _spares._idle()  # this thread runs: no core of one is free
    monkeypatch.setattr(_spares, "cpus", lambda: 1 << 30)
    assert _spares._idle()
    monkeypatch.setattr(_spares, "runnable", lambda: None)
    assert not _spares._idle()


def test_a_core_is_free_when_the_build_did_not_wait_for_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_free`` reads the kernel's count of CPU waits (a pressure file, here one written by
    the test) at the build's start (``_clock``) and end: free when the build's time saw no
    wait; busy when it saw more waiting than its length; the instant count (``_idle``)
    where the kernel keeps no such file."""
    psi = tmp_path / "cpu"
    monkeypatch.setattr(_cpuload, "PSI", str(psi))

    def waits(total: int) -> None:
        psi.write_text(f"some avg10=0.00 avg60=0.00 avg300=0.00 total={total}\n")

    waits(1_000)
    mark = _spares._clock()
    assert mark[1] == 1_000
    time.sleep(0.002)
    assert _spares._free(mark)  # no wait at all
    waits(1_000 + 10**9)  # a thousand seconds of waits: longer than any build
    assert not _spares._free(mark)
    psi.unlink()
    for idle in (True, False):
        monkeypatch.setattr(_spares, "_idle", lambda idle=idle: idle)
        assert _spares._free(mark) is idle
        assert _spares._free((time.monotonic(), None)) is idle
        assert _spares._clock()[1] is None


def test_a_spare_due_at_once_does_not_wait_for_one_deferred(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread waiting for a deferred spare's time is woken by a spare due at once (it
    used to sleep until the deferred one was due: an edit right after a busy build then
    found no spare after the next, quiet one either)."""
    monkeypatch.setattr(_spares, "DEFER_S", 3600.0)
    _hashing.forget_stat_cache()
    for n, free in enumerate((False, True)):
        monkeypatch.setattr(_spares, "_free", lambda mark, free=free: free)
        src = tmp_path / f"src{n}"
        write(src, {"a.txt": f"{n}"})
        target = tmp_path / f"v{n}"
        target.mkdir()
        _spares.lay_out(hashed(src, cache), cache, target, f"0:{src}")
        if not free:  # the thread waits on the condition for the deferred spare's time
            deadline = time.monotonic() + 30
            while not _spares._changed._waiters:  # type: ignore[attr-defined]
                assert time.monotonic() < deadline, "the spares thread never waited"
                time.sleep(0.01)
    wait_ready(f"0:{tmp_path / 'src1'}")
    assert not any(f == f"0:{tmp_path / 'src0'}" and ready for _s, f, ready in _spares.spares())


def test_a_spare_of_a_touched_blob_is_checked_when_taken(tmp_path: Path, cache: Path) -> None:
    """A spare links its blobs unchecked (``_link_spare``): one touched through an env's
    link before the spare is laid out is linked into the spare as it is, and the build that
    takes it does not keep it (its stamp is not a blob's): the source's content is what the
    next version gets, and the store has it again."""
    src = tmp_path / "src"
    write(src, {"a.txt": "original", "b.txt": "b"})
    family = f"0:{src}"
    _hashing.forget_stat_cache()
    target = tmp_path / "v0"
    target.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_spares, "_offer", lambda *args: None)  # no spare yet
        _spares.lay_out(hashed(src, cache), cache, target, family)
    victim = target / "a.txt"  # the env's link to the blob
    os.chmod(victim, 0o644)
    with open(victim, "r+") as f:
        f.write("EVIL")
    _spares._offer((str(_store.blob_dir(cache)), family), hashed(src, cache), cache)
    wait_ready(family)
    (spare,) = [p for p in (cache / "tmp").iterdir() if "-spare-" in p.name]
    assert (spare / "a.txt").read_text() == "EVILinal"  # linked as it was
    write(src, {"b.txt": "b2"})
    target = tmp_path / "v1"
    target.mkdir()
    _spares.lay_out(hashed(src, cache), cache, target, family)
    assert (target / "a.txt").read_text() == "original"
    assert (target / "b.txt").read_text() == "b2"
    assert stat.S_IMODE((target / "a.txt").stat().st_mode) == 0o444
    blob = Path(_store.blob_path(cache, hashed(src, cache).entries[0].blob_name))
    assert blob.read_text() == "original"


def test_drop_removes_every_spare_of_the_store(tmp_path: Path, cache: Path) -> None:
    other = tmp_path / "other-cache"
    (other / "tmp").mkdir(parents=True)
    _hashing.forget_stat_cache()
    for n in range(3):
        src = tmp_path / f"src{n}"
        write(src, {"a.txt": f"{n}"})
        for root in (cache, other):
            for i in range(2):
                target = tmp_path / f"t-{root.name}-{n}-{i}"
                target.mkdir()
                _spares.lay_out(hashed(src, root), root, target, f"0:{src}")
    for n in range(3):
        wait_ready(f"0:{tmp_path / f'src{n}'}", count=2)
    _spares.drop(str(_store.blob_dir(other)))
    assert list((other / "tmp").iterdir()) == []
    left = [s for s in _spares.spares() if s[0] == str(_store.blob_dir(cache))]
    assert len(left) == 3
    assert len([p for p in (cache / "tmp").iterdir() if "-spare-" in p.name]) == 3


def test_a_forked_child_has_none_of_its_parents_spares(tmp_path: Path, cache: Path) -> None:
    """A child forked while the parent keeps a spare (and may be laying one out, holding the
    lock) knows no spare: it would otherwise take the parent's directory, or wait for a
    thread it does not have."""
    src = tmp_path / "src"
    write(src, {"a.txt": "a"})
    family = f"0:{src}"
    _hashing.forget_stat_cache()
    for i in range(2):
        target = tmp_path / f"v{i}"
        target.mkdir()
        _spares.lay_out(hashed(src, cache), cache, target, family)
    wait_ready(family)
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        ok = _spares.spares() == [] and not _spares._thread and not _spares._lock.locked()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _spares.spares() == [(str(_store.blob_dir(cache)), family, True)]


def test_the_spares_thread_waits_for_the_next_build(tmp_path: Path, cache: Path) -> None:
    """The thread stays after its last job (``IDLE_S``): the next build's spare wakes it;
    starting a thread on each build's path cost ~1.3 ms here."""
    src = tmp_path / "src"
    write(src, {"a.txt": "a"})
    family = f"0:{src}"
    _hashing.forget_stat_cache()
    threads = []
    for i in range(2):
        write(src, {"a.txt": f"a{i}"})
        target = tmp_path / f"v{i}"
        target.mkdir()
        _spares.lay_out(hashed(src, cache), cache, target, family)
        wait_ready(family)
        deadline = time.monotonic() + 30
        while not _spares._changed._waiters:  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, "the spares thread ended with its last job"
            time.sleep(0.01)
        with _spares._lock:
            threads += _spares._thread
    assert len(threads) == 2
    assert threads[0] is threads[1]
    assert threads[0].is_alive()


def test_a_spare_whose_store_step_fails_is_none_and_the_next_is_laid_out(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spares' thread settles the store before it links a spare; when that fails (a
    full disk), this spare is dropped and the thread lives on: the next build's spare is
    laid out. Before, the thread ended with the error and, still listed as running, was
    only ever "woken" again: no spare was made again in the process."""
    src = tmp_path / "src"
    write(src, {"a.txt": "a"})
    family = f"0:{src}"
    _hashing.forget_stat_cache()
    real = _spares.settle
    failed: list[str] = []

    def settle(store: str) -> None:
        if threading.current_thread().name == "jre-tree-spares" and not failed:
            failed.append(store)
            raise OSError(28, "No space left on device")
        real(store)

    monkeypatch.setattr(_spares, "settle", settle)
    for i in range(2):
        write(src, {"a.txt": f"a{i}"})
        target = tmp_path / f"v{i}"
        target.mkdir()
        _spares.lay_out(hashed(src, cache), cache, target, family)
        if i == 0:
            deadline = time.monotonic() + 30
            while not failed or _spares._busy:
                assert time.monotonic() < deadline, "the spare's store step never ran"
                time.sleep(0.01)
            assert not any(ready for *_, ready in _spares.spares())  # dropped, not ready
    wait_ready(family)  # the thread lived on: the second build's spare is laid out
    assert (tmp_path / "v1" / "a.txt").read_text() == "a1"
