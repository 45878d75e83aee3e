"""This project's side of ``run.py``: every workload through the public API, and the floors.

Each workload goes the way a notebook goes: ``remote(f).options(runtime_env=...).remote()``
on a ``LocalExecutor`` whose agent is embedded (``EmbeddedClient``), the agent already up.
"As a notebook" rows (W2b, W6) do what ``%runtime_env`` does — build the env eagerly, make
it the default, ``prestart`` its first worker — then wait ``PAUSE`` (the user moving on to
the next cell) and time the first call; their "no early start" twins time a first call alone.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import _common
import bench_kernel_env
import bench_server_loop
import bench_w10
import cloudpickle
from _common import (
    DATA,
    DATA_MODULES,
    FOUR,
    MISSING,
    NUMPY,
    PAUSE,
    SMALL,
    Result,
    change_one_byte,
    count_files,
    cp_r,
    descendants,
    error_runs,
    hash_and_copy,
    import_all,
    in_turns,
    noop,
    pinned,
    pipe_rtt,
    progress,
    python_start,
    repeat,
    rss_mb,
    settle,
    stats,
    timed,
)
from bench_packages import floor_env, imports_argv

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.agent import RuntimeEnvAgent
from jupyter_runtimeenv.client import EmbeddedClient
from jupyter_runtimeenv.errors import BuildError
from jupyter_runtimeenv.plugins import _hashing
from jupyter_runtimeenv.workers.executor import resolve_for_driver

# The tasks go by value, as the functions of a notebook do (cells are no importable module).
cloudpickle.register_pickle_by_value(_common)


#: The alternative to prestart that issue 12 asks to weigh, as a prototype (not in the
#: product): a template interpreter with cloudpickle imported forks one child per request;
#: the child loads the function, calls it and answers. What a worker would still do after
#: the fork (env vars, cwd, sys.path, the channel) is left out: this is its lower bound.
FORK_TEMPLATE = """
import os, struct, sys, cloudpickle
read, write = sys.stdin.buffer.read, sys.stdout.buffer
while head := read(4):
    blob = read(struct.unpack("!I", head)[0])
    pid = os.fork()
    if pid == 0:
        out = cloudpickle.dumps(cloudpickle.loads(blob)())
        write.write(struct.pack("!I", len(out)) + out)
        write.flush()
        os._exit(0)
    os.waitpid(pid, 0)
