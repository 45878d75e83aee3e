"""Learned imports (issue 19 item 5): 150 leave-one-out fits of a scikit-learn model (k-NN on
iris, a few ms each), the pool's first worker already warm, with and without learned
imports, against the same fits in this process (scikit-learn imported already).

    .venv/bin/python benchmarks/bench_learned.py [--reps N]

A pool of 2 workers: one call imports scikit-learn in the first worker, then 150 calls at
once; the second worker starts for them. Without learned imports it takes calls as soon as
it is up and spends its first one importing scikit-learn (those calls, and the ones
pipelined behind them, wait); with them it imports scikit-learn before it takes a call, and
the first worker runs what it can meanwhile. Times are medians of ``--reps`` fresh pools.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.context import EnvContext
from jupyter_runtimeenv.workers.executor import resolve_driver_sys_path

# One BLAS thread per process (numpy is imported later, by the fits): on a shared 2-core
# machine more only fight. The workers inherit this environment.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

SAMPLES = 150


def leave_one_out(i: int) -> float:
    from sklearn.datasets import load_iris
    from sklearn.neighbors import KNeighborsClassifier

    x, y = load_iris(return_X_y=True)
    keep = [j for j in range(len(y)) if j != i]
    model = KNeighborsClassifier(n_neighbors=5).fit(x[keep], y[keep])
    return float(model.predict(x[i : i + 1])[0] == y[i])


def pooled(learn: bool) -> float:
    ctx = EnvContext(python=sys.executable, driver_sys_path=resolve_driver_sys_path())
    executor = jre.LocalExecutor(
        acquire=lambda _spec, _holder: ctx,
        release=lambda _env, _holder: None,
        max_workers=2,
        learn_imports=learn,
    )
    jre.init(executor=executor)
    try:
        f = jre.remote(leave_one_out)
        f.remote(0).result(600)  # the first worker has scikit-learn
        start = time.perf_counter()
        jre.get([f.remote(i) for i in range(SAMPLES)], timeout=600)
        return time.perf_counter() - start
    finally:
        executor.shutdown()
        jre.shutdown()


def local() -> float:
    leave_one_out(0)
    start = time.perf_counter()
    for i in range(SAMPLES):
        leave_one_out(i)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    rows = {
        "in this process": [local() for _ in range(args.reps)],
        "pool, learned imports": [pooled(True) for _ in range(args.reps)],
        "pool, no learned imports": [pooled(False) for _ in range(args.reps)],
    }
    for label, samples in rows.items():
        print(
            f"{SAMPLES} leave-one-out fits, {label}: {statistics.median(samples):.2f} s", flush=True
        )
    print(f"load average {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
