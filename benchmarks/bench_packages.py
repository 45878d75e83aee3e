"""Package plugins against their floors, measured in the same run.

    .venv/bin/python benchmarks/bench_packages.py [--reps 5]

Network: at start, six, attrs, packaging and numpy wheels are fetched once with
``pip download`` into the wheelhouse ``benchmarks/.wheelhouse`` (``$JRE_BENCH_WHEELHOUSE``,
see ``_common.wheelhouse``); every install after that is ``--no-index --find-links`` that
wheelhouse, for the floors and for us alike.
The tests never use the network; this script is not a test.

Rows (medians of ``--reps`` runs; ratio = ours / floor):

- pip small set, uv cache cold / warm, and numpy (warm): ``agent.get_or_create`` of a
  fresh env plus importing the packages in its python, against the floor ``uv venv`` +
  ``uv pip install`` + the same imports, with the same cache state. Target: ratio <= 1.5.
- working_dir of 1,000 files / 20 MB: first build, unchanged (a new request for the same
  directory: parse + hash + cache hit), one byte changed; against hashing every file and
  copying the tree with plain Python. Targets: unchanged <= 30 ms, one byte <= 60 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import NUMPY, SMALL, hash_and_copy, make_tree, wheelhouse

from jupyter_runtimeenv.agent import RuntimeEnvAgent
from jupyter_runtimeenv.plugins import _hashing
from jupyter_runtimeenv.plugins._uv import uv_bin


def imports_argv(python: str, packages: list[str]) -> list[str]:
    return [python, "-c", "import " + ", ".join(packages)]


def floor_env(
    tmp: Path,
    cache: Path,
    packages: list[str],
    fails: bool = False,
    modules: list[str] | None = None,
) -> float:
    """uv venv + uv pip install + imports (``modules``, default the packages' names): the
    least any tool can do. With ``fails``, an install expected to fail (a missing package):
    uv venv + the failing install."""
    venv = tmp / f"floor-{time.monotonic_ns()}"
    env = {**os.environ, "UV_CACHE_DIR": str(cache), "UV_LINK_MODE": "hardlink"}
    start = time.perf_counter()
    subprocess.run(
        [uv_bin(), "venv", "-q", str(venv), "--python", sys.executable], env=env, check=True
    )
    python = str(venv / "bin" / "python")
    install = [uv_bin(), "pip", "install", "-q", "--python", python, *packages]
    done = subprocess.run(install, env=env, capture_output=fails)
    if fails == (done.returncode == 0):
        raise SystemExit(f"{install}: exit code {done.returncode}")
    if not fails:
        subprocess.run(imports_argv(python, modules or packages), check=True)
    elapsed = time.perf_counter() - start
    shutil.rmtree(venv)
    return elapsed


async def ours_env(agent: RuntimeEnvAgent, packages: list[str]) -> float:
    start = time.perf_counter()
    ctx = await agent.get_or_create({"pip": packages}, "bench")
    proc = await asyncio.create_subprocess_exec(*imports_argv(ctx.python, packages))
    assert await proc.wait() == 0
    elapsed = time.perf_counter() - start
    await agent.remove(ctx.env_id, force=True)  # the next run builds the venv again
    return elapsed


def median(samples: list[float]) -> float:
    return statistics.median(samples)


async def timed(reps: int, run: Callable[[], Any]) -> float:
    samples = []
    for _ in range(reps):
        result = run()
        samples.append(await result if asyncio.iscoroutine(result) else result)
    return median(samples)


async def main(reps: int) -> None:
    wh = wheelhouse()
    for var, value in {"UV_NO_INDEX": "1", "UV_FIND_LINKS": str(wh)}.items():
        os.environ[var] = value
    rows: list[tuple[str, float, float, str]] = []
    with tempfile.TemporaryDirectory(prefix="jre-bench-") as tmp_name:
        tmp = Path(tmp_name)
        counter = iter(range(10**6))

        def fresh(name: str) -> Path:
            path = tmp / f"{name}-{next(counter)}"
            path.mkdir()
            return path

        # -- pip, uv cache cold: a new cache for every run, ours and the floor's.
        async def ours_cold(packages: list[str]) -> float:
            async with RuntimeEnvAgent(fresh("agent")) as agent:
                return await ours_env(agent, packages)

        floor = await timed(reps, lambda: floor_env(tmp, fresh("uvcache"), SMALL))
        ours = await timed(reps, lambda: ours_cold(SMALL))
        rows.append(("pip six+attrs+packaging, uv cache cold", ours, floor, "<= 1.5x"))

        # -- pip, uv cache warm: one cache kept across runs (warmed once first).
        warm_floor_cache = fresh("uvcache")
        floor_env(tmp, warm_floor_cache, SMALL + NUMPY)
        async with RuntimeEnvAgent(fresh("agent")) as agent:
            await ours_env(agent, SMALL + NUMPY)  # warms shared/uv
            for label, packages in (("six+attrs+packaging", SMALL), ("numpy", NUMPY)):
                floor = await timed(reps, lambda p=packages: floor_env(tmp, warm_floor_cache, p))
                ours = await timed(reps, lambda p=packages: ours_env(agent, p))
                rows.append((f"pip {label}, uv cache warm", ours, floor, "<= 1.5x"))

        # -- working_dir: 1,000 files, 20 MB.
        src = make_tree(fresh("tree"))
        floor = await timed(reps, lambda: hash_and_copy(src, tmp / "copy"))

        async def wd_first() -> float:
            _hashing.forget_stat_cache()  # as in a new process
            async with RuntimeEnvAgent(fresh("agent")) as agent:
                start = time.perf_counter()
                await agent.get_or_create({"working_dir": str(src)}, "bench")
                return time.perf_counter() - start

        rows.append(("working_dir 1000 files/20 MB, first", await timed(reps, wd_first), floor, ""))
        async with RuntimeEnvAgent(fresh("agent")) as agent:
            await agent.get_or_create({"working_dir": str(src)}, "bench")

            async def wd_again() -> float:
                start = time.perf_counter()
                await agent.get_or_create({"working_dir": str(src)}, "bench")
                return time.perf_counter() - start

            rows.append(("working_dir unchanged", await timed(reps, wd_again), floor, "<= 30 ms"))
            victim = next(src.rglob("*.bin"))

            async def wd_one_byte() -> float:
                data = bytearray(victim.read_bytes())
                data[0] = (data[0] + 1) % 256
                victim.write_bytes(bytes(data))
                return await wd_again()

            rows.append(
                ("working_dir one byte changed", await timed(reps, wd_one_byte), floor, "<= 60 ms")
            )

    print()
    print(f"{'scenario':44} {'ours':>10} {'floor':>10} {'ratio':>7}  target")
    for name, ours_s, floor_s, target in rows:
        print(
            f"{name:44} {ours_s * 1000:8.1f}ms {floor_s * 1000:8.1f}ms"
            f" {ours_s / floor_s:6.2f}x  {target}"
        )
    print(
        f"\n(medians of {reps} runs; floors: uv venv + uv pip install + imports, "
        "and sha256 + shutil.copytree of the tree)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    asyncio.run(main(parser.parse_args().reps))
