"""The CLI against plain uv, measured in the same run (issue 19 item 4).

    .venv/bin/python benchmarks/bench_cli.py [--reps 5] [--w9-reps 3] [--base DIR]

``run.py --quick`` takes one sample of each W9 row, and W9 is several seconds of importing
pandas and scikit-learn (compiled from source: uv does not byte-compile, and this machine's
sessions set ``PYTHONDONTWRITEBYTECODE=1``) that move by ±0.5 s from one sample to the next.
This script takes the CLI's part apart, interleaving ours and the floor rep by rep so that a
change of load hits both, and gives each row's wall time (median) and the CPU time of the
processes it ran (user + sys of the children, median), which the load inflates less:

- ``jupyter runtimeenv --help`` through jupyter's own dispatcher: the command line answering.
- ``ready``: ``jupyter-runtimeenv build --json SPEC`` of an env already in the cache: the
  command's start, its imports, parsing the spec, finding the env in the index, printing
  it, exiting (no agent: ``agent/cache_hit.py``); target ≤ 100 ms. The same through
  ``jupyter runtimeenv`` (jupyter_core's dispatcher: a second python, its imports, then an
  exec of ours). Floors: ``python -c pass`` and ``python -c "import asyncio, sqlite3,
  json"`` (what an asyncio command with a sqlite index imports).
- ``W9 build, warm``: the command building a new pandas + scikit-learn env (its own
  ``>=0.0.N`` pin) from the floor's warm uv cache, against ``uv venv`` + ``uv pip install``
  of the same packages with that cache: what the CLI adds to uv.
- ``W9 CLI warm`` / ``W9 CLI cold``: the same plus importing both in the env's python, as
  ``run.py``'s rows (cold: a new, empty uv cache for ours and the floor each rep), against
  ``uv venv`` + ``uv pip install`` + the imports.

``--base DIR``: also run each CLI row with the package of another checkout (``DIR`` first on
``PYTHONPATH``, e.g. ``git worktree add /tmp/base main``), back to back with this one: an A/B
of two versions of the code in the same run. Its package is byte-compiled first, as this
one's is (``compile_package``). Wheels come from ``benchmarks/.wheelhouse`` (``_common.
wheelhouse``); no test runs this script.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import DEVNULL

from _common import DATA, DATA_MODULES, compile_package, pinned, progress, wheelhouse
from bench_packages import imports_argv

from jupyter_runtimeenv.plugins._uv import uv_bin

CLI = str(Path(sys.executable).parent / "jupyter-runtimeenv")
JUPYTER = str(Path(sys.executable).parent / "jupyter")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measured(run: Callable[[], None]) -> tuple[float, float]:
    """Wall seconds and the CPU seconds of the processes ``run`` waited for."""
    cpu, start = children_cpu(), time.perf_counter()
    run()
    return time.perf_counter() - start, children_cpu() - cpu


class Bench:
    def __init__(self, tmp: Path, wheels: Path, base: Path | None) -> None:
        self.tmp, self.wheels = tmp, wheels
        self.versions = {"ours": None, "base": base} if base else {"ours": None}
        self.samples: dict[str, list[tuple[float, float]]] = {}
        self._counter = 0
        os.environ.update(UV_NO_INDEX="1", UV_FIND_LINKS=str(wheels), UV_LINK_MODE="hardlink")
        if base is not None:  # the other checkout's package is the one imported
            where = subprocess.run(
                [sys.executable, "-c", "import jupyter_runtimeenv as j; print(j.__file__)"],
                env=self.environ("base"),
                cwd=tmp,  # not this checkout: -c puts the working directory first
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            if not where.startswith(str(base)):
                raise SystemExit(f"--base {base}: jupyter_runtimeenv is imported from {where}")

    def environ(self, version: str, **more: str) -> dict[str, str]:
        env = {**os.environ, **more}
        base = self.versions[version]
        if base is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(base), env.get("PYTHONPATH")]))
        return env

    def fresh(self, name: str) -> Path:
        self._counter += 1
        path = self.tmp / f"{name}-{self._counter}"
        path.mkdir()
        return path

    def new_root(self) -> Path:
        """A new cache root as any earlier command leaves it (its index, the store's 256
        shard directories: 45-115 ms at load 9, once per machine), made before the clock:
        the notebook rows of ``run.py`` start their agent before theirs too."""
        root = self.fresh("root")
        env = {**os.environ, "JUPYTER_RUNTIMEENV_CACHE": str(root)}
        subprocess.run([CLI, "list"], env=env, check=True, capture_output=True)
        return root

    def add(self, row: str, sample: tuple[float, float]) -> None:
        self.samples.setdefault(row, []).append(sample)

    def spec(self, run: int) -> str:
        options = ["--no-index", "--find-links", str(self.wheels)]
        return json.dumps({"pip": {"packages": pinned(DATA, run), "install_options": options}})

    def cli(self, version: str, spec: str, root: Path, uv: Path, jupyter: bool = False) -> str:
        """``jupyter-runtimeenv build --json SPEC`` (``jupyter``: ``jupyter runtimeenv ...``,
        through jupyter's dispatcher, which starts a python to exec ours); the env's python."""
        env = self.environ(version, JUPYTER_RUNTIMEENV_CACHE=str(root), UV_CACHE_DIR=str(uv))
        command = [JUPYTER, "runtimeenv"] if jupyter else [CLI]
        built = subprocess.run(
            [*command, "build", "--json", spec], env=env, capture_output=True, text=True
        )
        if built.returncode:
            raise SystemExit(f"jupyter-runtimeenv build: {built.stderr.strip()[-2000:]}")
        context = json.loads(built.stdout)["context"]
        return str(context["python"])

    def uv(self, uv: Path) -> str:
        """The floor: ``uv venv`` + ``uv pip install``; the venv's python."""
        venv = self.tmp / f"floor-{time.monotonic_ns()}"
        env = {**os.environ, "UV_CACHE_DIR": str(uv)}
        subprocess.run(
            [uv_bin(), "venv", "-q", str(venv), "--python", sys.executable], env=env, check=True
        )
        python = str(venv / "bin" / "python")
        install = [uv_bin(), "pip", "install", "-q", "--python", python, *DATA]
        subprocess.run(install, env=env, check=True)
        return python

    def ready(self, reps: int) -> None:
        progress("ready: a build of a cached env")
        root, uv = self.new_root(), self.fresh("uv")
        spec = self.spec(1)
        for version in self.versions:
            self.cli(version, spec, root, uv)  # the env is in the cache from now on
        argv = [sys.executable, "-c", "pass"]
        modules = [sys.executable, "-c", "import asyncio, sqlite3, json"]
        help_argv = [JUPYTER, "runtimeenv", "--help"]
        for _ in range(reps):
            for version in self.versions:
                self.add(
                    f"ready {version}", measured(lambda v=version: self.cli(v, spec, root, uv))
                )
                self.add(
                    f"ready {version}, through jupyter's dispatcher",
                    measured(lambda v=version: self.cli(v, spec, root, uv, jupyter=True)),
                )
            self.add("ready floor: python -c pass", measured(lambda: subprocess.run(argv)))
            for version in self.versions:  # the command line's answer, through jupyter's own
                env = self.environ(version)
                self.add(
                    f"jupyter runtimeenv --help: {version}",
                    measured(lambda e=env: subprocess.run(help_argv, env=e, stdout=DEVNULL)),
                )
            self.add(
                "ready floor: + asyncio, sqlite3, json", measured(lambda: subprocess.run(modules))
            )

    def w9(self, reps: int) -> None:
        progress("W9 warm: the floor's cache warmed once")
        warm = self.fresh("uv")
        self.imports(self.uv(warm))
        roots = {version: self.new_root() for version in self.versions}
        for i in range(reps):
            progress(f"W9 rep {i + 1} of {reps}")
            for version, root in roots.items():
                build = self.spec(100 + i)  # a new env each time: its own pin
                self.add(
                    f"W9 build, warm: {version}",
                    measured(lambda v=version, s=build, r=root: self.cli(v, s, r, warm)),
                )
                spec = self.spec(300 + i)
                self.add(
                    f"W9 CLI warm: {version}",
                    measured(
                        lambda v=version, s=spec, r=root: self.imports(self.cli(v, s, r, warm))
                    ),
                )
            self.add(
                "W9 build, warm: floor (uv venv + uv pip install)",
                measured(lambda: self.uv(warm)),
            )
            self.add(
                "W9 CLI warm: floor (uv + imports)", measured(lambda: self.imports(self.uv(warm)))
            )
            for version in self.versions:
                spec, root, cold = self.spec(200 + i), self.new_root(), self.fresh("uv")
                self.add(
                    f"W9 CLI cold: {version}",
                    measured(
                        lambda v=version, s=spec, r=root, c=cold: self.imports(self.cli(v, s, r, c))
                    ),
                )
            cold = self.fresh("uv")
            floor = measured(lambda c=cold: self.imports(self.uv(c)))
            self.add("W9 CLI cold: floor (uv + imports)", floor)

    def imports(self, python: str) -> None:
        subprocess.run(imports_argv(python, DATA_MODULES), check=True)

    def table(self) -> str:
        lines = ["| row | wall: median (min-max) | CPU of its processes: median |", "|---|---|---|"]
        for row, samples in self.samples.items():
            wall = [s[0] for s in samples]
            cpu = [s[1] for s in samples]
            lines.append(
                f"| {row} | {seconds(statistics.median(wall))} ({seconds(min(wall))}-"
                f"{seconds(max(wall))}) | {seconds(statistics.median(cpu))} |"
            )
        return "\n".join(lines)


def seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7, help="reps of the ready rows")
    parser.add_argument("--w9-reps", type=int, default=3, help="reps of the W9 rows")
    parser.add_argument("--base", type=Path, help="another checkout to A/B against")
    parser.add_argument("--skip-w9", action="store_true")
    args = parser.parse_args()
    compile_package()
    if args.base is not None:
        base = args.base.resolve()
        compileall.compile_dir(base / "jupyter_runtimeenv", quiet=1)
    else:
        base = None
    wheels = wheelhouse()
    load = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="jre-bench-cli-") as name:
        bench = Bench(Path(name), wheels, base)
        bench.ready(args.reps)
        if not args.skip_w9:
            bench.w9(args.w9_reps)
    print(bench.table())
    print(
        f"\n{started}, {os.cpu_count()} cpus, load average {load[0]:.1f} at the start and"
        f" {os.getloadavg()[0]:.1f} at the end"
    )


if __name__ == "__main__":
    main()
