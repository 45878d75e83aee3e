"""An unchanged tree is known without a walk (inotify), and every kind of change is seen
(issue 19 item 2, issue 20 item 8). Where inotify cannot be trusted the tree is walked."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.plugins import _hashing, _statcache, _watch

pytestmark = pytest.mark.skipif(
    _watch.watch("/tmp") is None, reason="inotify is not available here (the walk is tested)"
)


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The directories ``_hashing`` lists from now on (files just written count as settled)."""
    monkeypatch.setattr(_statcache, "RACY_NS", 0)
    _hashing.forget_stat_cache()
    listed: list[str] = []
    real = os.scandir

    def counting(path: Any) -> Any:
        listed.append(str(path))
        return real(path)

    monkeypatch.setattr(_hashing.os, "scandir", counting)
    return listed


def tree(root: Path) -> Path:
    for rel in ("a.py", "pkg/b.py", "pkg/sub/c.txt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    return root


def edit_keeping_size_and_mtime(path: Path) -> None:
    st = path.stat()
    text = path.read_text()
    path.write_text(text[::-1])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


CHANGES: list[tuple[str, Callable[[Path], object]]] = [
    ("edit in place", lambda r: (r / "pkg" / "b.py").write_text("changed")),
    ("same size and mtime", lambda r: edit_keeping_size_and_mtime(r / "pkg" / "sub" / "c.txt")),
    ("new file deep", lambda r: (r / "pkg" / "sub" / "new.py").write_text("n")),
    ("delete", lambda r: (r / "a.py").unlink()),
    ("rename", lambda r: (r / "a.py").rename(r / "pkg" / "a2.py")),
    ("chmod", lambda r: os.chmod(r / "a.py", 0o755)),
    ("new dir with a file", lambda r: _new_dir(r)),
    (".gitignore", lambda r: (r / ".gitignore").write_text("pkg/\n")),
]


def _new_dir(root: Path) -> None:
    (root / "fresh").mkdir()
    (root / "fresh" / "x.py").write_text("x")


def test_an_unchanged_tree_is_not_walked(tmp_path: Path, scans: list[str]) -> None:
    root = tree(tmp_path / "t")
    first = _hashing.hash_tree(root)
    assert scans  # walked once
    scans.clear()
    for _ in range(3):
        assert _hashing.hash_tree(root) is first
    assert scans == []


@pytest.mark.parametrize(("what", "change"), CHANGES, ids=[c[0] for c in CHANGES])
def test_every_change_is_seen(
    tmp_path: Path, scans: list[str], what: str, change: Callable[[Path], object]
) -> None:
    root = tree(tmp_path / "t")
    before = _hashing.hash_tree(root).digest
    change(root)
    after = _hashing.hash_tree(root)
    assert after.digest != before, what
    assert _hashing.hash_tree(root) is after  # and then still no walk


def test_symlinked_and_hard_linked_files_are_walked_every_time(
    tmp_path: Path, scans: list[str]
) -> None:
    outside = tmp_path / "outside.py"
    outside.write_text("1")
    root = tree(tmp_path / "t")
    (root / "link.py").symlink_to(outside)
    before = _hashing.hash_tree(root).digest
    outside.write_text("2")  # no event in the tree: it is walked
    assert _hashing.hash_tree(root).digest != before

    other = tree(tmp_path / "u")
    os.link(tmp_path / "outside.py", other / "hard.py")
    before = _hashing.hash_tree(other).digest
    (tmp_path / "outside.py").write_text("3")  # written through the other link
    assert _hashing.hash_tree(other).digest != before


def test_not_a_local_file_system_walks(
    tmp_path: Path, scans: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_watch, "local_fs", lambda _path: False)
    root = tree(tmp_path / "t")
    _hashing.hash_tree(root)
    scans.clear()
    _hashing.hash_tree(root)
    assert scans  # walked: a network mount changes behind the kernel's back


def test_an_overflowing_queue_makes_the_next_hash_walk(tmp_path: Path, scans: list[str]) -> None:
    root = tree(tmp_path / "t")
    _hashing.hash_tree(root)
    watcher = _watch._watcher()
    assert watcher is not None
    watcher._dispatch(_watch._EVENT.pack(-1, _watch._IN_Q_OVERFLOW, 0, 0))
    scans.clear()
    _hashing.hash_tree(root)
    assert scans


def test_mountinfo_is_read_with_escaped_names() -> None:
    lines = [
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw",
        r"40 22 0:35 / /mnt/my\040share rw - nfs4 server:/x rw",
        "41 22 0:36 / /mnt/fuse rw - fuse.sshfs host: rw",
    ]
    mounts = _watch.parse_mountinfo(lines)
    assert mounts == {"/": "ext4", "/mnt/my share": "nfs4", "/mnt/fuse": "fuse.sshfs"}


def test_a_tree_just_written_stands_until_an_event(tmp_path: Path) -> None:
    """With a watch the racy window does not matter: the watch was armed before the files
    were read, so the tree is known until an event, then read again."""
    _hashing.forget_stat_cache()
    root = tree(tmp_path / "t")  # every file just written: all in the racy window
    first = _hashing.hash_tree(root)
    assert _hashing.hash_tree(root) is first
    (root / "a.py").write_text("a.py")  # same content, a write: an event
    again = _hashing.hash_tree(root)
    assert again is not first
    assert again.digest == first.digest


def fresh_walk(root: Path) -> _hashing.Tree:
    """The same tree hashed with nothing remembered (the full walk)."""
    _hashing.forget_stat_cache()
    return _hashing.hash_tree(root)


MORE_CHANGES: list[tuple[str, Callable[[Path], object]]] = [
    *CHANGES,
    ("gitignore re-includes", lambda r: _reinclude(r)),
    ("dir renamed then edited", lambda r: _rename_dir_then_edit(r)),
    ("dir removed", lambda r: _remove_dir(r)),
    ("dangling symlink's target appears", lambda r: _dangling_then_target(r)),
]


def _reinclude(root: Path) -> None:
    # Only the root's .gitignore changed (in the test): pkg/sub, which holds the file it
    # excluded, had no event of its own.
    (root / ".gitignore").write_text("*.tmp\n")


def _rename_dir_then_edit(root: Path) -> None:
    (root / "pkg").rename(root / "pkg2")
    (root / "pkg2" / "sub" / "c.txt").write_text("edited after the move")


def _remove_dir(root: Path) -> None:
    shutil.rmtree(root / "pkg" / "sub")


def _dangling_then_target(root: Path) -> None:
    (root.parent / "target.py").write_text("now here")


@pytest.mark.parametrize(("what", "change"), MORE_CHANGES, ids=[c[0] for c in MORE_CHANGES])
def test_a_walk_after_events_equals_a_full_walk(
    tmp_path: Path, scans: list[str], what: str, change: Callable[[Path], object]
) -> None:
    """After events, only the directories they name are listed again; the tree is the one
    a full walk finds, for every kind of change (and twice in a row)."""
    root = tree(tmp_path / "t")
    (root / ".gitignore").write_text("*.log\n")
    (root / "pkg" / "sub" / "skip.log").write_text("ignored")
    if what.startswith("dangling"):
        (root / "pkg" / "link.py").symlink_to(tmp_path / "target.py")
    _hashing.hash_tree(root)
    change(root)
    after = _hashing.hash_tree(root)
    again = _hashing.hash_tree(root)
    full = fresh_walk(root)
    assert after.digest == full.digest, what
    assert after.entries == full.entries
    assert again is after


def test_one_changed_file_lists_only_its_directory(tmp_path: Path, scans: list[str]) -> None:
    root = tree(tmp_path / "t")
    for i in range(5):
        (root / f"d{i}").mkdir()
        (root / f"d{i}" / "f.py").write_text(str(i))
    first = _hashing.hash_tree(root)
    scans.clear()
    (root / "d3" / "f.py").write_text("changed")
    after = _hashing.hash_tree(root)
    assert scans == [str(root / "d3")]
    assert after.digest != first.digest
    assert after.digest == fresh_walk(root).digest


def test_concurrent_hashes_of_a_changing_tree_never_return_an_old_tree(tmp_path: Path) -> None:
    """Threads hashing the same tree while it changes: each hash started after a change
    sees it (the events are taken by one hash at a time, and a memo replaced meanwhile is
    never answered from)."""
    root = tree(tmp_path / "t")
    _hashing.hash_tree(root)
    stale: list[str] = []

    def check(barrier: threading.Barrier, expected: str) -> None:
        barrier.wait()
        got = {e.rel: e.sha256 for e in _hashing.hash_tree(root).entries}
        if got["pkg/b.py"] != hashlib.sha256(expected.encode()).hexdigest():
            stale.append(expected)

    for i in range(20):
        (root / "pkg" / "b.py").write_text(f"round {i}")
        barrier = threading.Barrier(4)
        threads = [threading.Thread(target=check, args=(barrier, f"round {i}")) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert stale == []


def test_a_moved_directory_is_followed_by_later_edits(tmp_path: Path, scans: list[str]) -> None:
    root = tree(tmp_path / "t")
    _hashing.hash_tree(root)
    (root / "pkg").rename(root / "moved")
    _hashing.hash_tree(root)
    for i in range(3):  # each later edit inside the moved directory is seen
        (root / "moved" / "sub" / "c.txt").write_text(f"edit {i}")
        after = _hashing.hash_tree(root)
        assert after.digest == fresh_walk(root).digest
