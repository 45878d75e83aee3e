"""Node disks are bounded: laid-out trees, copies, venvs and blobs on each node are collected
by the node agent's LRU GC within ``node_max_bytes``; ``executor.gc()`` runs it on every node
and answers the bytes freed per node, measured on the node's disk.

Real ``LocalCluster`` nodes with their own cache roots; this module's cluster is its own (the
node agent's budget is set by the first executor that registers it on a cluster).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.dask import DaskExecutor
from jupyter_runtimeenv.dask.node_store import disk_bytes
from tests.dask.helpers import assert_no_env_workers, node_pids, roots_of

TREE_BYTES = 300_000
#: Fits one env (its laid-out tree and its working_dir copy count the tree twice) and a
#: half, not two: a second env pushes the first one out.
BUDGET = int(2.5 * TREE_BYTES)


@pytest.fixture
def gc_executor(client: Any, node_root: Path, tmp_path: Path) -> Iterator[DaskExecutor]:
    executor = DaskExecutor(
        client,
        node_cache_dir=str(node_root / "node-{name}"),
        node_max_bytes=BUDGET,
        driver_cache_dir=tmp_path / "driver",
    )
    yield executor
    executor.shutdown()
    assert_no_env_workers(client)


def _tree(root: Path, files: int = 30) -> Path:
    for i in range(files):
        (root / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"d{i % 3}" / f"f{i}.bin").write_bytes(os.urandom(TREE_BYTES // files))
    return root


def _spec(root: Path) -> Any:
    return jre.parse({"working_dir": str(root), "driver_sys_path": False})


def _managed(client: Any) -> dict[str, int]:
    """Bytes GC manages on each node (resources and blobs, each inode once)."""
    return {node: disk_bytes(Path(root)) for node, root in roots_of(client).items()}


def _trees(client: Any) -> dict[str, list[str]]:
    out = {}
    for node, root in roots_of(client).items():
        trees = Path(root) / "resources" / "dask_tree"
        out[node] = sorted(os.listdir(trees)) if trees.is_dir() else []
    return out


def test_gc_frees_what_nobody_holds_on_every_node_and_says_how_much(
    gc_executor: DaskExecutor, tmp_path: Path
):
    first = _spec(_tree(tmp_path / "a"))
    gc_executor.prepare(first)
    second = _spec(_tree(tmp_path / "b"))
    gc_executor.stage(second)  # laid out, not built: staging alone never collects
    # Within the budget (the first env built, the second laid out): nothing to free.
    assert set(gc_executor.gc().values()) == {0}
    before = _managed(gc_executor.client)
    freed = gc_executor.gc(max_bytes=0)  # everything nobody holds
    after = _managed(gc_executor.client)
    assert set(freed) == set(gc_executor.client.scheduler_info()["workers"])
    for node, amount in freed.items():
        assert amount == before[node] - after[node]  # measured on the node's disk
        assert amount >= 2 * TREE_BYTES  # both trees' files, once each (links counted once)
        assert after[node] == 0
    for spec in (first, second):
        assert set(gc_executor.states_on_nodes(spec).values()) == {"not staged"}
    with pytest.raises(ValueError, match="max_bytes: expected a byte count >= 0"):
        gc_executor.gc(max_bytes=-5)


def test_a_second_env_pushes_the_first_out_within_the_budget(
    gc_executor: DaskExecutor, tmp_path: Path
):
    first = _spec(_tree(tmp_path / "first"))
    second = _spec(_tree(tmp_path / "second"))
    gc_executor.prepare(first)
    first_trees = _trees(gc_executor.client)
    time.sleep(0.05)  # LRU order by time: the second is used later
    gc_executor.prepare(second)
    for node, trees in _trees(gc_executor.client).items():
        gone = set(first_trees[node]) - set(trees)
        assert gone, f"{node} kept the first env's tree past its budget: {trees}"
    for node, managed in _managed(gc_executor.client).items():
        # The second env's files (tree and copy are links to one set of blobs), and none of
        # the first's blobs: nothing links them any more.
        assert managed < 2 * TREE_BYTES, (node, managed)
    states = gc_executor.states_on_nodes(first)
    assert set(states.values()) <= {"not staged", "not built"}, states

    # The first env still runs: its nodes stage it again (the driver still has its blobs).
    future = gc_executor.submit(os.listdir, (".",), {}, runtime_env=first, name="ls")
    work = sorted(jre.get(future, timeout=120))
    assert work == ["d0", "d1", "d2"]


def test_gc_keeps_an_env_a_worker_holds(gc_executor: DaskExecutor, tmp_path: Path):
    root = _tree(tmp_path / "held")
    spec = _spec(root)
    gc_executor.prepare(spec)
    gc_executor.prestart(spec)
    deadline = time.monotonic() + 60
    while len(node_pids(gc_executor.client)) < 2:
        assert time.monotonic() < deadline, "the prestarted workers did not start"
        time.sleep(0.1)
    trees = _trees(gc_executor.client)
    sent = gc_executor.bytes_sent
    other = _spec(_tree(tmp_path / "other"))
    gc_executor.prepare(other)  # over the budget now: only what nobody holds may go
    gc_executor.gc()
    for node, kept in _trees(gc_executor.client).items():
        assert set(trees[node]) <= set(kept), f"{node} collected a held env's tree"
    future = gc_executor.submit(os.listdir, (".",), {}, runtime_env=spec, name="ls")
    assert sorted(jre.get(future, timeout=120)) == ["d0", "d1", "d2"]
    assert gc_executor.bytes_sent == sent + sum(
        p.stat().st_size for p in (tmp_path / "other").rglob("*.bin")
    )  # the held env was not sent again


def test_node_max_bytes_is_checked(client: Any):
    with pytest.raises(ValueError, match="node_max_bytes: expected a byte count >= 0"):
        DaskExecutor(client, node_max_bytes=-1)
    with pytest.raises(TypeError, match="node_max_bytes: expected a byte count"):
        DaskExecutor(client, node_max_bytes="10G")  # type: ignore[arg-type]
