"""Bounded reads of the files a spec names (``spec/files.py``): only regular files, checked on
the opened descriptor, at most the size they report."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jupyter_runtimeenv.spec.files import BadFile, hash_regular, read_head, read_text


def test_only_regular_files_are_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = [(fifo, "a FIFO"), (Path("/dev/zero"), "a character device"), (tmp_path, "a directory")]
    for path, words in cases:
        for read in (read_text, lambda p: read_head(p, 4), hash_regular):
            with pytest.raises(BadFile, match=words):
                read(str(path))


def test_pseudo_files_and_files_that_change_are_refused(tmp_path: Path) -> None:
    # /proc files say "regular, size 0" and hold content: read for their size, then refused.
    with pytest.raises(BadFile, match="longer than its size"):
        hash_regular("/proc/self/status")
    with pytest.raises(BadFile, match="longer than its size"):
        read_text("/proc/self/status")
    grown = tmp_path / "grown"
    grown.write_text("abc")
    before = os.stat(grown)
    grown.write_text("abcdef")
    with pytest.raises(BadFile, match="changed while it was read"):
        hash_regular(str(grown), before)


def test_text_is_capped_and_must_be_utf8(tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * 101)
    with pytest.raises(BadFile, match="101 bytes; at most 100"):
        read_text(str(big), limit=100, what="requirements file")
    assert read_text(str(big), limit=101) == "x" * 101
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    with pytest.raises(BadFile, match="not UTF-8"):
        read_text(str(tmp_path / "bin"))
    with pytest.raises(BadFile, match="cannot read it"):
        read_text(str(tmp_path / "missing"))


def test_hash_of_a_regular_file(tmp_path: Path) -> None:
    import hashlib

    path = tmp_path / "f"
    path.write_bytes(b"hello" * 1000)
    assert hash_regular(str(path), os.stat(path)) == (
        hashlib.sha256(b"hello" * 1000).hexdigest(),
        5000,
    )
