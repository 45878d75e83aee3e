"""How costs grow with the work: the curves of ``run.py --scaling`` (issue 19 item 6).

    .venv/bin/python benchmarks/run.py --scaling [--quick] [--json PATH]

Four curves, each row a size ``n`` and its measures; per-unit measures are named ``per_*``
(seconds or bytes per task, file, env, request or kernel). Flat is the target: each per-unit
cost at the largest ``n`` at most 1.5x the smallest.

- ``tasks`` (1k, 10k, 100k): no-op tasks submitted at once to a ``LocalExecutor`` with two
  workers (agent embedded): ``per_task_s`` (wall time / n; a size below ``TASKS_PER_SIZE``
  is run again until that many tasks have run, and its median run counts: 1k tasks take
  ~20 ms, and one run of them read 17.5-26 us per task in turns on a quiet machine), the
  throughput, the driver's RSS growth with every future submitted and held
  (``rss_growth_mb``, the first run's), and
  ``per_future_bytes``: the bytes allocated (tracemalloc, a second pass) per held future,
  most of them still pending.
- ``files`` (1k, 10k, 100k files of 1 KiB in 100 directories): a task in a ``working_dir``
  env, first (a new agent, the stat cache forgotten), unchanged (a new worker) and one byte
  changed: seconds per file of each.
- ``envs`` (10, 1,000, 10,000 cached env_vars-only envs in one cache): a real ``jupyter
  server`` on that cache (``up_s``: until it answers; ``settled_s``: until its start-up work
  on the cache is done), then answering ``GET status`` and a first page of 10 of ``GET envs``
  (``per_request_p50_s``/``per_request_p99_s`` over 40 calls each: flat means a request
  does not grow with the stored envs), ``jupyter runtimeenv list --json`` and ``gc`` (the
  CLI, a process each; seconds per env).
- ``kernels`` (1, 4, 16): real ipykernels of one server, all at once: ``%load_ext``,
  ``%runtime_env --env-var K=i`` (a new env each) and a remote call, while this process
  asks the server's status back to back: the p99 of those requests and the server's RSS
  growth per kernel. Its floor, in the same run right after: the same kernels running the
  same cell with no server in their path (each its own embedded agent: no build, report or
  command poll reaches the server) while the server is asked the same
  (``floor_p50_s``/``floor_p99_s``): what the machine's load alone does to the server's
  answers. In that round the same requests also go, turn about, to a trivial HTTP server
  (the standard library's, one thread, a JSON body of the same size) started like the
  Jupyter server, in the same session (``floor_stdlib_p50_s``/``floor_stdlib_p99_s``):
  what any server there would answer in, at the same moments.

``--quick`` leaves out each curve's largest size (fewer than three points then).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

from _common import descendants, progress, rss_mb
from bench_server_loop import API, free_port, request, start_server, wait_until_up

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.agent import RuntimeEnvAgent
from jupyter_runtimeenv.client import EmbeddedClient
from jupyter_runtimeenv.plugins import _hashing

SIZES = {
    "tasks": [1_000, 10_000, 100_000],
    "files": [1_000, 10_000, 100_000],
    "envs": [10, 1_000, 10_000],
    "kernels": [1, 4, 16],
}
Row = dict[str, Any]
#: Each per-unit cost at the largest n at most this times the smallest.
TARGET = 1.5


def noop() -> None:
    return None


def count_files(path: str = ".") -> int:
    return sum(len(files) for _, _, files in os.walk(path))


def own_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def executor(client: EmbeddedClient, **kwargs: Any) -> jre.LocalExecutor:
    ex = jre.LocalExecutor(acquire=client.acquire_sync, release=client.release_sync, **kwargs)
    jre.init(executor=ex)
    return ex


#: The tasks curve runs each size until this many tasks have run (its median run counts).
TASKS_PER_SIZE = 100_000


def tasks_curve(tmp: Path, sizes: list[int]) -> list[Row]:
    rows = []
    client = EmbeddedClient(RuntimeEnvAgent(tmp / "tasks-agent"))
    ex = executor(client, max_workers=2)
    try:
        f = jre.remote(noop)
        jre.get([f.remote() for _ in range(2000)])  # both workers up, the function sent
        for n in sizes:
            runs, rss = [], 0
            for run in range(max(1, TASKS_PER_SIZE // n)):
                before = own_rss()
                started = time.perf_counter()
                futures = [f.remote() for _ in range(n)]
                if run == 0:
                    rss = own_rss() - before  # every future held (most still pending)
                jre.get(futures)
                runs.append(time.perf_counter() - started)
                del futures
            seconds = statistics.median(runs)
            # The bytes a held future costs, from the allocator (RSS alone cannot tell: a
            # small batch fits in memory freed earlier); a pass of its own, as tracing slows
            # the submitting thread.
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
            futures = [f.remote() for _ in range(n)]
            held = tracemalloc.get_traced_memory()[0] - base
            tracemalloc.stop()
            jre.get(futures)
            del futures
            rows.append(
                {
                    "n": n,
                    "runs": len(runs),
                    "seconds": seconds,
                    "throughput": n / seconds,
                    "rss_growth_mb": max(rss, 0) / 2**20,
                    "per_task_s": seconds / n,
                    "per_future_bytes": max(held, 0) / n,
                }
            )
            progress(f"scaling tasks {n:,}: {n / seconds:,.0f}/s, {held / n:.0f} B per future")
    finally:
        ex.shutdown()
        jre.shutdown()
        client.close()
    return rows


def make_files(root: Path, n: int) -> Path:
    """``n`` files of 1 KiB in 100 directories, mtimes a minute old."""
    old = time.time() - 60
    for d in range(100):
        (root / f"d{d:02d}").mkdir(parents=True)
    for i in range(n):
        path = root / f"d{i % 100:02d}" / f"f{i:06d}.txt"
        path.write_bytes(os.urandom(512).hex().encode())
        os.utime(path, (old, old))
    return root


def files_curve(tmp: Path, sizes: list[int]) -> list[Row]:
    rows = []
    for n in sizes:
        tree = make_files(tmp / f"tree-{n}", n)
        env = {"working_dir": str(tree)}
        call = jre.remote(count_files).options(runtime_env=env)
        _hashing.forget_stat_cache()  # a tree never seen, as in a new kernel
        client = EmbeddedClient(RuntimeEnvAgent(tmp / f"files-agent-{n}"))
        try:
            ex = executor(client)
            started = time.perf_counter()
            assert call.remote().result(1800) == n
            first = time.perf_counter() - started
            ex.shutdown()
            ex = executor(client)  # a new pool: a new worker
            started = time.perf_counter()
            call.remote().result(1800)
            unchanged = time.perf_counter() - started
            ex.shutdown()
            victim = tree / "d00" / "f000000.txt"
            victim.write_bytes(b"x" + victim.read_bytes()[1:])
            ex = executor(client)
            started = time.perf_counter()
            call.remote().result(1800)
            one_byte = time.perf_counter() - started
            ex.shutdown()
        finally:
            jre.shutdown()
            client.close()
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(tmp / f"files-agent-{n}", ignore_errors=True)
        rows.append(
            {
                "n": n,
                "first_s": first,
                "unchanged_s": unchanged,
                "one_byte_s": one_byte,
                "per_file_first_s": first / n,
                "per_file_unchanged_s": unchanged / n,
                "per_file_one_byte_s": one_byte / n,
            }
        )
        progress(f"scaling files {n:,}: first {first:.2f} s, unchanged {unchanged:.3f} s")
    return rows


def _fill_cache(cache: Path, have: int, want: int) -> None:
    """Grow the cache to ``want`` env_vars-only envs (built, then unheld) through an agent."""
    if want <= have:
        return
    client = EmbeddedClient(RuntimeEnvAgent(cache))
    try:
        for i in range(have, want):
            ctx = client.acquire_sync({"env_vars": {"JRE_SCALING": str(i)}}, "scaling")
            client.release_sync(ctx.env_id, "scaling")
    finally:
        client.close()


def _latencies(conn: http.client.HTTPConnection, path: str, token: str, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        code, _body = request(conn, "GET", path, token)
        out.append(time.perf_counter() - started)
        assert code == 200, (path, code)
    return out


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * len(ordered)) - 1))]


def _cli(cache: Path, *argv: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "jupyter_runtimeenv", "--cache-dir", str(cache), *argv],
        check=True, stdout=subprocess.DEVNULL, timeout=1800,
    )  # fmt: skip
    return time.perf_counter() - started


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _settle(pid: int, limit: float = 120.0) -> float:
    """Seconds until the server stops working on its own (under 5 % of a core over 0.5 s,
    at most ``limit``): the agent's start-up work on the cache, which the requests measured
    after it must not be charged with (it is reported as ``settled_s``)."""
    started = time.perf_counter()
    before = _cpu_seconds(pid)
    while time.perf_counter() - started < limit:
        time.sleep(0.5)
        now = _cpu_seconds(pid)
        if now - before < 0.025:
            break
        before = now
    return time.perf_counter() - started


#: Requests of each kind per size in the envs curve (its p99 is over twice as many).
ENV_REQUESTS = 200


def envs_curve(tmp: Path, sizes: list[int]) -> list[Row]:
    rows = []
    root = tmp / "envs"
    cache = root / "cache"  # start_server's cache_dir
    root.mkdir()
    cache.mkdir(mode=0o700)
    have = 0
    for n in sizes:
        _fill_cache(cache, have, n)
        have = n
        port, token = free_port(), secrets.token_hex(16)
        server = start_server(root, root, port, token)
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            started = time.perf_counter()
            wait_until_up(server, conn, f"{API}/status", token)
            up = time.perf_counter() - started
            settled = _settle(server.pid) + up  # its start's work on the cache done
            # 200 of each: the p99 of 400 has 4 requests above it, not a single outlier.
            status = _latencies(conn, f"{API}/status", token, ENV_REQUESTS)
            page = _latencies(conn, f"{API}/envs?limit=10", token, ENV_REQUESTS)  # one page
            conn.close()
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
        listing = _cli(cache, "list", "--json")
        gc = _cli(cache, "gc", "--max-bytes", "1T")  # looks at everything, evicts nothing
        both = status + page
        rows.append(
            {
                "n": n,
                "status_p50_s": statistics.median(status),
                "envs_page_p50_s": statistics.median(page),
                "per_request_p50_s": statistics.median(both),
                "per_request_p99_s": _p(both, 0.99),
                "up_s": up,
                "settled_s": settled,
                "list_s": listing,
                "gc_s": gc,
                "per_env_list_s": listing / n,
                "per_env_gc_s": gc / n,
            }
        )
        progress(
            f"scaling envs {n:,}: request p99 {_p(both, 0.99) * 1000:.1f} ms, "
            f"list {listing:.2f} s, gc {gc:.2f} s"
        )
    shutil.rmtree(root, ignore_errors=True)
    return rows


KERNEL_CODE = """
%load_ext jupyter_runtimeenv
%runtime_env --env-var K={i} --no-widget
import jupyter_runtimeenv as _jre
assert _jre.remote(lambda: 1).remote().result(600) == 1
"""


#: The trivial server of the kernels' floor: HTTP/1.1 keep-alive, one thread, no Nagle (a
#: header and body written apart would wait for the client's delayed ACK: 40 ms).
TRIVIAL_SERVER = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

BODY = json.dumps({"version": "0", "started": True, "envs": {"READY": 16}}).encode()

class Status(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args):
        pass

server = HTTPServer(("127.0.0.1", 0), Status)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def _trivial_server() -> tuple[subprocess.Popen[str], int]:
    """Start ``TRIVIAL_SERVER`` as the Jupyter server is started (a child of this process,
    in its session: the scheduler shares the CPUs among sessions, so the same share); its
    process and port."""
    proc = subprocess.Popen(
        [sys.executable, "-c", TRIVIAL_SERVER],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


#: Tries to start each kernel (one that dies before its kernel_info is started again).
KERNEL_STARTS = 3
#: How long a kernel may take to answer its first kernel_info (16 start at once).
KERNEL_STARTUP_S = 120


def _kernel_work(
    url: str, token: str, i: int, errors: list[str], ready: threading.Barrier, cache: Path | None
) -> None:
    """One kernel: start, wait for the others, run ``KERNEL_CODE``. ``cache``: run it with
    an embedded agent on that cache instead of the server's (the floor)."""
    from jupyter_client.manager import KernelManager

    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_RUNTIMEENV_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    if cache is None:
        env.update(
            JUPYTER_RUNTIMEENV_URL=url,
            JUPYTER_RUNTIMEENV_TOKEN=token,
            JUPYTER_RUNTIMEENV_KERNEL_ID=str(uuid.uuid4()),
        )
    else:
        env["JUPYTER_RUNTIMEENV_CACHE"] = str(cache)
    sockets = tempfile.mkdtemp(prefix="jre-k")  # short: a unix socket's path is <= 107 bytes
    for attempt in range(KERNEL_STARTS):
        # IPC, not TCP: jupyter_client picks a TCP kernel's five ports free and lets them go
        # for the kernel to bind, and with 16 kernels starting at once another kernel's own
        # random port now and then took one of them (the kernel then never answered: a run
        # hung for its whole startup timeout). A socket path of its own cannot be taken.
        manager = KernelManager(
            kernel_name="python3", transport="ipc", ip=os.path.join(sockets, f"{i}-{attempt}")
        )
        try:
            manager.start_kernel(env=env)
            client = manager.client()
            client.start_channels()
            try:
                client.wait_for_ready(timeout=KERNEL_STARTUP_S)
            except BaseException:
                client.stop_channels()
                raise
            break
        except Exception as exc:
            with contextlib.suppress(Exception):
                manager.shutdown_kernel(now=True)
            if attempt + 1 < KERNEL_STARTS:
                continue
            errors.append(f"kernel {i} did not start: {exc!r}")
            ready.abort()  # the others' and the asking thread's waits end at once
            shutil.rmtree(sockets, ignore_errors=True)
            return
    try:
        ready.wait(900)  # every kernel up: they declare and submit at once
        msg_id = client.execute(KERNEL_CODE.format(i=i))
        while True:
            reply = client.get_shell_msg(timeout=900)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        if reply["content"]["status"] != "ok":
            errors.append(f"kernel {i}: {reply['content'].get('evalue')}")
    except Exception as exc:  # reported, not raised in a thread
        errors.append(f"kernel {i}: {exc!r}")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
        shutil.rmtree(sockets, ignore_errors=True)


