"""A tree's directories and its files grouped by directory, as a lay-out makes them."""

from __future__ import annotations

import os

from jupyter_runtimeenv.plugins._hashing import FileEntry, Tree
from jupyter_runtimeenv.plugins._store import by_dir

RELS = ["a", "ab/c", "ab/d/e/f", "ab/d/g", "ab/x", "b/c/d", "b/c2/d", "top"]


def _tree(rels: list[str]) -> Tree:
    entries = tuple(FileEntry(rel, f"/src/{rel}", 0o444, 1, "0" * 64) for rel in sorted(rels))
    return Tree("tree:x", entries)


def test_every_directory_that_holds_a_file_parents_first() -> None:
    assert _tree(RELS).dirs == ("ab", "ab/d", "ab/d/e", "b", "b/c", "b/c2")
    assert _tree(["only"]).dirs == ()


def test_files_grouped_by_the_directory_that_holds_them() -> None:
    grouped = by_dir(_tree(RELS).entries)
    assert {d: [e.rel for e in entries] for d, entries in grouped.items()} == {
        "": ["a", "top"],
        "ab": ["ab/c", "ab/x"],
        "ab/d/e": ["ab/d/e/f"],
        "ab/d": ["ab/d/g"],
        "b/c": ["b/c/d"],
        "b/c2": ["b/c2/d"],
    }
    for directory, entries in grouped.items():  # what os.path.dirname says
        assert all(os.path.dirname(e.rel) == directory for e in entries)
