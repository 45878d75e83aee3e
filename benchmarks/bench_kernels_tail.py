"""Where a slow ``GET status`` goes while n kernels start at once (the kernels curve's tail).

    .venv/bin/python benchmarks/bench_kernels_tail.py [--kernels 16] [--autogroup-nice N]

The two rounds of ``bench_scaling.py``'s kernels curve (n real kernels of one server run
``%load_ext``, ``%runtime_env`` and a remote call at once, through the server; then the same
with an embedded agent each: the floor), with the server's status asked back to back and, turn
about, a trivial HTTP server's (``bench_scaling.TRIVIAL_SERVER``, in the same session). The
server runs ``_loopwatch`` (its loop's lateness, each request's own time, its loop thread).
For each request to the server this process records:

- ``client_wait``: the run-queue wait of the asking thread (``/proc/thread-self/schedstat``:
  runnable, not running) over the request;
- ``loop_wait``/``loop_run``: the server's loop thread's run-queue wait and run time, and
  ``others_run``: its other threads' run time (a thread that holds the GIL runs), from
  ``/proc/<pid>/task/*/schedstat`` read just before and after the request;
- ``before``/``server``/``after``: the request split at the server's own start (its headers
  parsed) and finish: the way in (the client's send, the loop waking and reading), tornado's
  handling, the way out (the client waking and reading); the clocks are the same;
- ``late``: the loop's worst lateness while it ran (a callback due every 2 ms);
- ``runnable``: the kernel's count of runnable tasks as it was sent.

It prints each round's p50/p90/p99 (server and trivial server), and for its slowest 2 % the
mean of each part; and, sampled every 0.2 s, how many sessions (autogroups: Linux shares the
CPUs among them first, then among their tasks) had a runnable task.

``--autogroup-nice N`` runs it in a session of its own with that autogroup nice (a negative
one needs CAP_SYS_NICE): the weight the scheduler gives this session (the client, the server
and the trivial server) against each kernel's session (jupyter_client starts every kernel in
a session of its own). ``--json PATH`` keeps every record.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import progress  # noqa: E402
from bench_scaling import (  # noqa: E402
    _p,
    _trivial_server,
    end_kernels,
    start_kernels,
    stop_servers,
)
from bench_server_loop import API, free_port, request, start_server, wait_until_up  # noqa: E402

Record = dict[str, Any]
SLOWEST = 0.02


def _schedstat(path: str) -> tuple[int, int] | None:
    """(run ns, run-queue wait ns) of a thread; None if it is gone."""
    try:
        with open(path) as f:
            run, wait = f.read().split()[:2]
    except (OSError, ValueError):
        return None
    return int(run), int(wait)


def _threads(pid: int) -> dict[int, tuple[int, int]]:
    out = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            stat = _schedstat(f"/proc/{pid}/task/{tid}/schedstat")
            if stat is not None:
                out[int(tid)] = stat
    return out


def _runnable() -> int:
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[0])


def _sessions(samples: list[tuple[float, int, int]], stop: threading.Event) -> None:
    """Every 0.2 s: (time, runnable tasks, sessions with a runnable task)."""
    while not stop.wait(0.2):
        groups: set[str] = set()
        count = 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                for tid in os.listdir(f"/proc/{entry}/task"):
                    with open(f"/proc/{entry}/task/{tid}/stat") as f:
                        stat = f.read()
                    if stat[stat.rindex(")") + 2] == "R":
                        count += 1
                        with open(f"/proc/{entry}/autogroup") as f:
                            groups.add(f.read().split(" ")[0])
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
        samples.append((time.time(), count, len(groups)))


def _round(
    n: int, pid: int, port: int, trivial: int, token: str, cache: Path | None, label: str
) -> list[Record]:
    """``bench_scaling._kernels_round`` with every request recorded."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    other = http.client.HTTPConnection("127.0.0.1", trivial, timeout=120)
    threads, errors = start_kernels(n, port, token, cache)
    progress(f"{label} round: {n} kernels up, load {os.getloadavg()}")
    me = "/proc/thread-self/schedstat"
    records: list[Record] = []
    while any(thread.is_alive() for thread in threads):
        for who, c, path in (("server", conn, f"{API}/status"), ("trivial", other, "/status")):
            client0, server0, runnable = _schedstat(me), _threads(pid), _runnable()
            t0 = time.time()
            code, _ = request(c, "GET", path, token)
            t1 = time.time()
            client1, server1 = _schedstat(me), _threads(pid)
            if code != 200 or client0 is None or client1 is None:
                raise SystemExit(f"{who}: status {code}")
            records.append(
                {
                    "round": label,
                    "who": who,
                    "t0": t0,
                    "t1": t1,
                    "runnable": runnable,
                    "client_wait": (client1[1] - client0[1]) / 1e9,
                    "threads": {
                        tid: ((r - server0[tid][0]) / 1e9, (w - server0[tid][1]) / 1e9)
                        for tid, (r, w) in server1.items()
                        if tid in server0
                    },
                }
            )
    end_kernels(threads, errors)
    conn.close()
    other.close()
    return records


