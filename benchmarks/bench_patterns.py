"""Gitignore-style matching: ``spec/patterns.py`` against the regexes it replaced (pathspec).

    .venv/bin/python benchmarks/bench_patterns.py [--reps N]

Rows, for trees of 1,000 and 100,000 paths (in memory: matching alone, no disk), with a
realistic pattern list (the default excludes plus ten patterns a project's ``excludes`` or
``.gitignore`` holds, one of them a negation, and the same list without it):

- ours: ``PatternList.decide`` on every path;
- old: ``pathspec.GitIgnoreSpec.match_file`` (what ``_hashing`` used before), same paths;
- floor: one ``str.endswith`` per path (the least any matcher can do per path).

Then the hostile pattern of issue 16 (``*a`` twelve times, then ``*b``) against one
250-character name: ours, and pathspec with four stars only (more would not finish).
And one real ``hash_tree`` of a 1,000-file tree on disk (what a ``working_dir`` costs), with
the time spent matching measured inside it. Medians over ``--reps`` runs (default 5).
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pathspec

from jupyter_runtimeenv.plugins import _hashing, _walk
from jupyter_runtimeenv.plugins._hashing import DEFAULT_EXCLUDES, hash_tree
from jupyter_runtimeenv.spec.patterns import PatternList

REPS = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 5
PROJECT = [
    "*.pyc", "*.log", "data/", "build/", "**/tmp/**", "node_modules", ".DS_Store",
    "*.egg-info/", "/dist", "docs/_build/",
]  # fmt: skip
WITH_NEGATION = [*PROJECT, "!important.log"]
EXTS = [".py", ".py", ".py", ".txt", ".csv", ".log", ".pyc", ".json", ".md", ".so"]
DIRS = ["src", "pkg", "tests", "data", "build", "tmp", "lib", "docs", "notebooks", "utils"]


def paths(n: int, seed: int = 0) -> list[tuple[str, bool]]:
    """``n`` (relative path, is_dir) pairs, depth 1-5, like a project tree."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        depth = rng.randint(0, 4)
        parts = [rng.choice(DIRS) for _ in range(depth)]
        name = f"file_{i}{rng.choice(EXTS)}"
        is_dir = rng.random() < 0.1
        out.append(("/".join([*parts, name.split(".")[0] if is_dir else name]), is_dir))
    return out


def median_s(func: Callable[[], object]) -> float:
    samples = []
    for _ in range(REPS):
        start = time.perf_counter()
        func()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def ours(lines: list[str], items: list[tuple[str, bool]]) -> Callable[[], object]:
    patterns = PatternList.from_lines(lines)
    return lambda: [patterns.decide(rel, d) for rel, d in items]


def old(lines: list[str], items: list[tuple[str, bool]]) -> Callable[[], object]:
    spec = pathspec.GitIgnoreSpec.from_lines(lines)
    return lambda: [spec.match_file(rel + "/" if d else rel) for rel, d in items]


def floor(items: list[tuple[str, bool]]) -> Callable[[], object]:
    return lambda: [rel.endswith(".pyc") for rel, _ in items]


def fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def main() -> None:
    load = os.getloadavg()
    print(f"bench_patterns: {REPS} reps, load average {load[0]:.2f} at the start\n")
    print("| matching | paths | ours | old (pathspec regexes) | floor (endswith) | ours / old |")
    print("|---|---|---|---|---|---|")
    for n in (1_000, 100_000):
        items = paths(n)
        f = median_s(floor(items))
        for label, lines in (("project list", PROJECT), ("with a negation", WITH_NEGATION)):
            full = [*DEFAULT_EXCLUDES, *lines]
            a = median_s(ours(full, items))
            b = median_s(old(full, items))
            print(f"| {label} | {n:,} | {fmt(a)} | {fmt(b)} | {fmt(f)} | {a / b:.2f}x |")

    hostile = "*a" * 12 + "*b"
    name = "a" * 250
    mine = median_s(lambda: PatternList.from_lines([hostile]).match(name))
    four = "*a" * 4 + "*b"
    theirs = median_s(lambda: pathspec.GitIgnoreSpec.from_lines([four]).match_file(name[:100]))
    print(
        f"\nhostile: ours, 12 stars vs 250 chars: {fmt(mine)}; pathspec, 4 stars vs 100 chars:"
        f" {fmt(theirs)} (12 stars: does not finish)"
    )

    with tempfile.TemporaryDirectory(prefix="jre-bench-patterns-") as tmp:
        root = Path(tmp)
        for rel, is_dir in paths(1000, seed=1):
            target = root / rel
            if is_dir:
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(b"x" * 64)
        (root / ".gitignore").write_text("\n".join(WITH_NEGATION) + "\n")
        spent = [0.0]
        real = _walk.ignored

        def timed(rel: str, is_dir: bool, matchers: list[_walk.Matcher]) -> bool:
            start = time.perf_counter()
            try:
                return real(rel, is_dir, matchers)
            finally:
                spent[0] += time.perf_counter() - start

        def cold() -> object:
            # A tree hashed before is known without a walk (its memo, a watch): forget it,
            # so each run walks, reads and matches every file, as a first use does.
            _hashing.forget_stat_cache()
            return hash_tree(root, PROJECT)

        walk = median_s(cold)
        _walk.ignored = timed
        try:
            cold()
        finally:
            _walk.ignored = real
        print(
            f"hash_tree of a 1,000-file tree (cold: no memo, no stat cache): {fmt(walk)},"
            f" of which matching {fmt(spent[0])}"
        )
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
