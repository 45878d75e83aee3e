"""The whole product in one run, side by side with Ray and Dask: one markdown table.

    .venv/bin/python benchmarks/run.py [--quick] [--peers] [--json PATH]
    .venv/bin/python benchmarks/run.py --scaling [--quick] [--json PATH] [--chart PNG]

Columns: the workload; this project's median (min-max) over the runs; the floor measured in
the same run (see each row); ours / floor; the target and whether it is met; with
``--peers``, Ray's and Dask's median and how many times slower than ours they are.
Progress goes to stderr, one line per workload. ``--json PATH`` writes every number: the
keys ``date``, ``seconds``, ``quick``, ``machine``, ``ours``, ``floors`` and ``peers`` (each
workload's result has ``median``, ``min``, ``max``, ``n`` and ``unit``) stay, so runs compare.

``--scaling`` runs the scaling curves instead (``bench_scaling.py``: tasks, files, cached
envs, kernels; a table of the per-unit costs, a log-log PNG chart next to the JSON, or at
``--chart``); its JSON has a ``scaling`` object with one list of rows per curve.

Set-up, made once into ignored folders: ``benchmarks/.wheelhouse`` (six, attrs,
packaging, numpy, pandas, scikit-learn and their dependencies; ``pip download``: the only
network use), ``benchmarks/.peers/ray``
(``ray[default]``) and ``benchmarks/.peers/dask`` (``distributed``), both from the package
index. Every install of every tool is ``--no-index --find-links`` that wheelhouse. The peers
run as subprocesses (``peer_ray.py``, ``peer_dask.py``) in their venvs, on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import bench_scaling
from _common import HERE, Result, compile_package, descendants, make_tree, progress, wheelhouse
from ours import Ours

from jupyter_runtimeenv.plugins._uv import uv_bin

#: The whole of ``--peers`` (not ``--quick``) must end within 15 minutes on 2 cores: a peer
#: still running when its share is spent is stopped, keeping what it measured.
BUDGET = 14.5 * 60
PEERS = {"ray": ["ray[default]"], "dask": ["distributed"]}
REPS = {
    "full": {"pip": 3, "numpy": 2, "rtt": 200, "start": 5, "w3": 2, "burst": 3, "wd": 5,
             "w8": 3, "s1": 2, "w10": 7, "cli": 5, "w9": 5},
    "quick": {"pip": 1, "numpy": 1, "rtt": 200, "start": 3, "w3": 1, "burst": 1, "wd": 2,
              "w8": 1, "s1": 1, "w10": 3, "cli": 5, "w9": 5},
}  # fmt: skip
#: The peers' pip-heavy workloads take 10-30 s a run (Ray's W8 a minute: it retries the
#: install): fewer runs keep the whole within 15 minutes on 2 cores.
PEER_CAPS = {"pip": 1, "numpy": 1, "w3": 1, "wd": 3, "start": 2, "w8": 1}
#: Variants of a workload that only this project has (its early start, the fork prototype).
OURS_ONLY = {
    "W2b cold", "W6 cold", "W6 at once", "W6 fork", "W10 numpy", "W10 pandas",
    "K1", "K1 load_ext", "K1 embedded", "K1 embedded load_ext",
    "W9 cold", "W9 warm", "W9 CLI cold", "W9 CLI warm",
}  # fmt: skip
TARGETS_5X = {"W1 cold", "W1 warm", "W2b", "W3", "W5 first", "W5 unchanged", "W5 one byte", "W8"}

START = "python start + import cloudpickle"
# (key, workload, floor, target): target kinds "x" (ours / floor at most), "s" (seconds at
# most), "rate" (at least, per second), "mb" (at most, MB).
ROWS: list[tuple[str, str, str, tuple[str, float] | None]] = [
    (
        "W1 cold",
        "W1 pip {six, attrs, packaging}, submit → result, uv cache cold",
        "uv venv + uv pip install + imports",
        ("x", 1.2),
    ),
    ("W1 warm", "W1 the same, uv cache warm", "the same, warm", ("x", 1.2)),
    ("W1n cold", "W1n pip numpy, uv cache cold", "uv venv + install + import", ("x", 1.2)),
    ("W1n warm", "W1n pip numpy, uv cache warm", "the same, warm", ("x", 1.2)),
    (
        "W9 cold",
        "W9 pip pandas + scikit-learn, submit → result, uv cache cold",
        "uv venv + uv pip install + imports",
        ("x", 1.1),
    ),
    ("W9 warm", "W9 the same, uv cache warm (the floor's cache)", "the same, warm", ("x", 1.1)),
    (
        "W9 CLI cold",
        "W9 through the CLI: jupyter runtimeenv build + imports, uv cache cold",
        "uv venv + uv pip install + imports, each run back to back with ours",
        ("x", 1.1),
    ),
    (
        "W9 CLI warm",
        "W9 the CLI, uv cache warm (the floor's cache)",
        "the same, warm, back to back",
        ("x", 1.1),
    ),
    ("W2", "W2 same env, idle worker round trip", "raw pipe round trip", ("s", 0.00006)),
    (
        "W2b",
        "W2b cached env, new worker, first result (after %runtime_env, next cell)",
        START,
        ("s", 0.040),
    ),
    ("W2b cold", "W2b the same, no early start", START, None),
    ("W3", "W3 four pip envs at once → all four results", "four uv installs at once", ("x", 1.2)),
    ("W4 throughput", "W4 1,000 no-op tasks, 2 workers", "1 / pipe round trip", ("rate", 15000)),
    ("W4 round trip", "W4 100 sequential round trips", "raw pipe round trip", ("s", 0.0003)),
    ("W5 first", "W5 working_dir 1,000 files / 20 MB, first task", "cp -r", ("x", 1.5)),
    (
        "W5 unchanged",
        "W5 unchanged, new env (new worker), first task",
        "python start",
        ("s", 0.080),
    ),
    ("W5 one byte", "W5 one byte changed, new worker, first task", "python start", ("s", 0.100)),
    ("W6", "W6 env_vars-only env, first task (after %runtime_env, next cell)", START, ("s", 0.040)),
    ("W6 cold", "W6 the same, no early start", START, None),
    ("W6 at once", "W6 the same, called at once after %runtime_env (same cell)", START, None),
    (
        "W6 fork",
        "W6 alternative: fork from a template with cloudpickle imported (prototype)",
        START,
        None,
    ),
    (
        "W8",
        "W8 missing requirement: time to the error at the caller",
        "uv venv + failing uv pip install",
        ("s", 0.150),
    ),
    (
        "W10 numpy",
        "W10 200 MB numpy array as argument and result, local worker",
        "memcpy of the same bytes",
        ("x", 3.0),
    ),
    (
        "W10 pandas",
        "W10 200 MB pandas DataFrame as argument and result, local worker",
        "memcpy of the same bytes",
        ("x", 3.0),
    ),
    (
        "K1",
        "K1 cached env, first %runtime_env in a fresh kernel of a server",
        "an empty cell in the same kernel",
        ("s", 0.150),
    ),
    ("K1 load_ext", "K1 %load_ext jupyter_runtimeenv in that kernel", "", None),
    (
        "K1 embedded",
        "K1 the same, no server (the agent embedded in the kernel)",
        "an empty cell in the same kernel",
        None,
    ),
    ("K1 embedded load_ext", "K1 %load_ext, no server", "", None),
    ("S1", "S1 server p99 latency while four envs build", "", ("s", 0.020)),
    (
        "M1 agent idle",
        "M1 agent RSS over the bare server, idle",
        "bare jupyter server RSS",
        ("mb", 30),
    ),
    (
        "M1 agent after W3",
        "M1 agent RSS over the bare server, after four builds",
        "bare jupyter server RSS",
        ("mb", 30),
    ),
    ("M1 processes after W4", "M1 all processes after W4, idle (RSS)", "", None),
]


def peer_venv(name: str) -> Path:
    """``benchmarks/.peers/<name>``, made once: a venv (with pip, which Dask's
    ``PipInstall`` and Ray's pip envs run) and the peer's packages, installed with uv."""
    venv = HERE / ".peers" / name
    python = venv / "bin" / "python"
    if not (venv / ".complete").exists():
        progress(f"making {venv} ({', '.join(PEERS[name])} from the package index) ...")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        argv = [uv_bin(), "pip", "install", "-q", "--python", str(python), *PEERS[name]]
        subprocess.run(argv, check=True)
        (venv / ".complete").touch()
    return python


def run_peer(name: str, config: dict[str, Any], tmp: Path, timeout: float) -> dict[str, Any]:
    """Run ``peer_<name>.py`` in its venv, its progress lines forwarded as they come; what
    it did not measure (it failed, or ran out of ``timeout``) says why."""
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(config))
    argv = [str(peer_venv(name)), str(HERE / f"peer_{name}.py"), str(path)]
    progress(f"{name}: running the workloads")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(HERE)}
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp,
        start_new_session=True,  # its cluster's processes can be ended with it
    )  # fmt: skip
    lines: list[str] = []
    tail: collections.deque[str] = collections.deque(maxlen=1)

    def forward() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line[:1] == "[":
                sys.stderr.write(f"  {line}")
            elif line.strip():
                tail.append(line.strip())

    readers = [
        threading.Thread(target=forward, daemon=True),
        threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True),
    ]
    for reader in readers:
        reader.start()
    error = None
    try:
        if proc.wait(timeout) != 0:
            error = f"runner failed: {(tail or ['no output'])[-1][:120]}"
    except subprocess.TimeoutExpired:
        error = f"not reached in {timeout:.0f} s"
        _kill_tree(proc)
    for reader in readers:
        reader.join(10)
    peer: dict[str, Any] = {"version": "?", "results": {}}
    for line in lines:
        if line.startswith("{"):
            item = json.loads(line)
            if "version" in item:
                peer["version"] = item["version"]
            else:
                peer["results"][item["key"]] = item["result"]
    if error is not None:  # what it measured stands; the rest says why it is missing
        peer["error"] = error
    return peer


def _kill_tree(proc: subprocess.Popen[str]) -> None:
    """End a runner cut short and every process below it (a cluster's daemons too)."""
    below = descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


# -- rendering -------------------------------------------------------------------------------


def fmt(value: float, unit: str) -> str:
    if unit == "tasks/s":
        return f"{value:,.0f}/s"
    if unit == "MB":
        return f"{value:.1f} MB"
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 0.01:
        return f"{value * 1000:.0f} ms"
    return f"{value * 1000:.2g} ms" if value >= 0.001 else f"{value * 1000:.3f} ms"


def cell(result: Result | None, spread: bool = True) -> str:
    if result is None:
        return "—"
    if "na" in result:
        return f"n/a: {result['na']}"
    text = fmt(result["median"], result["unit"])
    if spread and result["n"] > 1:
        text += f" ({fmt(result['min'], result['unit'])}-{fmt(result['max'], result['unit'])})"
    if "names" in result:
        text += ", names it" if result["names"] else ", does NOT name it"
    return text


def ratio(ours: Result, floor: Result | None) -> float | None:
    if floor is None or "na" in ours or "na" in floor or not floor["median"]:
        return None
    if ours["unit"] == "MB":
        return None
    return float(ours["median"] / floor["median"])


def verdict(key: str, ours: Result, rate: float | None, target: tuple[str, float]) -> str:
    kind, bound = target
    value = ours.get("median")
    if kind == "x":
        text, ok = f"≤ {bound}x", rate is not None and rate <= bound
    elif kind == "s":
        text, ok = f"≤ {fmt(bound, 's')}", value is not None and value <= bound
    elif kind == "rate":
        text, ok = f"≥ {bound:,.0f}/s", value is not None and value >= bound
    else:
        text, ok = f"≤ {bound:.0f} MB", value is not None and value <= bound
    if key == "W8" and not ours.get("names"):
        ok = False
    return f"{text} {'met' if ok else '**missed**'}"


def peer_cell(key: str, ours: Result, peer: dict[str, Any]) -> str:
    if key in OURS_ONLY:
        return "—"
    result = peer["results"].get(key)
    if result is None:
        return f"n/a: {peer['error']}" if "error" in peer else "—"
    text = cell(result, spread=False)
    if "na" in result or "na" in ours or not ours["median"]:
        return text
    slower = (
        ours["median"] / result["median"]
        if result["unit"] == "tasks/s"
        else result["median"] / ours["median"]
    )
    text += f" ({slower:.1f}x)" if slower < 10 else f" ({slower:.0f}x)"
    if key in TARGETS_5X and slower < 5:
        text += " **<5x**"
    return text


def table(data: dict[str, Any]) -> str:
    peers = data["peers"]
    head = ["workload", "ours: median (min-max)", "floor", "ratio", "target"]
    head += [f"{name.capitalize()} {peer['version']}" for name, peer in peers.items()]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, label, floor_label, target in ROWS:
        ours = data["ours"].get(key)
        if ours is None:
            continue
        floor = data["floors"].get(key)
        rate = ratio(ours, floor)
        floor_text = f"{cell(floor, spread=False)} ({floor_label})" if floor else floor_label
        row = [
            label,
            cell(ours),
            floor_text or "—",
            "—" if rate is None else f"{rate:.2f}x",
            "—" if target is None else verdict(key, ours, rate, target),
        ]
        row += [peer_cell(key, ours, peer) for peer in peers.values()]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs of everything")
    parser.add_argument("--peers", action="store_true", help="run Ray and Dask too")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every number here")
    parser.add_argument("--scaling", action="store_true", help="the scaling curves instead")
    parser.add_argument(
        "--curve", action="append", choices=list(bench_scaling.CURVES), help="with --scaling"
    )
    parser.add_argument("--chart", type=Path, metavar="PNG", help="with --scaling: the chart")
    args = parser.parse_args()
    if args.scaling:
        scaling_main(args)
        return
    compile_package()
    started, load = time.time(), os.getloadavg()
    reps = REPS["quick" if args.quick else "full"]
    wh = wheelhouse()
    with tempfile.TemporaryDirectory(prefix="jre-bench-run-") as name:
        tmp = Path(name)
        progress("making the working_dir tree (1,000 files, 20 MB)")
        trees = {who: make_tree(tmp / f"tree-{who}") for who in ("ours", *PEERS)}
        ours = Ours(tmp / "ours", wh, trees["ours"], reps)
        ours.tmp.mkdir()
        ours.run()
        peers: dict[str, Any] = {}
        if args.peers:
            peer_reps = {k: min(v, PEER_CAPS.get(k, v)) for k, v in reps.items()}
            for peer, share in zip(PEERS, (0.65, 1.0), strict=True):
                # What is left of the budget: Ray gets 65 % of it, Dask the rest.
                left = BUDGET - (time.time() - started) - 30
                config = {"wheelhouse": str(wh), "tree": str(trees[peer]), "reps": peer_reps}
                peers[peer] = run_peer(peer, config, tmp, timeout=max(60.0, left * share))
    data = result_data(started, load, args.quick, ours.results, ours.floors, peers)
    print(table(data))
    print(
        f"\n{data['date']}, {data['seconds']:.0f} s, {os.cpu_count()} cpus, "
        f"load average {load[0]:.1f} at start and {data['machine']['loadavg_end'][0]:.1f} "
        f"at the end; peers: x = how many times slower than ours"
    )
    if args.json:
        args.json.write_text(json.dumps(data, indent=1))


#: The keys of ``--json`` that every run keeps (issue 19 item 7), so runs stay comparable.
JSON_KEYS = ("date", "seconds", "quick", "machine", "ours", "floors", "peers")


def result_data(
    started: float,
    load: tuple[float, float, float],
    quick: bool,
    ours: dict[str, Result],
    floors: dict[str, Result],
    peers: dict[str, Any],
) -> dict[str, Any]:
    """What ``--json`` writes: ``JSON_KEYS``; each result keeps ``median`` (``min``, ``max``,
    ``n``, ``unit``) or says why it is missing (``na``)."""
    for key, result in [*ours.items(), *floors.items()]:
        if "median" not in result and "na" not in result:
            raise ValueError(f"{key}: a result without a median")
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "quick": quick,
        "machine": machine(load),
        "ours": ours,
        "floors": floors,
        "peers": peers,
    }


def machine(load: tuple[float, float, float]) -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "loadavg_start": load,
        "loadavg_end": os.getloadavg(),
    }


def scaling_main(args: argparse.Namespace) -> None:
    started, load = time.time(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="jre-bench-scaling-") as name:
        scaling = bench_scaling.run(Path(name), args.quick, args.curve)
    data = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "quick": args.quick,
        "machine": machine(load),
        "scaling": scaling,
        "growth": {name: bench_scaling.growth(rows) for name, rows in scaling.items()},
    }
    end = data["machine"]["loadavg_end"][0]
    footer = (
        f"{data['date']}, {data['seconds']:.0f} s, {os.cpu_count()} cpus, load average "
        f"{load[0]:.1f} at start and {end:.1f} at the end"
    )
    print(bench_scaling.table(scaling))
    print(f"\n{footer}")
    chart = args.chart or (args.json.with_suffix(".png") if args.json else Path("scaling.png"))
    bench_scaling.chart(scaling, chart, f"jupyter-runtimeenv scaling: {footer}")
    print(f"chart: {chart}")
    if args.json:
        args.json.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
