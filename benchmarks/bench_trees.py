"""W5 and its parts: local code trees (``working_dir``), against ``cp -r`` in the same run.

    .venv/bin/python benchmarks/bench_trees.py [--files N] [--mb M] [--reps R] [--json PATH]

``run.py`` measures W5 as a notebook sees it (the first task in a new env). This script
times the same three cases and what they are made of, interleaved with their floors so that
a loaded machine weighs on both alike:

- ``W5 first``: a tree never seen (a new cache, a new stat cache), first task;
  floor ``cp -r`` of the tree;
- ``W5 unchanged`` / ``W5 one byte``: a new pool (a new worker) on an unchanged tree, and
  after a one-byte change; floor a python start with cloudpickle;
- ``hash first`` / ``hash again``: ``hash_tree`` of a tree never seen (storing its content),
  and of the unchanged tree (the stat cache);
- ``stat walk``: an ``os.walk`` plus one ``stat`` per file, the least an unchanged tree
  can cost;
- ``materialize``: laying out a new env's tree from the store (links).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import cp_r, make_tree, progress, python_start, timed
from ours import Ours

from jupyter_runtimeenv.plugins import _hashing, _store


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def stat_walk(root: Path) -> float:
    def walk() -> None:
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                os.stat(os.path.join(dirpath, name))

    return timed(walk)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--mb", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", type=Path, metavar="PATH")
    args = parser.parse_args()
    load = os.getloadavg()
    out: dict[str, list[float]] = {}

    def add(key: str, seconds: float) -> None:
        out.setdefault(key, []).append(seconds)

    with tempfile.TemporaryDirectory(prefix="jre-bench-trees-") as name:
        tmp = Path(name)
        tree = make_tree(tmp / "tree", args.files, args.mb * 2**20)
        progress(f"tree: {args.files} files, {args.mb} MB")
        for i in range(args.reps):
            add("cp -r", cp_r(tree, tmp / "cp"))
            add("stat walk", stat_walk(tree))
            cache = tmp / f"cache-{i}"
            store = _store.blob_dir(cache)
            _hashing.forget_stat_cache()
            add("hash first", timed(lambda s=store: _hashing.hash_tree(tree, store=s)))
            add("hash again", timed(lambda s=store: _hashing.hash_tree(tree, store=s)))
            hashed = _hashing.hash_tree(tree, store=store)
            target = tmp / f"target-{i}"
            add(
                "materialize",
                timed(lambda h=hashed, c=cache, t=target: _store.materialize(h, c, t)),
            )
            shutil.rmtree(target)
            shutil.rmtree(cache)
        progress("W5 through the API")
        ours = Ours(tmp / "ours", Path(tmp / "no-wheelhouse"), tree, {"wd": args.reps})
        ours.tmp.mkdir()
        ours.floors["W2b"] = {"median": statistics.median(python_start(args.reps))}
        ours.w5()
        for key in ("W5 first", "W5 unchanged", "W5 one byte"):
            out[key] = [ours.results[key]["median"]]
        out["python start"] = [ours.floors["W2b"]["median"]]

    cp = statistics.median(out["cp -r"])
    rows = [(key, _median_ms(v), statistics.median(v) / cp) for key, v in out.items()]
    print("| part | median ms | / cp -r |\n|---|---|---|")
    for key, ms, ratio in rows:
        print(f"| {key} | {ms:.1f} | {ratio:.2f} |")
    end = os.getloadavg()
    print(f"\nload average {load[0]:.1f} at start, {end[0]:.1f} at the end; {os.cpu_count()} cpus")
    if args.json:
        data: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load": [load[0], end[0]],
            "median_s": {k: statistics.median(v) for k, v in out.items()},
        }
        args.json.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