def _attribute(records: list[Record], watch: dict[str, Any]) -> None:
    """Add to each record to the server its parts (see the module docstring)."""
    loop = watch["info"]["loop_tid"]
    late = watch["late"]
    late_at = [t for t, _ in late]
    served = sorted(r for r in watch["requests"] if r[2].endswith("/status"))
    starts = [r[0] for r in served]
    for rec in records:
        if rec["who"] != "server":
            continue
        t0, t1 = rec["t0"], rec["t1"]
        threads = rec.pop("threads")
        rec["loop_run"], rec["loop_wait"] = threads.get(loop, (0.0, 0.0))
        rec["others_run"] = sum(r for tid, (r, _) in threads.items() if tid != loop)
        i = bisect.bisect_left(starts, t0)
        if i < len(served) and served[i][0] <= t1:
            start, end, _ = served[i]
            rec["before"], rec["server"], rec["after"] = start - t0, end - start, t1 - end
        j, k = bisect.bisect_left(late_at, t0), bisect.bisect_right(late_at, t1 + 0.05)
        rec["late"] = max((x for _, x in late[j:k]), default=0.0)


PARTS = ("client_wait", "loop_wait", "loop_run", "others_run", "before", "server", "after")


def _routes(watch: dict[str, Any], records: list[Record]) -> None:
    """What the server answered during the round through it, by route (ids as ``{id}``),
    besides the status requests of this process."""
    rounds = [r for r in records if r["round"] == "server"]
    start, end = min(r["t0"] for r in rounds), max(r["t1"] for r in rounds)
    counts = collections.Counter(
        re.sub(r"/[0-9a-f]{8,}[0-9a-f-]*", "/{id}", path)
        for begun, _, path in watch["requests"]
        if start <= begun <= end
    )
    mine = sum(1 for r in rounds if r["who"] == "server")
    counts[f"{API}/status"] -= mine
    print(f"the server's other requests during the round through it ({end - start:.1f} s):")
    for path, count in counts.most_common(8):
        if count > 0:
            print(f"  {count:5}  {path}")


def report(records: list[Record], samples: list[tuple[float, int, int]]) -> None:
    for label in ("server", "floor"):
        for who in ("server", "trivial"):
            got = [r["t1"] - r["t0"] for r in records if r["round"] == label and r["who"] == who]
            if got:
                print(
                    f"{label:6} round, {who:7}: {len(got):5} requests, p50 "
                    f"{statistics.median(got) * 1e3:6.2f}  p90 {_p(got, 0.9) * 1e3:6.2f}  "
                    f"p99 {_p(got, 0.99) * 1e3:6.2f}  max {max(got) * 1e3:6.1f} ms"
                )
        mine = [r for r in records if r["round"] == label and r["who"] == "server"]
        mine.sort(key=lambda r: r["t1"] - r["t0"], reverse=True)
        slow = mine[: max(1, round(len(mine) * SLOWEST))]
        parts = {"total": [r["t1"] - r["t0"] for r in slow]}
        for part in (*PARTS, "late"):
            parts[part] = [r[part] for r in slow if part in r]
        print(
            f"  its slowest {len(slow)} to the server, mean ms: "
            + ", ".join(f"{k} {statistics.mean(v) * 1e3:.1f}" for k, v in parts.items() if v)
            + f"; runnable {statistics.mean(r['runnable'] for r in slow):.0f}"
        )
    busy = [s for s in samples if s[1] > 2]
    if busy:
        print(
            f"sessions with a runnable task while more than 2 tasks were runnable: median "
            f"{statistics.median(s[2] for s in busy):.0f} (max {max(s[2] for s in busy)}), "
            f"runnable tasks median {statistics.median(s[1] for s in busy):.0f}, "
            f"{len(busy)} samples"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=16)
    parser.add_argument("--autogroup-nice", type=int, metavar="N")
    parser.add_argument("--json", type=Path, metavar="PATH")
    args = parser.parse_args()
    if args.autogroup_nice is not None:
        if os.getsid(0) != os.getpid():  # a session of its own: setsid(1) forks if it must
            os.execvp("setsid", ["setsid", "-w", sys.executable, *sys.argv])
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(args.autogroup_nice))
    with open("/proc/self/autogroup") as f:
        progress(f"this session: {f.read().strip()}; load {os.getloadavg()}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))  # the cleanup runs
    tmp = Path(tempfile.mkdtemp(prefix="jre-bench-tail-"))
    port, token = free_port(), secrets.token_hex(16)
    server = start_server(tmp, tmp, port, token, watch=True)
    trivial, trivial_port = _trivial_server()
    samples: list[tuple[float, int, int]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_sessions, args=(samples, stop), daemon=True)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        wait_until_up(server, conn, f"{API}/status", token)
        sampler.start()
        n = args.kernels
        records = _round(n, server.pid, port, trivial_port, token, None, "server")
        records += _round(n, server.pid, port, trivial_port, token, tmp / "embedded", "floor")
        conn.request("GET", "/loopwatch")
        watch = json.loads(conn.getresponse().read())
        conn.close()
    finally:
        stop.set()
        stop_servers(server, trivial)
        shutil.rmtree(tmp, ignore_errors=True)
    progress(f"{n} kernels done; load {os.getloadavg()}")
    _routes(watch, records)
    _attribute(records, watch)
    report(records, samples)
    if args.json:
        args.json.write_text(json.dumps({"records": records, "sessions": samples}))


if __name__ == "__main__":
    main()
