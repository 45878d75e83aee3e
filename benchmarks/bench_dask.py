"""Dask executor benchmarks against plain Dask and the local executor, in the same run.

    .venv/bin/python benchmarks/bench_dask.py [--tasks 200] [--files 1000]
    .venv/bin/python benchmarks/bench_dask.py --nodes 1,2,4,8 [--json FILE]

With ``--nodes``: staging cost against the number of nodes (issue 17 item 6). For each N, a
fresh ``LocalCluster(n_workers=N, threads_per_worker=1)`` (each node its own cache root, the
driver a fresh blob store) stages a ``--files``-file / ``--tree-mb`` MB working_dir
(``DaskExecutor.stage``: hash and store on the driver, send each blob once, nodes copy the
rest from each other). One JSON object per N (``nodes``, ``stage_seconds``,
``driver_bytes_sent``, ``peer_bytes``, ``tree_bytes``, ``ratio`` = driver bytes / tree
bytes, ``manifest_seconds``: hashing and storing on the driver alone, ``copy_seconds``:
``cp -r`` of the tree, the floor, both measured in the same run), and a table. Target:
``driver_bytes_sent <= 1.2 x tree_bytes`` at 4 and 8 nodes.

Without it, on one ``LocalCluster(n_workers=2, threads_per_worker=1, processes=True)``:

- per-task round trip (submit, wait, result; sequential, warm) of a no-op: plain
  ``client.submit`` (the floor), ``DaskExecutor``, ``LocalExecutor`` (no cluster);
- throughput (``--tasks`` no-ops submitted at once, all results gathered);
- first-task latency: plain Dask with a function it has never seen; ``DaskExecutor`` in an
  env it has never seen (manifest, staging on both nodes, node agent, env build, worker
  start); ``LocalExecutor`` likewise (agent, worker start);
- bytes sent for a ``--files``-file working_dir to both nodes, then after a one-byte change.

Targets (issue 11): per-task overhead over plain ``client.submit`` <= 1.2x; a one-byte
change sends <= 1% of the tree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from distributed import Client, LocalCluster

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.agent import RuntimeEnvAgent
from jupyter_runtimeenv.client import EmbeddedClient
from jupyter_runtimeenv.dask import DaskExecutor
from jupyter_runtimeenv.workers.executor import LocalExecutor


def noop(x: int) -> int:
    return x


def sequential(call: Callable[[int], Any], rounds: int) -> float:
    """Median seconds per call, after a warm-up."""
    for i in range(5):
        call(i)
    times = []
    for i in range(rounds):
        start = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def throughput(run_all: Callable[[int], Any], tasks: int) -> float:
    """Tasks per second for ``tasks`` submitted at once (best of 3)."""
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        run_all(tasks)
        best = max(best, tasks / (time.perf_counter() - start))
    return best


def first_task(make: Callable[[], Any]) -> float:
    start = time.perf_counter()
    make()
    return time.perf_counter() - start


def make_tree(root: Path, files: int) -> int:
    size = 0
    for i in range(files):
        path = root / f"pkg{i % 20}" / f"mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = f"VALUE = {i}\n" + "# padding line of a module\n" * 40
        path.write_text(text)
        size += len(text)
    return size


def make_sized_tree(root: Path, files: int, total_bytes: int) -> int:
    """``files`` files of random (incompressible) bytes, ``total_bytes`` in all."""
    each = max(1, total_bytes // files)
    size = 0
    for i in range(files):
        path = root / f"pkg{i % 20}" / f"data{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(each)
        path.write_bytes(data)
        size += len(data)
    return size


def staging(counts: list[int], files: int, tree_mb: float, json_path: str | None) -> None:
    from jupyter_runtimeenv.dask.manifest import build_manifest

    scratch = Path(tempfile.mkdtemp(prefix="bench-dask-nodes-"))
    results: list[dict[str, Any]] = []
    try:
        tree = scratch / "tree"
        tree_bytes = make_sized_tree(tree, files, int(tree_mb * 2**20))
        spec = jre.parse({"working_dir": str(tree), "driver_sys_path": False})
        for n in counts:
            print(f"[{time.strftime('%H:%M:%S')}] {n} node(s): starting", file=sys.stderr)
            copy_seconds = first_task(
                lambda n=n: shutil.copytree(tree, scratch / f"copy-{n}", copy_function=shutil.copy)
            )
            manifest_seconds = first_task(
                lambda n=n: build_manifest(spec, scratch / f"floor-store-{n}")
            )
            with (
                LocalCluster(
                    n_workers=n,
                    threads_per_worker=1,
                    processes=True,
                    host="127.0.0.1",
                    dashboard_address=None,
                ) as cluster,
                Client(cluster) as client,
            ):
                client.wait_for_workers(n, timeout=300)
                executor = DaskExecutor(
                    client,
                    node_cache_dir=str(scratch / f"n{n}" / "node-{name}"),
                    driver_cache_dir=scratch / f"n{n}" / "driver",
                )
                try:
                    start = time.perf_counter()
                    staged = executor.stage(spec)
                    seconds = time.perf_counter() - start
                    sent, peer = executor.bytes_sent, executor.peer_bytes
                    phases = dict(executor.staging.phases)
                finally:
                    executor.shutdown()
            if len(staged) != n:
                raise SystemExit(f"staged on {len(staged)} of {n} nodes")
            results.append(
                {
                    "nodes": n,
                    "stage_seconds": round(seconds, 4),
                    "driver_bytes_sent": sent,
                    "peer_bytes": peer,
                    "tree_bytes": tree_bytes,
                    "files": files,
                    "ratio": round(sent / tree_bytes, 4),
                    "manifest_seconds": round(manifest_seconds, 4),
                    "copy_seconds": round(copy_seconds, 4),
                    "load_average": round(os.getloadavg()[0], 2),
                    "phases": {k: round(v, 3) for k, v in phases.items()},
                }
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=1) + "\n")
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, 1 thread per Dask worker;"
        f" working_dir {files} files, {tree_bytes / 2**20:.1f} MiB"
    )
    header = (
        "nodes",
        "stage (s)",
        "driver sent",
        "x tree",
        "nodes from peers",
        "floors: manifest / cp -r (s)",
        "phases (s): manifest, offer, seed, share",
        "load",
    )
    rows = [
        (
            str(r["nodes"]),
            f"{r['stage_seconds']:.2f}",
            f"{r['driver_bytes_sent'] / 2**20:.1f} MiB",
            f"{r['ratio']:.2f}x" + (" (target <= 1.2x)" if r["nodes"] >= 4 else ""),
            f"{r['peer_bytes'] / 2**20:.1f} MiB",
            f"{r['manifest_seconds']:.2f} / {r['copy_seconds']:.2f}",
            ", ".join(
                f"{r['phases'].get(k, 0.0):.2f}" for k in ("manifest", "offer", "seed", "share")
            ),
            f"{r['load_average']:.1f}",
        )
        for r in results
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument(
        "--nodes", help="comma-separated node counts: measure staging against them (1,2,4,8)"
    )
    parser.add_argument("--tree-mb", type=float, default=20.0, help="with --nodes: tree size")
    parser.add_argument("--json", metavar="FILE", help="with --nodes: write the results here")
    args = parser.parse_args()
    if args.nodes:
        try:
            counts = [int(n) for n in args.nodes.split(",") if n.strip()]
        except ValueError:
            parser.error(f"--nodes: expected numbers like 1,2,4,8, got {args.nodes!r}")
        if not counts or min(counts) < 1:
            parser.error("--nodes: expected numbers >= 1")
        staging(counts, args.files, args.tree_mb, args.json)
        return
    scratch = Path(tempfile.mkdtemp(prefix="bench-dask-"))
    os.environ["JUPYTER_RUNTIMEENV_CACHE"] = str(scratch / "driver")
    rows: list[tuple[str, str, str, str]] = []

    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster) as client,
    ):
        # -- first tasks ---------------------------------------------------------------
        def fresh() -> Callable[[int], int]:
            namespace: dict[str, Any] = {}
            exec(f"def f_{uuid.uuid4().hex}(x):\n    return x\n", namespace)
            return next(v for k, v in namespace.items() if k.startswith("f_"))

        plain_first = first_task(lambda: client.submit(fresh(), 1, pure=False).result())
        executor = DaskExecutor(client, node_cache_dir=str(scratch / "node-{name}"))
        jre.init(runtime_env={"env_vars": {"BENCH": "1"}}, executor=executor)
        remote_noop = jre.remote(noop)
        dask_first = first_task(lambda: remote_noop.remote(1).result())
        embedded = EmbeddedClient(RuntimeEnvAgent(scratch / "local"))
        local = LocalExecutor(acquire=embedded.acquire_sync, release=embedded.release_sync)
        env = jre.parse({"env_vars": {"BENCH": "1"}})

        def local_call(x: int) -> Any:
            return local.submit(noop, (x,), {}, runtime_env=env, name="noop").result()

        local_first = first_task(lambda: local_call(1))

        # -- per-task round trips ---------------------------------------------------------
        plain_rtt = sequential(lambda x: client.submit(noop, x, pure=False).result(), args.rounds)
        dask_rtt = sequential(lambda x: remote_noop.remote(x).result(), args.rounds)
        local_rtt = sequential(local_call, args.rounds)

        # -- throughput ----------------------------------------------------------------------
        plain_tp = throughput(
            lambda n: client.gather([client.submit(noop, i, pure=False) for i in range(n)]),
            args.tasks,
        )
        dask_tp = throughput(
            lambda n: jre.get([remote_noop.remote(i) for i in range(n)]), args.tasks
        )
        local_tp = throughput(
            lambda n: jre.get(
                [local.submit(noop, (i,), {}, runtime_env=env, name="noop") for i in range(n)]
            ),
            args.tasks,
        )

        # -- bytes for a working_dir ------------------------------------------------------
        tree = scratch / "tree"
        tree_bytes = make_tree(tree, args.files)
        spec = {"working_dir": str(tree), "driver_sys_path": False}
        bytes0, blobs0 = executor.bytes_sent, executor.blobs_sent
        start = time.perf_counter()
        executor.prepare(spec)
        ship_first_s = time.perf_counter() - start
        first_bytes, first_blobs = executor.bytes_sent - bytes0, executor.blobs_sent - blobs0
        bytes0, blobs0 = executor.bytes_sent, executor.blobs_sent
        victim = tree / "pkg3" / "mod3.py"
        victim.write_text(victim.read_text()[:-1] + "!")
        start = time.perf_counter()
        executor.prepare(spec)
        ship_change_s = time.perf_counter() - start
        change_bytes = executor.bytes_sent - bytes0
        change_blobs = executor.blobs_sent - blobs0

        jre.shutdown()
        executor.shutdown()
        local.shutdown()
        embedded.close()

    nodes = 2
    rows += [
        ("per-task round trip (ms)", f"{dask_rtt * 1e3:.2f}", f"{plain_rtt * 1e3:.2f}", ""),
        ("", "", "", f"Dask executor / plain submit: {dask_rtt / plain_rtt:.2f}x (target <= 1.2x)"),
        (
            "",
            f"local {local_rtt * 1e3:.2f}",
            "",
            f"Dask executor / local: {dask_rtt / local_rtt:.1f}x",
        ),
        ("throughput (tasks/s)", f"{dask_tp:.0f}", f"{plain_tp:.0f}", ""),
        ("", "", "", f"plain / Dask executor: {plain_tp / dask_tp:.2f}x"),
        ("", f"local {local_tp:.0f}", "", f"local / Dask executor: {local_tp / dask_tp:.2f}x"),
        (
            "first task (s)",
            f"{dask_first:.2f}",
            f"{plain_first:.3f}",
            f"local executor: {local_first:.2f} s",
        ),
        (
            f"working_dir, {args.files} files, {tree_bytes / 1024:.0f} KiB",
            f"{first_bytes / nodes / 1024:.0f} KiB/node",
            f"{tree_bytes / 1024:.0f} KiB",
            f"{first_blobs // nodes} files/node in {ship_first_s:.2f} s (with the env builds)",
        ),
        (
            "  after a one-byte change",
            f"{change_bytes / nodes} B/node",
            f"{tree_bytes / 1024:.0f} KiB",
            f"{change_blobs // nodes} file/node, {change_bytes / first_bytes:.3%} of the first"
            f" (target <= 1%), {ship_change_s:.2f} s",
        ),
    ]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, 2 Dask workers x 1 thread")
    header = ("measure", "DaskExecutor", "floor (plain Dask)", "ratio / notes")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
