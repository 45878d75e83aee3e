"""The edges of a Dask session: a cluster of its own that closes with nothing left behind,
a node lost mid-task, a scheduler address instead of a client, and no ``distributed``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import processes
import psutil
import pytest
from processes import alive, descendants

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.errors import BrokenWorker

distributed = pytest.importorskip("distributed")


@pytest.fixture
def own_cluster() -> Iterator[Any]:
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
    )
    try:
        yield cluster
    finally:
        cluster.close()


def test_cluster_closes_with_no_process_left_behind(own_cluster: Any, tmp_path: Path):
    from jupyter_runtimeenv.dask import DaskExecutor
    from jupyter_runtimeenv.dask.node_ops import node_info

    client = distributed.Client(own_cluster, set_as_default=False)
    executor = DaskExecutor(
        client,
        node_cache_dir=str(tmp_path / "node-{name}"),
        driver_cache_dir=tmp_path / "driver",
    )
    env = jre.parse({"env_vars": {"MODE": "x"}})
    futures = [
        executor.submit(time.sleep, (0.5,), {}, runtime_env=env, name="nap") for _ in range(4)
    ]
    for future in futures:
        future.result(120)
    env_workers = [pid for info in client.run(node_info).values() for pid in info["pids"]]
    dask_workers = list(client.run(os.getpid).values())
    assert env_workers
    # The cluster's processes: the Dask workers (their nannies live in this process) and
    # everything below them.
    spawned = set(dask_workers)
    for pid in dask_workers:
        spawned |= {p.pid for p in descendants(pid)}
    assert set(env_workers) <= spawned

    executor.shutdown()
    client.close()
    own_cluster.close()
    deadline = time.monotonic() + 30
    while (alive := [p for p in spawned if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive, f"left behind: {[_describe(p) for p in alive]}"


def test_a_node_lost_mid_task_is_a_broken_worker(own_cluster: Any, tmp_path: Path):
    from jupyter_runtimeenv.dask import DaskExecutor

    client = distributed.Client(own_cluster, set_as_default=False)
    executor = DaskExecutor(client, node_cache_dir=str(tmp_path / "node-{name}"))
    try:
        marker = tmp_path / "started"
        env = jre.parse({})
        future = executor.submit(
            _write_pid_and_hang, (str(marker),), {}, runtime_env=env, name="hang"
        )
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert time.monotonic() < deadline, "the task never started"
            time.sleep(0.05)
        env_worker, child = (processes.of(int(pid)) for pid in marker.read_text().split())
        node = psutil.Process(env_worker.pid).parent()  # the Dask worker that runs the node
        assert node is not None
        address = next(a for a, pid in client.run(os.getpid).items() if pid == node.pid)
        # Everything the node started: its environment workers, the task's child, and the
        # template its workers are forked from (``workers/zygote.py``) when it has one.
        below = [p for d in descendants(node.pid) if (p := processes.Proc.of(d.pid))]
        node.kill()
        node.wait(30)
        # Issue 17 item 4: its environment worker, and what its task started, are gone
        # within 2 s (the worker's parent-death watchdog), the call still running.
        alive = processes.survivors([env_worker, child, *below], 2.0)
        processes.kill_all(alive)
        assert alive == [], [p.describe() for p in alive]
        with pytest.raises(BrokenWorker) as info:
            future.result(60)
        assert f"Dask worker {address} was lost" in str(info.value)
    finally:
        executor.shutdown()
        client.close()


def test_a_node_lost_with_several_calls_fails_each_of_them_and_leaves_nothing(tmp_path: Path):
    """A node (Dask worker) with three threads runs three calls, each in an environment
    worker of its own (a node never pipelines: ``Habits.short`` of a raw task is false),
    and is SIGKILLed: each of its calls fails with ``BrokenWorker`` naming it, none hangs,
    and none of its processes stays (issue 19 item 3: a death fails exactly the calls it
    held)."""
    from jupyter_runtimeenv.dask import DaskExecutor

    cluster = distributed.LocalCluster(
        n_workers=1,
        threads_per_worker=3,
        processes=True,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
    )
    client = distributed.Client(cluster, set_as_default=False)
    executor = DaskExecutor(client, node_cache_dir=str(tmp_path / "node-{name}"))
    try:
        env = jre.parse({})
        markers = [tmp_path / f"started{i}" for i in range(3)]
        futures = [
            executor.submit(_write_pid_and_hang, (str(m),), {}, runtime_env=env, name=f"h{i}")
            for i, m in enumerate(markers)
        ]
        deadline = time.monotonic() + 120
        while not all(m.exists() for m in markers):
            assert time.monotonic() < deadline, "the calls never all started"
            time.sleep(0.05)
        pids = [[int(pid) for pid in m.read_text().split()] for m in markers]
        env_workers = [processes.of(worker) for worker, _ in pids]
        children = [processes.of(child) for _, child in pids]
        (node,) = {psutil.Process(w.pid).parent() for w in env_workers}
        assert node is not None
        (address,) = client.run(os.getpid)
        below = [p for d in descendants(node.pid) if (p := processes.Proc.of(d.pid))]
        node.kill()
        node.wait(30)
        alive = processes.survivors([*env_workers, *children, *below], 2.0)
        processes.kill_all(alive)
        assert alive == [], [p.describe() for p in alive]
        for future in futures:
            with pytest.raises(BrokenWorker, match=f"Dask worker {address} was lost"):
                future.result(60)
    finally:
        executor.shutdown()
        client.close()
        cluster.close()


def test_nodes_that_join_later_get_the_environment(own_cluster: Any, tmp_path: Path):
    from jupyter_runtimeenv.dask import DaskExecutor

    client = distributed.Client(own_cluster, set_as_default=False)
    executor = DaskExecutor(client, node_cache_dir=str(tmp_path / "node-{name}"))
    try:
        work = tmp_path / "work"
        work.mkdir()
        (work / "note.txt").write_text("shipped once")
        env = jre.parse({"working_dir": str(work)})
        executor.prepare(env)
        before = client.run(os.getpid)
        # Two new nodes join (with the plugin, without the env); the old ones leave gracefully.
        # Not client.restart(): under load its nanny kill timeout (4 s) restarted a worker a
        # second time, losing the task's worker mid-test.
        own_cluster.scale(4)
        client.wait_for_workers(4, timeout=120)
        client.retire_workers(workers=list(before), close_workers=True)
        deadline = time.monotonic() + 120
        while set(client.scheduler_info()["workers"]) & set(before):
            assert time.monotonic() < deadline, "the old nodes never left"
            time.sleep(0.1)
        after = client.run(os.getpid)
        assert len(after) == 2
        assert set(after.values()).isdisjoint(before.values())
        future = executor.submit(_read, ("note.txt",), {}, runtime_env=env, name="read")
        assert future.result(120) == "shipped once"
    finally:
        executor.shutdown()
        client.close()


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def test_init_with_a_scheduler_address(own_cluster: Any):
    jre.init(
        runtime_env={"env_vars": {"MODE": "by-address"}}, executor=own_cluster.scheduler_address
    )
    try:

        @jre.remote
        def mode() -> str:
            return os.environ["MODE"]

        assert jre.get(mode.remote(), timeout=120) == "by-address"
    finally:
        jre.shutdown()  # the session made the executor and its client: both close


def test_without_distributed_one_clear_error(tmp_path: Path):
    # distributed is installed here; a None entry in sys.modules makes importing it fail
    # exactly as when it is absent.
    script = textwrap.dedent(
        """
        import sys
        sys.modules["distributed"] = None
        import jupyter_runtimeenv as jre
        try:
            jre.init(executor="tcp://127.0.0.1:8786")
        except ImportError as exc:
            print("ERROR:", exc)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "ERROR: running remote functions on Dask needs the 'distributed' package" in out
    assert "pip install 'jupyter-runtimeenv[dask]'" in out


def _write_pid_and_hang(path: str) -> None:
    child = subprocess.Popen(["sleep", "300"])
    with open(path + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.replace(path + ".tmp", path)
    time.sleep(120)


def _describe(pid: int) -> str:
    try:
        proc = psutil.Process(pid)
        return f"{pid} (parent {proc.ppid()}): {' '.join(proc.cmdline())[:200]}"
    except psutil.NoSuchProcess:
        return f"{pid} (gone)"


def _alive(pid: int) -> bool:
    return alive(pid)
