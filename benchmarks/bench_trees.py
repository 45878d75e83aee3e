"""W5 and its parts: local code trees (``working_dir``), against ``cp -r`` in the same run.

    .venv/bin/python benchmarks/bench_trees.py [--files N] [--mb M] [--reps R] [--json PATH]

``run.py`` measures W5 as a notebook sees it (the first task in a new env). This script
times the same cases and what they are made of, each repetition right after its floor, so
that a loaded machine weighs on both alike:

- ``W5 first``: a tree never seen (a new cache, the stat cache forgotten), first task;
  floor ``cp -r`` of the tree, measured just before; each after a ``sync`` (``settle``);
- ``W5 unchanged`` / ``W5 one byte``: a new pool (so a new worker) on an unchanged tree, and
  after a one-byte change; floor a python start with cloudpickle, measured just before (the
  next version of an edited tree is laid out from a spare, ``plugins/_spares.py``, made
  after the build before: at once if a core is free, else ``DEFER_S`` later; the python
  start between two edits leaves it time);
- ``W5 one byte, no spare``: the same, each rep right after a ``W5 one byte`` one, with the
  spares turned off in this process (the lay-out links every file, as before them);
- ``hash first`` / ``hash again``: ``hash_tree`` of a tree never seen (storing its content),
  and of the unchanged tree;
- ``stat walk``: ``os.walk`` plus one ``stat`` per file (what an unchanged tree costs
  without a watch);
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import _common
import cloudpickle
from _common import (
    change_one_byte,
    count_files,
    cp_r,
    make_tree,
    progress,
    python_start,
    settle,
    timed,
)

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.agent import RuntimeEnvAgent
from jupyter_runtimeenv.client import EmbeddedClient
from jupyter_runtimeenv.plugins import _hashing, _spares, _store

cloudpickle.register_pickle_by_value(_common)


def stat_walk(root: Path) -> float:
    def walk() -> None:
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                os.stat(os.path.join(dirpath, name))

    return timed(walk)


@contextmanager
def agent(cache: Path) -> Iterator[EmbeddedClient]:
    cache.mkdir(mode=0o700)
    client = EmbeddedClient(RuntimeEnvAgent(cache))
    try:
        yield client
    finally:
        client.close()


@contextmanager
def executor(client: EmbeddedClient) -> Iterator[None]:
    ex = jre.LocalExecutor(acquire=client.acquire_sync, release=client.release_sync)
    jre.init(executor=ex)
    try:
        yield
    finally:
        ex.shutdown()
        jre.shutdown()


@contextmanager
def no_spares() -> Iterator[None]:
    """Lay trees out whole, as before spares: none is taken, none is made."""
    take, offer = _spares._take, _spares._offer
    _spares._take = lambda key: None
    _spares._offer = lambda key, tree, cache_root: None
    try:
        yield
    finally:
        _spares._take, _spares._offer = take, offer


def first_task(tree: Path) -> float:
    env = {"working_dir": str(tree)}
    return timed(lambda: jre.remote(count_files).options(runtime_env=env).remote().result(600))


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
        time.sleep(1.1)  # past the racy window of the files just written
        progress(f"tree: {args.files} files, {args.mb} MB; parts")
        for i in range(args.reps):
            add("cp -r", cp_r(tree, tmp / "cp"))
            add("stat walk", stat_walk(tree))
            cache = tmp / f"parts-{i}"
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
        progress("W5 first, each after its cp -r")
        for i in range(args.reps):
            settle()
            add("W5 first: cp -r", cp_r(tree, tmp / "cp"))
            _hashing.forget_stat_cache()
            with agent(tmp / f"first-{i}") as client, executor(client):
                settle()
                add("W5 first", first_task(tree))
        progress("W5 unchanged / one byte, each after a python start")
        with agent(tmp / "again") as client:
            with executor(client):
                first_task(tree)
            for _ in range(args.reps):
                add("W5 unchanged: python start", python_start(1)[0])
                with executor(client):
                    add("W5 unchanged", first_task(tree))
            for _ in range(args.reps):
                add("W5 one byte: python start", python_start(1)[0])
                change_one_byte(tree)
                with executor(client):
                    add("W5 one byte", first_task(tree))
                add("W5 one byte, no spare: python start", python_start(1)[0])
                change_one_byte(tree)
                with executor(client), no_spares():
                    add("W5 one byte, no spare", first_task(tree))

    med = {key: statistics.median(v) for key, v in out.items()}
    print("| part | median ms | floor | floor ms | ratio |\n|---|---|---|---|---|")
    for key, value in med.items():
        if ": " in key:
            continue
        floor_key = next((k for k in med if k.startswith(key + ": ")), "cp -r")
        floor = med[floor_key]
        label = floor_key.split(": ", 1)[-1]
        print(
            f"| {key} | {value * 1000:.1f} | {label} | {floor * 1000:.1f} | {value / floor:.2f} |"
        )
    end = os.getloadavg()
    print(f"\nload average {load[0]:.1f} at start, {end[0]:.1f} at the end; {os.cpu_count()} cpus")
    if args.json:
        data: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load": [load[0], end[0]],
            "median_s": med,
        }
        args.json.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
