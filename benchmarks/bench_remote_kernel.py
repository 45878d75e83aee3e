"""Kernels on a Dask node (issue 18) against a local ipykernel, in the same run.

    .venv/bin/python benchmarks/bench_remote_kernel.py [--runs 5] [--json FILE]

On one ``LocalCluster(n_workers=2, threads_per_worker=1, processes=True)`` on 127.0.0.1, a
``--dask`` kernelspec (``env_vars`` only: nothing to install) and, as the floor, ipykernel's
own ``python3`` kernelspec started by a plain ``KernelManager`` on this machine:

- start: ``start_kernel`` + ``wait_for_ready`` (remote: env READY on the node already, so
  this is connect, place, stage, build-is-cached, start ipykernel, ZMQ across);
- round trip: ``execute("1 + 1")`` until its reply, median of 20 per run;
- interrupt: the time from ``interrupt_kernel()`` to the ``KeyboardInterrupt`` reply of a
  running ``time.sleep(60)`` (issue 18's bound: 3 s).

Prints a table and the load average at the start and end (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import progress, stats
from distributed import LocalCluster
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

from jupyter_runtimeenv.kernels import install_kernelspec


def start(km: KernelManager) -> tuple[float, Any]:
    began = time.perf_counter()
    km.start_kernel()
    client = km.blocking_client()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    return time.perf_counter() - began, client


def round_trip(client: Any) -> float:
    samples = []
    for _ in range(20):
        began = time.perf_counter()
        reply = client.execute_interactive("1 + 1", timeout=60, output_hook=lambda m: None)
        samples.append(time.perf_counter() - began)
        assert reply["content"]["status"] == "ok"
    return statistics.median(samples)


def interrupt(km: KernelManager, client: Any) -> float:
    msg_id = client.execute("import time; print('sleeping', flush=True); time.sleep(60)")
    while True:
        msg = client.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            break
    began = time.perf_counter()
    km.interrupt_kernel()
    while True:
        reply = client.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    elapsed = time.perf_counter() - began
    assert reply["content"].get("ename") == "KeyboardInterrupt", reply["content"]
    time.sleep(0.5)  # ipykernel aborts requests that arrive right after an error
    return elapsed


def measure(km_factory: Any, runs: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"start": [], "round_trip": [], "interrupt": []}
    for i in range(runs):
        km = km_factory()
        seconds, client = start(km)
        try:
            out["start"].append(seconds)
            out["round_trip"].append(round_trip(client))
            out["interrupt"].append(interrupt(km, client))
        finally:
            client.stop_channels()
            km.shutdown_kernel(now=True)
        progress(f"run {i + 1}/{runs}: start {seconds:.2f} s")
    return out


def fmt(result: dict[str, Any]) -> str:
    scale, unit = (1000, "ms") if result["median"] < 1 else (1, "s")
    return (
        f"{result['median'] * scale:.1f} {unit} "
        f"({result['min'] * scale:.1f}-{result['max'] * scale:.1f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["JUPYTER_RUNTIMEENV_CACHE"] = str(Path(tmp) / "cache")
        cluster = LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
            dashboard_address=None,
        )  # fmt: skip
        try:
            install_kernelspec(
                "bench", {"env_vars": {"B": "1"}}, prefix=tmp, dask=cluster.scheduler_address
            )
            specs = KernelSpecManager(kernel_dirs=[str(Path(tmp) / "share/jupyter/kernels")])
            local_specs = KernelSpecManager(kernel_dirs=[])  # ipykernel's own python3

            def remote() -> KernelManager:
                return KernelManager(kernel_name="bench", kernel_spec_manager=specs)

            def local() -> KernelManager:
                return KernelManager(kernel_name="python3", kernel_spec_manager=local_specs)

            progress("warm-up: the env is built on the node once")
            warm = remote()
            _, client = start(warm)
            client.stop_channels()
            warm.shutdown_kernel(now=True)
            progress("remote kernels")
            ours = measure(remote, args.runs)
            progress("local kernels (the floor)")
            floor = measure(local, args.runs)
        finally:
            cluster.close()
    load_end = os.getloadavg()
    results = {name: {"ours": stats(ours[name]), "floor": stats(floor[name])} for name in ours}
    print(f"\nload average {load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end; "
          f"{args.runs} runs; Python {sys.version.split()[0]}\n")  # fmt: skip
    print("| workload | remote kernel: median (min-max) | floor: local ipykernel | ratio |")
    print("|---|---|---|---|")
    labels = {
        "start": "start + ready (env READY on the node)",
        "round_trip": "execute 1 + 1, reply",
        "interrupt": "interrupt time.sleep(60) → KeyboardInterrupt (bound 3 s)",
    }
    for name, pair in results.items():
        ratio = pair["ours"]["median"] / pair["floor"]["median"]
        print(f"| {labels[name]} | {fmt(pair['ours'])} | {fmt(pair['floor'])} | {ratio:.2f}x |")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"load": [load_start[0], load_end[0]], "results": results}, indent=2)
        )


if __name__ == "__main__":
    main()
