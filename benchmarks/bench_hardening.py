"""What the hardening of issue 16 costs on hot paths, against floors measured in the same run.

    .venv/bin/python benchmarks/bench_hardening.py [--reps N]

Rows:
- hashing 1,000 files of 20 KB (memo cold): ``spec.files.hash_regular`` (non-blocking open,
  fstat of the descriptor, exactly the reported size, one read past it) against the plain
  ``open().read()`` loop it replaced (the floor);
- pinning a resource a build chose (``Cache.pin``: one transaction that checks the resource's
  row and inserts the pin) against one SQLite insert-and-commit in the same WAL database
  (the floor);
- redacting 10,000 installer lines (``redact_text``; a tenth hold a URL with a query) against
  the ``line.rstrip()`` every line gets anyway (the floor).
Medians over ``--reps`` runs (default 5); the load average is printed with the numbers.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from jupyter_runtimeenv.agent.cache import Cache
from jupyter_runtimeenv.redact import redact_text
from jupyter_runtimeenv.spec.files import hash_regular

REPS = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 5


def median_s(func: Callable[[], object], reps: int = REPS) -> float:
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        func()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} µs"


def plain_hash(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def main() -> None:
    print(f"bench_hardening: {REPS} reps, load average {os.getloadavg()[0]:.2f} at the start\n")
    print("| what | ours | floor | ours / floor |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="jre-bench-hardening-") as tmp:
        root = Path(tmp)
        files = []
        for i in range(1000):
            path = root / "tree" / f"d{i % 20}" / f"f{i}.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(20_000))
            files.append(str(path))
        ours = median_s(lambda: [hash_regular(p) for p in files])
        floor = median_s(lambda: [plain_hash(p) for p in files])
        print(f"| hash 1,000 files of 20 KB | {fmt(ours)} | {fmt(floor)} | {ours / floor:.2f}x |")

        cache = Cache(root / "cache")
        uri = "working_dir:tree:" + "0" * 64
        target = root / "res"
        target.mkdir()
        cache.commit("working_dir", uri, target, 1)
        env = "e" * 64
        pin = median_s(lambda: cache.pin(env, uri), reps=200)
        db = sqlite3.connect(root / "floor.sqlite", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT)")

        def insert() -> None:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT OR REPLACE INTO t VALUES ('k', 'v')")
            db.execute("COMMIT")

        sql = median_s(insert, reps=200)
        print(f"| pin a chosen resource | {fmt(pin)} | {fmt(sql)} | {pin / sql:.2f}x |")
        cache.close()
        db.close()

    lines = [
        f"  Downloading https://files.example/pkg-{i}.whl?X-Amz-Signature=abc{i}&x=1 (1.2 MB)"
        if i % 10 == 0
        else f"Collecting package-{i}>=1.0 (from -r requirements.txt (line {i}))"
        for i in range(10_000)
    ]
    red = median_s(lambda: [redact_text(line) for line in lines])
    base = median_s(lambda: [line.rstrip() for line in lines])
    print(f"| redact 10,000 installer lines | {fmt(red)} | {fmt(base)} | {red / base:.2f}x |")
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
