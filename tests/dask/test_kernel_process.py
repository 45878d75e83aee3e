"""The node's side of a cluster kernel's files, without a cluster: the directories a crashed
Dask worker left are swept, those of live workers sharing the cache root are not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from jupyter_runtimeenv.dask.kernel_process import OWNER_FILE, sweep


def test_sweep_removes_only_kernels_whose_worker_is_gone(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    owners = {"live": str(os.getpid()), "dead": dead.stdout.strip(), "garbled": "x"}
    for name, owner in owners.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / OWNER_FILE).write_text(owner)
        (tmp_path / name / "connection.json").write_text("{}")
    (tmp_path / "never-started").mkdir()
    assert sorted(sweep(tmp_path)) == ["dead", "garbled", "never-started"]
    assert [p.name for p in tmp_path.iterdir()] == ["live"]
    assert sweep(tmp_path / "missing") == []
