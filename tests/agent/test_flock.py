"""``agent/flock.py``: the cache's resource locks between processes.

The same ``flock`` as ``filelock.FileLock``, which earlier versions of this package took on the
same files (a server of an older version and a CLI of this one may share a cache): each must
exclude the other. "Another process" is another open file description on the lock file, which
is what ``flock`` tells apart (two processes, or two objects here).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import filelock
import pytest

from jupyter_runtimeenv.agent.flock import FileLock, LockTimeout
from jupyter_runtimeenv.errors import RuntimeEnvError


def test_a_held_lock_refuses_another_until_released(tmp_path: Path) -> None:
    path = str(tmp_path / "r.lock")
    first, second = FileLock(path), FileLock(path)
    first.acquire(timeout=0)
    with pytest.raises(LockTimeout, match=r"r\.lock is held by another process"):
        second.acquire(timeout=0)
    with pytest.raises(LockTimeout):
        second.acquire(timeout=0.12)  # waits, then gives up
    first.release()
    second.acquire(timeout=0)
    assert second.is_locked
    assert not first.is_locked
    second.release()
    assert isinstance(LockTimeout("x"), RuntimeEnvError)  # the package's one tree


def test_a_lock_waits_for_a_release_from_another_thread(tmp_path: Path) -> None:
    path = str(tmp_path / "r.lock")
    held = FileLock(path)
    held.acquire(timeout=0)
    threading.Timer(0.1, held.release).start()  # given back by another thread
    FileLock(path).acquire(timeout=30)


def test_acquires_nest_and_the_last_release_unlocks(tmp_path: Path) -> None:
    path = str(tmp_path / "r.lock")
    lock, other = FileLock(path), FileLock(path)
    lock.acquire(timeout=0)
    lock.acquire(timeout=0)
    lock.release()
    with pytest.raises(LockTimeout):
        other.acquire(timeout=0)
    lock.release()
    lock.release()  # one too many: nothing held, nothing done
    other.acquire(timeout=0)
    other.release()


def test_the_lock_file_is_owner_only_stays_and_is_not_followed(tmp_path: Path) -> None:
    path = tmp_path / "r.lock"
    lock = FileLock(str(path))
    lock.acquire(timeout=0)
    lock.release()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    link = tmp_path / "link.lock"
    link.symlink_to(target)
    with pytest.raises(OSError, match="Too many levels of symbolic links"):  # not followed
        FileLock(str(link)).acquire(timeout=0)
    assert target.read_text() == "keep"


def test_filelocks_and_ours_exclude_each_other_across_processes(tmp_path: Path) -> None:
    path = str(tmp_path / "r.lock")
    ours = FileLock(path)
    ours.acquire(timeout=0)
    probe = (
        "import filelock, sys\n"
        "try:\n    filelock.FileLock(sys.argv[1]).acquire(timeout=0)\n"
        "except filelock.Timeout:\n    print('busy')\nelse:\n    print('free')\n"
    )
    run = [sys.executable, "-c", probe, path]
    assert subprocess.run(run, capture_output=True, text=True, check=True).stdout == "busy\n"
    ours.release()
    assert subprocess.run(run, capture_output=True, text=True, check=True).stdout == "free\n"
    theirs = filelock.FileLock(path, thread_local=False)
    theirs.acquire(timeout=0)
    with pytest.raises(LockTimeout):
        FileLock(path).acquire(timeout=0)
    theirs.release()
    FileLock(path).acquire(timeout=0)
    assert os.path.exists(path)