"""


def fork_first_results(reps: int) -> list[float]:
    """Seconds from asking a fork template for a new worker to its first result."""
    template = subprocess.Popen(
        [sys.executable, "-c", FORK_TEMPLATE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    blob = cloudpickle.dumps(noop)

    def ask() -> None:
        assert template.stdin is not None
        assert template.stdout is not None
        template.stdin.write(struct.pack("!I", len(blob)) + blob)
        template.stdin.flush()
        size = struct.unpack("!I", template.stdout.read(4))[0]
        assert cloudpickle.loads(template.stdout.read(size)) is None

    try:
        ask()  # the template is up and has imported cloudpickle
        return repeat(reps, lambda _i: timed(ask))
    finally:
        if template.stdin is not None:
            template.stdin.close()
        template.wait(10)


@contextmanager
def uv_cache(path: Path) -> Iterator[None]:
    """The user's uv cache (``$UV_CACHE_DIR``) is ``path`` meanwhile: the agent uses it
    (``plugins/_uv.py``: it is on the cache root's filesystem), as the floor does."""
    before = os.environ.get("UV_CACHE_DIR")
    os.environ["UV_CACHE_DIR"] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("UV_CACHE_DIR", None)
        else:
            os.environ["UV_CACHE_DIR"] = before


class Ours:
    """The workloads, over one scratch directory; ``results`` and ``floors`` fill up."""

    def __init__(self, tmp: Path, wheelhouse: Path, tree: Path, reps: dict[str, int]) -> None:
        self.tmp, self.wh, self.tree, self.reps = tmp, wheelhouse, tree, reps
        self.results: dict[str, Result] = {}
        self.floors: dict[str, Result] = {}
        self._counter = 0
        # The floors' uv calls (``floor_env``) read the wheelhouse from the environment.
        os.environ.update(UV_NO_INDEX="1", UV_FIND_LINKS=str(wheelhouse))

    # -- plumbing ----------------------------------------------------------------------------

    def fresh(self, name: str) -> Path:
        self._counter += 1
        path = self.tmp / f"{name}-{self._counter}"
        path.mkdir(mode=0o700)  # an agent's cache must be owner-only
        return path

    @contextmanager
    def agent(self) -> Iterator[EmbeddedClient]:
        """An embedded agent on a new cache (so a cold uv cache), already started."""
        client = EmbeddedClient(RuntimeEnvAgent(self.fresh("agent")))
        try:
            client.acquire_sync({"env_vars": {"JRE_BENCH": "up"}}, "bench")
            yield client
        finally:
            client.close()

    @contextmanager
    def executor(self, client: EmbeddedClient, **kwargs: Any) -> Iterator[jre.LocalExecutor]:
        executor = jre.LocalExecutor(
            acquire=client.acquire_sync, release=client.release_sync, **kwargs
        )
        jre.init(executor=executor)
        try:
            yield executor
        finally:
            executor.shutdown()
            jre.shutdown()

    def pip(self, packages: list[str]) -> dict[str, Any]:
        options = ["--no-index", "--find-links", str(self.wh)]
        return {"pip": {"packages": packages, "install_options": options}}

    def call(self, function: Callable[..., Any], env: dict[str, Any] | None, *args: Any) -> Any:
        remote = jre.remote(function)
        return (remote.options(runtime_env=env) if env else remote).remote(*args).result(600)

    # -- workloads ---------------------------------------------------------------------------

    def w1(self) -> None:
        r = self.reps
        for label, packages, modules, runs in (
            ("W1", SMALL, SMALL, r["pip"]),
            ("W1n", NUMPY, NUMPY, r["numpy"]),
            ("W9", DATA, DATA_MODULES, r["w9"]),
        ):
            progress(f"ours {label} cold")

            def floor(cache: Path, p: list[str] = packages, m: list[str] = modules) -> float:
                return floor_env(self.tmp, cache, p, modules=m)

            # Cold: a new agent whose uv cache (the user's, as on a machine where uv never
            # ran) is new too; warm: the floor's warm cache, the same files.
            def cold(i: int, p: list[str] = packages, m: list[str] = modules) -> float:
                with uv_cache(self.fresh("uv")), self.agent() as client, self.executor(client):
                    env = self.pip(pinned(p, 100 + i))
                    return timed(lambda: self.call(import_all, env, m))

            self.results[f"{label} cold"], self.floors[f"{label} cold"] = in_turns(
                runs, cold, lambda _i, f=floor: f(self.fresh("uv"))
            )
            if label == "W9":
                progress("ours W9 CLI cold")
                self.cli_rows("W9 CLI cold", self.reps["cli"], 300, lambda: self.fresh("uv"))
            progress(f"ours {label} warm")
            warm_cache = self.fresh("uv")
            floor(warm_cache)
            with uv_cache(warm_cache), self.agent() as client, self.executor(client):
                self.call(import_all, self.pip(pinned(packages, 900)), modules)  # warms up

                def warm(i: int, p: list[str] = packages, m: list[str] = modules) -> float:
                    env = self.pip(pinned(p, 200 + i))
                    return timed(lambda: self.call(import_all, env, m))

                self.results[f"{label} warm"], self.floors[f"{label} warm"] = in_turns(
                    runs, warm, lambda _i, f=floor, c=warm_cache: f(c)
                )
                if label == "W1":
                    self.w2(client)
                    self.w3(client, warm_cache)
            if label == "W9":
                progress("ours W9 CLI warm")
                root, n = self.fresh("cli"), self.reps["cli"]
                self.cli_rows("W9 CLI warm", n, 400, lambda c=warm_cache: c, root)

    def cli_rows(
        self, key: str, runs: int, base: int, cache: Callable[[], Path], root: Path | None = None
    ) -> None:
        """W9 through the CLI, each run right after a run of its floor with the same uv cache
        state (``cache()``: a new one, or the warm one): the seconds of importing pandas and
        scikit-learn from source dominate both and move by ±0.5 s with the load, so a floor
        measured a minute earlier, as the notebook rows' is, says little about one run.

        The cache root (``root``, else a new one per run) is made before the clock starts,
        as any earlier command leaves it (``jupyter runtimeenv list``: the index and the
        store's 256 shard directories, 45-115 ms at load 9, once per machine): the notebook
        rows start their agent, and so make their root, before theirs.

        ``runs`` pairs (5 in ``--quick`` too: one sample of a row that moves by ±5 % decides
        nothing, and single samples of the notebook rows spread over 3.7-4.9 s in one run on
        the EPYC VM of session 13, against a target 10 % above the floor), which of the two
        goes first alternating pair by pair; each row is the median of its samples."""
        roots = [root or self.fresh("cli") for _ in range(runs)]
        for where in set(roots):
            subprocess.run(
                [str(Path(sys.executable).parent / "jupyter-runtimeenv"), "list"],
                env={**os.environ, "JUPYTER_RUNTIMEENV_CACHE": str(where)},
                check=True,
                capture_output=True,
            )
        self.results[key], self.floors[key] = in_turns(
            runs,
            lambda i: self.cli(DATA, DATA_MODULES, base + i, cache(), roots[i]),
            lambda _i: floor_env(self.tmp, cache(), DATA, modules=DATA_MODULES),
        )

    def cli(
        self,
        packages: list[str],
        modules: list[str],
        run: int,
        cache: Path,
        root: Path | None = None,
    ) -> float:
        """``jupyter runtimeenv build --json SPEC`` (a new process, its own agent on ``root``
        or a new cache root), then the imports in the env's python: W9 as a terminal user."""
        spec = json.dumps(self.pip(pinned(packages, run)))
        env = {
            **os.environ,
            "JUPYTER_RUNTIMEENV_CACHE": str(root or self.fresh("cli")),
            "UV_CACHE_DIR": str(cache),
        }
        cli = Path(sys.executable).parent / "jupyter-runtimeenv"
        start = time.perf_counter()
        built = subprocess.run(
            [str(cli), "build", "--json", spec], env=env, capture_output=True, text=True
        )
        if built.returncode:
            raise SystemExit(f"jupyter runtimeenv build: {built.stderr.strip()[-2000:]}")
        python = json.loads(built.stdout)["context"]["python"]
        subprocess.run(imports_argv(python, modules), check=True)
        return time.perf_counter() - start

    def w2(self, client: EmbeddedClient) -> None:
        """Round trips on an idle worker of the W1 env; then that env cached, a new worker."""
        progress("ours W2 / W2b")
        env = self.pip(pinned(SMALL, 200))
        in_env = jre.remote(noop).options(runtime_env=env)  # parsed once, as Ray's is
        in_env.remote().result()
        self.floors["W2"] = stats(pipe_rtt(self.reps["rtt"] * 100))
        self.results["W2"] = stats(
            repeat(self.reps["rtt"], lambda _i: timed(lambda: in_env.remote().result()))
        )
        self.floors["W2b"] = self.floors["W6"] = stats(python_start(self.reps["start"]))
        self.results["W2b"] = stats(repeat(self.reps["start"], lambda _i: self.early(client, env)))
        self.results["W2b cold"] = stats(
            repeat(self.reps["start"], lambda _i: self.late(client, env))
        )
        self.floors["W2b cold"] = self.floors["W6 cold"] = self.floors["W2b"]

    def early(self, client: EmbeddedClient, env: dict[str, Any], pause: float = PAUSE) -> float:
        """What ``%runtime_env`` does (eager build, default, prestart), then the next cell's
        call ``pause`` seconds later."""
        with self.executor(client):
            spec = jre.parse(env)
            client.acquire_sync(resolve_for_driver(spec), "magic")
            jre.init(runtime_env=spec)
            jre.prestart()
            time.sleep(pause)
            elapsed = timed(lambda: self.call(noop, None))
            client.release_sync(resolve_for_driver(spec).env_id, "magic")
            return elapsed

    def late(self, client: EmbeddedClient, env: dict[str, Any]) -> float:
        with self.executor(client):
            return timed(lambda: self.call(noop, env))

    def w3(self, client: EmbeddedClient, warm_cache: Path) -> None:
        progress("ours W3")

        def floor(_i: int) -> float:
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                return timed(
                    lambda: list(pool.map(lambda p: floor_env(self.tmp, warm_cache, p), FOUR))
                )

        self.floors["W3"] = stats(repeat(self.reps["w3"], floor))

        def ours(i: int) -> float:
            def run() -> None:
                envs = [self.pip(pinned(p, 300 + i)) for p in FOUR]
                futures = [
                    jre.remote(import_all).options(runtime_env=e).remote(p)
                    for e, p in zip(envs, FOUR, strict=True)
                ]
                jre.get(futures, timeout=600)

            return timed(run)

        self.results["W3"] = stats(repeat(self.reps["w3"], ours))

    def w4(self) -> None:
        progress("ours W4")
        with self.agent() as client, self.executor(client, max_workers=2):
            f = jre.remote(noop)
            jre.get([f.remote() for _ in range(200)])

            def burst(_i: int) -> float:
                return 1000 / timed(lambda: jre.get([f.remote() for _ in range(1000)]))

            self.results["W4 throughput"] = stats(repeat(self.reps["burst"], burst), "tasks/s")
            self.floors["W4 round trip"] = stats(pipe_rtt(10_000))
            floor = self.floors["W4 round trip"]
            self.floors["W4 throughput"] = {
                **stats([1 / floor["median"]], "tasks/s"),
                "min": 1 / floor["max"],
                "max": 1 / floor["min"],
            }
            self.results["W4 round trip"] = stats(
                repeat(100, lambda _i: timed(lambda: f.remote().result()))
            )
            workers = descendants()
            self.results["M1 processes after W4"] = stats(
                [rss_mb(workers)], "MB", note=f"{len(workers)} workers; the agent: M1 agent"
            )

    def w5(self) -> None:
        progress("ours W5")
        tree = self.tree
        env = {"working_dir": str(tree)}

        def first() -> float:
            _hashing.forget_stat_cache()  # a tree never seen, as in a new kernel
            with self.agent() as client, self.executor(client):
                settle()
                return timed(lambda: self.call(count_files, env))

        def cp() -> float:
            settle()
            return cp_r(tree, self.tmp / "cp")

        # Ours and its floors rep by rep, each after a sync (``settle``), in turns: all meet
        # the same page cache and writeback, whatever the rows before left.
        times: dict[str, list[float]] = {"ours": [], "cp -r": [], "hash+copy": []}
        for i in range(self.reps["wd"]):
            for who in ("cp -r", "ours") if i % 2 == 0 else ("ours", "cp -r"):
                times[who].append(cp() if who == "cp -r" else first())
            settle()
            times["hash+copy"].append(hash_and_copy(tree, self.tmp / "copy"))
        self.floors["W5 first"] = stats(times["cp -r"])
        self.floors["W5 hash+copy"] = stats(times["hash+copy"])
        self.results["W5 first"] = stats(times["ours"])
        self.floors["W5 unchanged"] = self.floors["W5 one byte"] = self.floors["W2b"]
        with self.agent() as client:
            with self.executor(client):
                self.call(count_files, env)

            def again(_i: int, change: bool = False) -> float:
                if change:
                    change_one_byte(tree)
                with self.executor(client):  # a new pool, so a new worker
                    return timed(lambda: self.call(count_files, env))

            self.results["W5 unchanged"] = stats(repeat(self.reps["wd"], again))
            self.results["W5 one byte"] = stats(
                repeat(self.reps["wd"], lambda i: again(i, change=True))
            )

    def w6_w8(self) -> None:
        progress("ours W6 / W8")
        with self.agent() as client:

            def unique() -> dict[str, Any]:
                return {"env_vars": {"JRE_BENCH_RUN": uuid.uuid4().hex}}

            self.results["W6"] = stats(
                repeat(self.reps["start"], lambda _i: self.early(client, unique()))
            )
            self.results["W6 cold"] = stats(
                repeat(self.reps["start"], lambda _i: self.late(client, unique()))
            )
            self.results["W6 at once"] = stats(
                repeat(self.reps["start"], lambda _i: self.early(client, unique(), pause=0))
            )
            self.floors["W6 at once"] = self.floors["W6 fork"] = self.floors["W6"]
            self.results["W6 fork"] = stats(fork_first_results(self.reps["start"]))

            def missing(i: int) -> tuple[float, str | None]:
                env = self.pip([MISSING, f"six>=0.0.{400 + i}"])
                with self.executor(client):
                    start = time.perf_counter()
                    try:
                        self.call(noop, env)
                    except BuildError as exc:
                        return time.perf_counter() - start, str(exc)
                    return time.perf_counter() - start, None

            self.results["W8"] = error_runs(self.reps["w8"], missing)
            cache = self.fresh("uv")
            self.floors["W8"] = stats(
                repeat(
                    self.reps["w8"],
                    lambda _i: floor_env(self.tmp, cache, [MISSING], fails=True),
                )
            )

    def s1_m1(self) -> None:
        """The server's latency while four envs build, and the agent's memory in it."""
        progress("ours S1 / M1")
        rss: dict[str, list[float]] = {"idle": [], "built": []}

        def measure(moment: str, pid: int) -> None:
            rss[moment].append(rss_mb([pid]))

        latencies: list[float] = []
        for _ in range(self.reps["s1"]):
            latencies.extend(bench_server_loop.one_round(4, measure))
        ms = sorted(latencies)
        p99 = ms[max(0, int(len(ms) * 0.99) - 1)]
        self.results["S1"] = stats([p99], note=f"p99 of {len(ms)} GET status calls")
        bare = [bench_server_loop.idle_rss(extension=False) for _ in range(self.reps["s1"])]
        self.floors["M1 agent idle"] = self.floors["M1 agent after W3"] = stats(bare, "MB")
        base = min(bare)
        self.results["M1 agent idle"] = stats([x - base for x in rss["idle"]], "MB")
        self.results["M1 agent after W3"] = stats([x - base for x in rss["built"]], "MB")

    def w10(self) -> None:
        progress("ours W10")
        data = bench_w10.run(self.tmp, self.wh, self.reps["w10"])
        for label in ("numpy", "pandas"):
            self.results[f"W10 {label}"] = stats(data[label])
            self.floors[f"W10 {label}"] = stats(data[f"{label} floor"])

    def k1(self) -> None:
        """The first ``%runtime_env`` of a cached env in a fresh kernel (issue 19 item 5)."""
        progress("ours K1")
        data = bench_kernel_env.run(self.tmp / "k1", self.reps["start"])
        for key, who in (("K1", "server"), ("K1 embedded", "embedded")):
            self.results[key] = stats(data[f"{who} runtime_env"])
            self.floors[key] = stats(data[f"{who} empty cell"])
            self.results[f"{key} load_ext"] = stats(data[f"{who} load_ext"])

    def run(self) -> None:
        for step in (self.w1, self.w4, self.w5, self.w6_w8, self.w10, self.k1, self.s1_m1):
            step()
        shutil.rmtree(self.tmp / "cp", ignore_errors=True)