def _kernels_round(
    n: int,
    server: subprocess.Popen[bytes],
    port: int,
    token: str,
    cache: Path | None,
    trivial: int | None = None,
) -> tuple[list[float], float, list[float]]:
    """``n`` kernels run ``KERNEL_CODE`` at once (through the server, or with ``cache``
    embedded) while the server's status is asked back to back: the latencies, peak RSS.
    With ``trivial`` (the trivial server's port), each 5 requests to the server are
    followed by 5 to it: their latencies too."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    other = None if trivial is None else http.client.HTTPConnection("127.0.0.1", trivial, 120)
    answered: list[float] = []
    threads, errors = start_kernels(n, port, token, cache)
    latencies: list[float] = []
    peak = rss_mb([server.pid])
    while any(thread.is_alive() for thread in threads):
        latencies += _latencies(conn, f"{API}/status", token, 5)
        if other is not None:
            answered += _latencies(other, "/status", token, 5)
        peak = max(peak, rss_mb([server.pid]))
    end_kernels(threads, errors)
    conn.close()
    if other is not None:
        other.close()
    return latencies, peak, answered


def start_kernels(
    n: int, port: int, token: str, cache: Path | None
) -> tuple[list[threading.Thread], list[str]]:
    """Start ``n`` kernels (``_kernel_work``, a thread each: through the server on ``port``,
    or with ``cache`` embedded) and return once all are up and run ``KERNEL_CODE``: their
    threads and the list their errors go to (see ``end_kernels``)."""
    url = f"http://127.0.0.1:{port}{API}/"
    errors: list[str] = []
    ready = threading.Barrier(n + 1)
    threads = [
        threading.Thread(target=_kernel_work, args=(url, token, i, errors, ready, cache))
        for i in range(n)
    ]
    for thread in threads:
        thread.start()
    try:
        ready.wait(900)
    except threading.BrokenBarrierError:  # a kernel did not start (in ``errors``)
        end_kernels(threads, errors)
    return threads, errors


def end_kernels(threads: list[threading.Thread], errors: list[str]) -> None:
    """Wait for the kernels of ``start_kernels``; what went wrong ends the benchmark."""
    for thread in threads:
        thread.join()
    if errors:
        raise SystemExit("; ".join(errors))


def stop_servers(server: subprocess.Popen[bytes], trivial: subprocess.Popen[str]) -> None:
    """End the kernels curve's servers and whatever of a kernel is still there."""
    server.send_signal(signal.SIGTERM)
    server.wait(60)
    trivial.kill()
    trivial.wait(60)
    for pid in descendants():  # nothing of a kernel stays behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def kernels_curve(tmp: Path, sizes: list[int]) -> list[Row]:
    rows = []
    for n in sizes:
        root = tmp / f"kernels-{n}"
        root.mkdir()
        port, token = free_port(), secrets.token_hex(16)
        server = start_server(root, root, port, token)
        trivial, trivial_port = _trivial_server()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            wait_until_up(server, conn, f"{API}/status", token)
            conn.close()
            idle = rss_mb([server.pid])
            latencies, peak, _ = _kernels_round(n, server, port, token, None)
            floor, _, stdlib = _kernels_round(
                n, server, port, token, root / "embedded", trivial_port
            )
        finally:
            stop_servers(server, trivial)
        rows.append(
            {
                "n": n,
                "requests": len(latencies),
                "per_request_p50_s": statistics.median(latencies),
                "per_request_p99_s": _p(latencies, 0.99),
                "floor_p50_s": statistics.median(floor),
                "floor_p99_s": _p(floor, 0.99),
                "floor_stdlib_p50_s": statistics.median(stdlib),
                "floor_stdlib_p99_s": _p(stdlib, 0.99),
                "agent_rss_mb": peak,
                "per_kernel_rss_mb": (peak - idle) / n,
            }
        )
        progress(
            f"scaling kernels {n}: server p50/p99 {statistics.median(latencies) * 1000:.1f}/"
            f"{_p(latencies, 0.99) * 1000:.1f} ms (floor, the kernels without the server: "
            f"{statistics.median(floor) * 1000:.1f}/{_p(floor, 0.99) * 1000:.1f} ms; a "
            f"trivial server then: {statistics.median(stdlib) * 1000:.1f}/"
            f"{_p(stdlib, 0.99) * 1000:.1f} ms), "
            f"RSS +{peak - idle:.1f} MB"
        )
        shutil.rmtree(root, ignore_errors=True)
    return rows


