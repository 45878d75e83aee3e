"""``agent/pgroups.py`` reads process start times from ``/proc`` (no psutil on its path): the
very float psutil's ``create_time`` gives, since the index holds times other processes, and
older versions, recorded with psutil and compares them to 50 ms."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

from jupyter_runtimeenv.agent import pgroups


def test_start_times_are_psutils_own(tmp_path: Path) -> None:
    # A command name with spaces and parentheses: the stat line's fields come after its ")".
    odd = tmp_path / "a b) (c"
    odd.symlink_to(sys.executable)
    child = subprocess.Popen([str(odd), "-c", "import time; time.sleep(30)"])
    try:
        for pid in (os.getpid(), os.getppid(), 1, child.pid):
            assert pgroups.start_time(pid) == psutil.Process(pid).create_time()
        assert pgroups.owner_alive(child.pid, psutil.Process(child.pid).create_time())
        assert not pgroups.owner_alive(child.pid, psutil.Process(child.pid).create_time() - 1)
    finally:
        child.kill()
        child.wait()
    assert pgroups.start_time(child.pid) is None  # reaped: no such process


def test_a_groups_members_are_found_without_psutil() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True
    )
    try:
        assert pgroups._members(child.pid) == [child.pid]
        assert {child.pid, os.getpid(), 1} <= set(pgroups._pids())
    finally:
        child.kill()
        child.wait()
