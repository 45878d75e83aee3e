"""Gitignore-style patterns (``spec/patterns.py``) mean what git says they mean.

Ground truth is git itself: for each case, a real repository holds the same tree and the
same ``.gitignore`` files, and ``git ls-files --others --exclude-standard`` lists what git
keeps; ``hash_tree`` (the walk every ``working_dir``/``py_modules`` goes through) must keep
exactly that. The spec's ``excludes`` are checked the same way, as a root ``.gitignore``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from jupyter_runtimeenv.plugins._hashing import hash_tree
from jupyter_runtimeenv.spec.patterns import PatternList, compile_pattern

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

FILES = [
    *("a", "b", "ab", "abc", "a.txt", "b.txt", "xa", "x/a", "x/y/a", "x/a.txt", "x/foo/bar"),
    *("foo/bar/baz.py", "foo/qux", "bar/foo", "doc/frotz/a", "a2/doc/frotz/b", "abcd/x"),
    *("abcd/d/e", "[x", "]x", "-", "a b", "a ", "#h", "!n", "q/b/c/d/e", "a-z", "q?", "st*r"),
    *("x/y/z/w.py", "build/out.o", "src/build/x.o", "lib.so.1", "lib.so", "x/.hidden"),
    *(".hidden/a", "A", "Z", "m:n", "back\\slash", "tab\tx", "dir/sub/f"),
]
PATTERNS = [
    *("a", "/a", "a/", "*.txt", "x/*", "x/**", "**/a", "q/**/e", "foo/**/", "foo/**", "**"),
    *("/**", "*", "?", "??", "[ab]", "[!ab]", "[^ab]", "[a-c]", "[]x]", "[!]x]", "[a-]"),
    *("[-a]", "[[:alpha:]]", "[[:digit:]x]", "[[:foo:]]", "[[:alpha:]", "[", "[a", "a\\"),
    *("\\#h", "#h", "\\!n", "!n", "a\\ ", "a ", "a  ", "q\\?", "st\\*r", "*r", "a*", "a*b*c"),
    *("*/a", "x/*/a", "x/**/a", "doc/frotz/", "doc/frotz", "frotz/", "**/frotz", "a2/**/b"),
    *("**/**/a", "x/**/**/w.py", "**/*.py", "*.o", "!*.o", "build/", "/build/", "lib.so*"),
    *("[[:upper:]]", "[[:lower:]]", "?af*", "a//b", "//a", "/", "x\\/a", "[/]", "[[:]"),
    *("[[:]]x", "***", "a***", "x/***", "tab?x", "m:n", "*\\\\*", "x/**/**", "[a-c-e]"),
    *("[\\]]x", "[z-a]", "[[:punct:]]*", "[[:space:]]*", "*[[:blank:]]*", "**/y/**"),
]
LISTS = [
    ["*.txt", "!a.txt"],
    ["x/", "!x/a"],
    ["*", "!*/", "!*.py"],
    ["foo", "!foo/bar"],
    ["a*", "!abc", "abcd/x"],
    ["**/a", "!x/**"],
    ["# a comment", "", "   ", "b"],
]
NESTED = [
    {"": ["*.txt"], "x": ["!a.txt"]},
    {"": ["a"], "x": ["!a"]},
    {"": ["x/"], "x": ["!a"]},
    {"x": ["/a", "y/"]},
    {"x": ["**/a"]},
    {"": ["!a"], "x": ["a"]},
    {"": ["*.py"], "x/y": ["!z/"], "x/y/z": ["!w.py"]},
]


def _make_tree(root: Path) -> None:
    for rel in FILES:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rel)


def _git_kept(root: Path) -> set[str]:
    out = subprocess.run(
        [
            *("git", "-c", "core.excludesFile=/dev/null", "-c", "core.quotePath=false"),
            *("ls-files", "-z", "--others", "--exclude-standard"),
        ],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    return {p for p in out.decode("utf-8", "surrogateescape").split("\0") if p}


def _compare(tmp_path: Path, gitignores: dict[str, list[str]], excludes: list[str]) -> None:
    root = tmp_path / "tree"
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    _make_tree(root)
    for rel, lines in {**gitignores, **({"": excludes} if excludes else {})}.items():
        (root / rel / ".gitignore").write_text("\n".join(lines) + "\n")
    expected = _git_kept(root)
    if excludes:  # the same patterns given as the spec's excludes, without the file
        (root / ".gitignore").unlink()
        expected.discard(".gitignore")
    ours = {e.rel for e in hash_tree(root, excludes).entries}
    assert ours == expected, {"git only": expected - ours, "ours only": ours - expected}


@pytest.mark.parametrize("pattern", PATTERNS)
def test_one_pattern_in_a_gitignore_keeps_what_git_keeps(tmp_path: Path, pattern: str) -> None:
    _compare(tmp_path, {"": [pattern]}, [])


@pytest.mark.parametrize("pattern", PATTERNS)
def test_one_pattern_in_excludes_keeps_what_git_keeps(tmp_path: Path, pattern: str) -> None:
    _compare(tmp_path, {}, [pattern])


@pytest.mark.parametrize("lines", LISTS, ids=[" ".join(x) for x in LISTS])
def test_lists_with_negations_keep_what_git_keeps(tmp_path: Path, lines: list[str]) -> None:
    _compare(tmp_path, {"": lines}, [])
    _compare(tmp_path / "excludes", {}, [line for line in lines if line.strip()])


@pytest.mark.parametrize("files", NESTED, ids=[str(x) for x in NESTED])
def test_nested_gitignores_decide_as_in_git(tmp_path: Path, files: dict[str, list[str]]) -> None:
    # The deepest .gitignore with a matching pattern decides (a "!" there re-includes).
    _compare(tmp_path, files, [])


def test_the_spec_excludes_win_over_a_gitignore_negation(tmp_path: Path) -> None:
    # As in Ray: the spec's excludes exclude, whatever a .gitignore in the tree says.
    (tmp_path / "keep.txt").write_text("x")
    (tmp_path / ".gitignore").write_text("!keep.txt\n")
    assert [e.rel for e in hash_tree(tmp_path, ["*.txt"]).entries] == [".gitignore"]


def test_a_symlinked_or_special_gitignore_is_not_read(tmp_path: Path) -> None:
    # As git (2.32+) does not follow a symlinked .gitignore; a FIFO is never opened to block.
    (tmp_path / "rules").write_text("*.txt\n")
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / ".gitignore").symlink_to(tmp_path / "rules")
    assert "a.txt" in {e.rel for e in hash_tree(tmp_path).entries}
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "b.txt").write_text("x")
    os.mkfifo(sub / ".gitignore")
    assert "sub/b.txt" in {e.rel for e in hash_tree(tmp_path).entries}


def test_names_match_by_character_not_by_byte() -> None:
    # The one deliberate difference from git (whose "?" matches one byte of UTF-8): like
    # pathspec (and so Ray), "?" and "[!a]" match one character.
    assert PatternList.from_lines(["caf?"]).match("café")
    assert PatternList.from_lines(["[!a]"]).match("é")
    assert not PatternList.from_lines(["??"]).match("é")


def test_compiled_shapes() -> None:
    for line in ("", "   ", "# comment"):
        assert compile_pattern(line) is None
    p = compile_pattern("!/build/")
    assert p is not None
    assert p.negated
    assert p.dir_only
    assert p.anchored
    never = compile_pattern("a[b")
    assert never is not None
    assert never.never
    assert not PatternList([never]).match("a[b")
    # Trailing "/**" matches what is inside, not the directory itself.
    inside = PatternList.from_lines(["x/**"])
    assert inside.match("x/a")
    assert inside.match("x/a/b", True)
    assert not inside.match("x", True)