CURVES = {
    "tasks": tasks_curve,
    "files": files_curve,
    "envs": envs_curve,
    "kernels": kernels_curve,
}


def run(tmp: Path, quick: bool, only: list[str] | None = None) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for name, curve in CURVES.items():
        if only and name not in only:
            continue
        sizes = SIZES[name][:-1] if quick else SIZES[name]
        progress(f"scaling {name}: n = {', '.join(f'{n:,}' for n in sizes)}")
        out[name] = curve(tmp, sizes)
    return out


def growth(rows: list[Row]) -> dict[str, float]:
    """Each ``per_*`` measure at the largest n over the smallest (flat: 1)."""
    if len(rows) < 2:
        return {}
    first, last = rows[0], rows[-1]
    return {
        key: last[key] / first[key]
        for key in first
        if key.startswith("per_") and first[key] and last.get(key) is not None
    }


def _fmt(key: str, value: float) -> str:
    if key.endswith("_bytes"):
        return f"{value:,.0f} B"
    if key.endswith("_mb"):
        return f"{value:.1f} MB"
    if key.endswith("_s"):
        if value < 1e-3:
            return f"{value * 1e6:.1f} µs"
        return f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.2f} s"
    return f"{value:,.0f}"


def table(scaling: dict[str, list[Row]]) -> str:
    lines = ["| curve | measure | values by n | largest / smallest (target ≤ 1.5x) |"]
    lines.append("|---|---|---|---|")
    for name, rows in scaling.items():
        ratios = growth(rows)
        for key in [k for k in rows[0] if k.startswith(("per_", "floor_"))]:
            values = ", ".join(f"{row['n']:,}: {_fmt(key, row[key])}" for row in rows)
            ratio = ratios.get(key)
            if key.startswith("floor_") and len(rows) > 1 and rows[0][key]:
                ratio = rows[-1][key] / rows[0][key]
            verdict = "—"
            if ratio is not None and key.startswith("floor_"):
                verdict = f"{ratio:.2f}x (the floor: not a target)"
            elif ratio is not None:
                verdict = f"{ratio:.2f}x " + ("met" if ratio <= TARGET else "**missed**")
            lines.append(f"| {name} | {key} | {values} | {verdict} |")
    return "\n".join(lines)


def chart(scaling: dict[str, list[Row]], path: Path, title: str) -> None:
    """One log-log panel per curve, a line per ``per_*`` measure (normalised to its value
    at the smallest n, so flat is a horizontal line at 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(scaling)
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.8), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        rows = scaling[name]
        ns = [row["n"] for row in rows]
        for key in [k for k in rows[0] if k.startswith("per_")]:
            base = rows[0][key] or 1
            ax.plot(ns, [row[key] / base for row in rows], marker="o", label=key)
        for key in [k for k in rows[0] if k.startswith("floor_")]:
            # The same measure without our code in the path (kernels: no server), dashed:
            # where it grows alike, what grows is the machine, not us.
            base = rows[0][key] or 1
            ax.plot(ns, [row[key] / base for row in rows], linestyle=":", marker="x", label=key)
        ax.axhline(TARGET, color="grey", linestyle="--", linewidth=1, label="target 1.5x")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(name)
        ax.set_xlabel("n")
        ax.set_ylabel("per unit, / smallest n")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def dump(scaling: dict[str, list[Row]]) -> str:
    return json.dumps(scaling, indent=1)
