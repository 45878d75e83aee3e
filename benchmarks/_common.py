"""Helpers shared by the benchmark scripts and by the peer runners.

Standard library only: ``peer_ray.py`` and ``peer_dask.py`` import this module from their
own venvs (``benchmarks/.peers/``), where this package is not installed. A result is a dict:
``{"median", "min", "max", "n", "unit"}`` (seconds unless ``unit`` says otherwise), or
``{"na": reason}`` for a workload a tool cannot do; extra keys (``"names"``) ride along.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SMALL = ["six", "attrs", "packaging"]
NUMPY = ["numpy"]
#: W9: real data-science packages as users install them (their dependencies come along).
DATA = ["pandas", "scikit-learn"]
DATA_MODULES = ["pandas", "sklearn"]
#: The four different pip envs of W3 (each run adds its own ``>=0.0.N`` pin: new envs).
FOUR = [["six"], ["attrs"], ["packaging"], ["six", "attrs"]]
MISSING = "jre-no-such-package-zzz"
PAUSE = 0.5  # seconds between a notebook's %runtime_env cell and its next cell

Result = dict[str, Any]


class Emitted(dict[str, Result]):
    """A peer's results, each printed on stdout as one JSON line the moment it is set, so a
    runner cut short (``run.py``'s time limit) still hands over what it measured."""

    def __init__(self, version: str) -> None:
        super().__init__()
        print(json.dumps({"version": version}), flush=True)

    def __setitem__(self, key: str, value: Result) -> None:
        super().__setitem__(key, value)
        print(json.dumps({"key": key, "result": value}), flush=True)

    def update(self, other: Any = (), /, **kwargs: Any) -> None:
        for key, value in dict(other, **kwargs).items():
            self[key] = value


def progress(message: str) -> None:
    """One progress line on stderr (stdout carries the table, or a peer's JSON)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def stats(samples: list[float], unit: str = "s", **extra: Any) -> Result:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "n": len(samples),
        "unit": unit,
        **extra,
    }


def na(reason: str) -> Result:
    return {"na": reason}


def timed(func: Callable[[], object]) -> float:
    start = time.perf_counter()
    func()
    return time.perf_counter() - start


def repeat(reps: int, run: Callable[[int], float]) -> list[float]:
    """``run(i)`` for each repetition ``i``, returning the seconds it measured."""
    return [run(i) for i in range(reps)]


def in_turns(
    reps: int, ours: Callable[[int], float], floor: Callable[[int], float]
) -> tuple[Result, Result]:
    """``reps`` pairs of ``ours(i)`` and ``floor(i)`` back to back, which goes first
    alternating pair by pair: rows whose seconds move with the load (installs, cold imports of
    pandas and scikit-learn: ±1.5 s on this VM) meet the same moment as their floor.
    Returns (ours, floor) as ``stats``."""
    mine: list[float] = []
    theirs: list[float] = []
    for i in range(reps):
        for ours_now in (True, False) if i % 2 else (False, True):
            (mine if ours_now else theirs).append(ours(i) if ours_now else floor(i))
    return stats(mine), stats(theirs)


def pip_workloads(
    who: str,
    w1: Callable[[list[str], list[str], int], float],
    reps: dict[str, int],
    cold: list[str],
    warm: list[str],
) -> dict[str, Result]:
    """A peer's W1 and W1n, cold and warm: ``w1(packages, pip_options, tag)`` builds a new
    env (``pinned`` with ``tag``), runs the import task and returns the seconds taken."""
    out: dict[str, Result] = {}
    for label, packages, runs in (("W1", SMALL, reps["pip"]), ("W1n", NUMPY, reps["numpy"])):
        # No run to warm pip's cache first: from a local wheelhouse it keeps nothing to
        # reuse (no downloads, no built wheels); "warm" runs differ by not passing
        # --no-cache-dir. Each run of a peer costs 5-60 s: the budget has no room for it.
        for state, cache, base in (("cold", cold, 100), ("warm", warm, 200)):
            progress(f"{who} {label} {state}")
            out[f"{label} {state}"] = stats(
                repeat(runs, lambda i, p=packages, c=cache, b=base: w1(p, c, b + i))
            )
    return out


def error_runs(runs: int, run: Callable[[int], tuple[float, str | None]]) -> Result:
    """W8: ``run(i)`` returns (seconds to the error, its message or None if none came)."""
    done = [run(i) for i in range(runs)]
    named = all(message is not None and MISSING in message for _, message in done)
    return stats([seconds for seconds, _ in done], names=named)


def pinned(packages: list[str], run: int) -> list[str]:
    """``packages`` plus a pin every version satisfies, distinct per run: a new env (and a
    new pip/uv resource) in every tool, with the same wheels installed."""
    return [*packages, f"{packages[0]}>=0.0.{run}"]


def import_all(names: list[str]) -> int:
    """The task of W1/W3: import the packages in the worker, return the worker's pid."""
    import importlib

    for name in names:
        importlib.import_module(name)
    return os.getpid()


def noop() -> None:
    return None


def count_files(path: str = ".") -> int:
    """The task of W5: count the files of the working dir (the worker's cwd)."""
    return sum(len(files) for _, _, files in os.walk(path))


def make_tree(root: Path, files: int = 1000, total: int = 20 * 2**20) -> Path:
    """``files`` random files in 20 directories, ``total`` bytes, mtimes in the past (as
    any file not just written; past the hash memo's racy window)."""
    size = total // files
    for i in range(files):
        path = root / f"d{i % 20:02d}" / f"f{i:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    old = time.time() - 60
    for path in root.rglob("*.bin"):
        os.utime(path, (old, old))
    return root


def change_one_byte(root: Path) -> None:
    victim = next(iter(sorted(root.rglob("*.bin"))))
    data = bytearray(victim.read_bytes())
    data[0] = (data[0] + 1) % 256
    victim.write_bytes(bytes(data))


def hash_and_copy(src: Path, dest: Path) -> float:
    """Floor: sha256 of every file, then ``shutil.copytree``."""
    start = time.perf_counter()
    for path in sorted(src.rglob("*")):
        if path.is_file():
            hashlib.sha256(path.read_bytes()).hexdigest()
    shutil.copytree(src, dest)
    elapsed = time.perf_counter() - start
    shutil.rmtree(dest)
    return elapsed


def settle() -> None:
    """Write back every dirty page (``sync``) before a timed rep that writes a tree: the
    writeback of what the rep before it wrote (~20 MB for W5) otherwise falls on whichever
    rep comes next, ours or its floor (``cp -r`` of the same tree moved 38-555 ms between
    three quiet runs of session 5)."""
    os.sync()


def cp_r(src: Path, dest: Path) -> float:
    """Floor: a plain ``cp -r`` of the tree."""
    elapsed = timed(lambda: subprocess.run(["cp", "-r", str(src), str(dest)], check=True))
    shutil.rmtree(dest)
    return elapsed


def pipe_rtt(rounds: int, python: str = sys.executable) -> list[float]:
    """Floor: seconds per round trip of one byte through two pipes to a child echo process,
    in ``rounds // 100`` batches of 100."""
    echo = (
        "import os\nwhile True:\n    b = os.read(0, 1)\n    if not b: break\n    os.write(1, b)\n"
    )
    child = subprocess.Popen(
        [python, "-c", echo], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
    )
    assert child.stdin is not None
    assert child.stdout is not None
    w, r = child.stdin.fileno(), child.stdout.fileno()
    for _ in range(100):
        os.write(w, b"x")
        os.read(r, 1)
    batches = []
    for _ in range(max(1, rounds // 100)):
        start = time.perf_counter()
        for _ in range(100):
            os.write(w, b"x")
            os.read(r, 1)
        batches.append((time.perf_counter() - start) / 100)
    child.stdin.close()
    child.wait()
    return batches


def python_start(reps: int, python: str = sys.executable) -> list[float]:
    """Floor: an interpreter start plus ``import cloudpickle``."""
    argv = [python, "-c", "import cloudpickle"]
    return repeat(reps, lambda _i: timed(lambda: subprocess.run(argv, check=True)))


def wheelhouse() -> Path:
    """The wheels every install of every tool uses (``--no-index --find-links``), fetched
    once with ``pip download`` into ``benchmarks/.wheelhouse`` (``$JRE_BENCH_WHEELHOUSE``).

    W9's wheels come twice where this interpreter has other versions than the newest: a
    layered env resolves against the kernel's versions (``pip``'s constraints), which a user
    with an index gets, so the wheelhouse must hold them too (python-dateutil 2.9 here)."""
    where = Path(os.environ.get("JRE_BENCH_WHEELHOUSE") or HERE / ".wheelhouse")
    where.mkdir(parents=True, exist_ok=True)
    names = {p.name.split("-")[0].lower().replace("_", "-") for p in where.glob("*.whl")}
    if not {*SMALL, *NUMPY, *DATA} <= names:
        progress(f"downloading wheels into {where} (pip, from the package index) ...")
        pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:"]
        subprocess.run([*pip, "--dest", str(where), *SMALL, *NUMPY, *DATA], check=True)
        if pins := kernel_pins(where):
            subprocess.run([*pip, "--no-deps", "--dest", str(where), *pins], check=True)
    return where


def compile_package() -> None:
    """Byte-compile this checkout's package, as installing its wheel does: an editable
    checkout run with ``PYTHONDONTWRITEBYTECODE=1`` (this machine's sessions have it)
    compiles every module from source in every new process, 0.2-0.3 s of a CLI command or of
    ``%load_ext`` + ``%runtime_env`` in a fresh kernel that no installed copy pays."""
    import compileall

    import jupyter_runtimeenv

    compileall.compile_dir(Path(jupyter_runtimeenv.__file__).parent, quiet=1)


def kernel_pins(where: Path) -> list[str]:
    """``name==version`` of this interpreter's installed versions of the wheelhouse's
    packages, where they differ from every wheel there."""
    import importlib.metadata

    have: dict[str, set[str]] = {}
    for wheel in where.glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        have.setdefault(name.lower().replace("_", "-"), set()).add(version)
    pins = []
    for name, versions in have.items():
        try:
            mine = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if mine not in versions:
            pins.append(f"{name}=={mine}")
    return pins


# -- memory: resident set sizes from /proc -------------------------------------------------


def rss_mb(pids: list[int]) -> float:
    """Sum of the resident set sizes of ``pids`` (gone ones count 0), in MB."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def descendants(pid: int | None = None) -> list[int]:
    """Every live process below ``pid`` (default: this one)."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
