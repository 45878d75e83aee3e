"""Issue 16 item 13: the working_dir size limit is counted while walking, and the walk stops
there: a spec naming a huge directory (``/usr``) is refused without reading it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.errors import SpecError
from jupyter_runtimeenv.plugins import _hashing
from jupyter_runtimeenv.spec import parse


def test_a_tree_over_the_limit_is_refused_without_reading_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "huge"
    root.mkdir()
    with open(root / "a-big.bin", "wb") as f:
        f.truncate(600 * 2**20)  # sparse: 600 MiB that cost no disk
    (root / "zz-never-walked").mkdir()
    for i in range(50):
        (root / "zz-never-walked" / f"f{i}").write_text("x")
    opened: list[str] = []
    scanned: list[str] = []
    real_open, real_scandir = os.open, os.scandir

    def counting_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        fd = real_open(path, flags, *args, **kwargs)
        opened.append(str(path))
        return fd

    def counting_scandir(path: Any) -> Any:
        scanned.append(str(path))
        return real_scandir(path)

    monkeypatch.setattr(_hashing.os, "open", counting_open)
    monkeypatch.setattr(_hashing.os, "scandir", counting_scandir)
    with pytest.raises(SpecError) as info:
        parse({"working_dir": str(root)})
    assert info.value.field == "working_dir"
    assert "more than 500.0 MiB" in info.value.reason
    assert "a-big.bin (600.0 MiB)" in info.value.reason
    assert opened == []  # nothing was read
    assert scanned == [str(root)]  # and the walk stopped at the limit


def test_the_limit_applies_to_py_modules_and_a_single_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIMEENV_MAX_UPLOAD_BYTES", "1000")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("x" * 2000)
    with pytest.raises(SpecError) as info:
        parse({"py_modules": [str(pkg)]})
    assert info.value.field == "py_modules.0"
    single = tmp_path / "mod.py"
    single.write_text("y" * 2000)
    with pytest.raises(SpecError) as info:
        parse({"py_modules": [str(single)]})
    assert info.value.field == "py_modules.0"
