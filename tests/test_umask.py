"""The one reader of the process's umask (``_umask``) and what each caller makes of it.

Real processes started with a given umask (``subprocess``'s ``umask=``) read their own
``/proc/self/status``; the cases ``/proc`` cannot be made to show (no such file, no
``Umask:`` line, a line that does not parse) read a file written here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_runtimeenv._umask import read_umask

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="needs Linux's /proc/self/status"
)

PROBE = """
import os
from jupyter_runtimeenv._umask import read_umask
from jupyter_runtimeenv.plugins import _blobs
from jupyter_runtimeenv.workers import template
mask = os.umask(0o077)
os.umask(mask)
print(read_umask(), mask, _blobs._UMASK, template._umask())
"""


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077, 0])
def test_a_process_reads_the_umask_it_was_started_with(mask: int) -> None:
    # 0 included: a mask of 0 is a mask, not "unknown" (blobs would take 0o777 for it)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], umask=mask, capture_output=True, text=True, check=True
    ).stdout.split()
    assert [int(x) for x in out] == [mask, mask, mask, mask]


def test_what_cannot_be_read_is_none(tmp_path: Path) -> None:
    status = tmp_path / "status"
    assert read_umask(str(tmp_path / "missing")) is None
    status.write_text("Name:\tpython3\nState:\tR (running)\n")
    assert read_umask(str(status)) is None  # no Umask line (Linux before 4.7)
    status.write_text("Name:\tpython3\nUmask:\tnot-octal\n")
    assert read_umask(str(status)) is None
    status.write_text("Name:\tpython3\nUmask:\t0027\nState:\tR (running)\n")
    assert read_umask(str(status)) == 0o027
