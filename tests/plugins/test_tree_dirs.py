"""A tree's directories and its files grouped by directory, as a lay-out makes them; a new
tree's entries."""

from __future__ import annotations

import os

from jupyter_runtimeenv.plugins._hashing import FileEntry, Tree, blob_mode
from jupyter_runtimeenv.plugins._store import by_dir
from jupyter_runtimeenv.plugins._tree import _digest_line, digest, new_entries

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


def test_new_entries_are_the_entries_init_makes_with_their_digest_lines() -> None:
    """``new_entries`` (a new tree's entries, made without the frozen ``__init__``) gives
    entries equal to ``FileEntry(...)``'s, hashing alike, with the same digest lines, for
    every mode class and a name that is not UTF-8."""
    modes = [0o100644, 0o100755, 0o100600, 0o100700, 0o100444, 0o100640, 0o100644]
    rels = ["a", "b/x.py", "b/y", "c", "d", "e/\udcff", "f"]
    pairs = enumerate(zip(rels, modes, strict=True))
    found = [(rel, f"/src/{rel}", (1, i, 10 + i, 0, 0), m) for i, (rel, m) in pairs]
    shas = [f"{i:064x}" for i in range(len(rels))]
    made = list(new_entries(found, shas))
    expected = [
        FileEntry(rel, path, blob_mode(m), key[2], sha)
        for (rel, path, key, m), sha in zip(found, shas, strict=True)
    ]
    assert made == expected
    assert [hash(e) for e in made] == [hash(e) for e in expected]
    assert [e.digest_line for e in made] == [_digest_line(e) for e in expected]
    assert digest(made) == digest(expected)
