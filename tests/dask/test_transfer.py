"""Blobs leave the driver once per cluster: nodes copy from peers (Dask worker-to-worker
comms), sha256-checked, and fall back to the driver only for what no peer could give.

Real ``LocalCluster`` nodes (each its own cache root), real transfers; the faults are made
on a node's real store (a blob deleted, a blob's bytes replaced) through ``Client.run``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.dask import transfer
from jupyter_runtimeenv.dask.manifest import Manifest, build_manifest, missing
from jupyter_runtimeenv.plugins._store import BLOB_MTIME_NS, blob_path


def _tree(root: Path, files: int, size: int = 3000) -> int:
    for i in range(files):
        (root / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"d{i % 3}" / f"f{i}.bin").write_bytes(os.urandom(size))
    return files * size


def _manifest(tmp_path: Path, files: int = 12) -> tuple[Manifest, Path, int]:
    work = tmp_path / "tree"
    size = _tree(work, files)
    store = tmp_path / "driver-store"
    spec = jre.parse({"working_dir": str(work), "driver_sys_path": False})
    return build_manifest(spec, store), store, size


def _lacking(client: Any, manifest: Manifest) -> dict[str, list[str]]:
    def ask(data: dict[str, Any], dask_worker: Any) -> list[str]:
        from jupyter_runtimeenv.dask.node_ops import agent_of

        return missing(Manifest.from_json(data), agent_of(dask_worker).cache_root)

    return dict(client.run(ask, manifest.to_json()))


def test_each_blob_leaves_the_driver_once(make_executor: Any, tmp_path: Path):
    executor = make_executor()
    executor.staging.register_plugin()
    manifest, store, size = _manifest(tmp_path)
    nodes = executor.staging.nodes()
    staged = transfer.stage(executor.client, manifest, nodes, store)
    assert staged.nodes == set(nodes)
    assert not staged.errors
    assert staged.bytes_sent == size  # once for the cluster, not once per node
    assert staged.peer_bytes == size * (len(nodes) - 1)
    assert all(not lacking for lacking in _lacking(executor.client, manifest).values())
    # Offered again: everything is there, nothing moves.
    again = transfer.stage(executor.client, manifest, nodes, store)
    assert again.nodes == set(nodes)
    assert again.bytes_sent == 0
    assert again.peer_bytes == 0


def test_a_late_node_copies_from_its_peers(make_executor: Any, tmp_path: Path):
    executor = make_executor()
    executor.staging.register_plugin()
    manifest, store, size = _manifest(tmp_path)
    first, second = executor.staging.nodes()
    staged = transfer.stage(executor.client, manifest, [first], store)
    assert staged.bytes_sent == size
    later = transfer.stage(executor.client, manifest, [second], store, peers=[first])
    assert later.nodes == {second}
    assert later.bytes_sent == 0  # the driver sent nothing: the peer had it all
    assert later.peer_bytes == size


def test_a_peer_that_lost_a_blob_or_sends_other_bytes_falls_back_to_the_driver(
    make_executor: Any, tmp_path: Path
):
    executor = make_executor()
    executor.staging.register_plugin()
    manifest, store, size = _manifest(tmp_path)
    first, second = executor.staging.nodes()
    transfer.stage(executor.client, manifest, [first], store)
    lost, forged = sorted(manifest.blobs())[:2]

    def damage(lost: str, forged: str, dask_worker: Any) -> None:
        from jupyter_runtimeenv.dask.node_ops import agent_of

        root = agent_of(dask_worker).cache_root
        blob_path(root, lost).unlink()
        # Other bytes under the blob's name, looking intact (same mtime stamp): a peer
        # serving it must be refused by its sha256.
        path = blob_path(root, forged)
        os.chmod(path, 0o644)
        path.write_bytes(b"x" * path.stat().st_size)
        os.chmod(path, 0o444)
        os.utime(path, ns=(BLOB_MTIME_NS, BLOB_MTIME_NS))

    executor.client.run(damage, lost, forged, workers=[first])
    sizes = manifest.blobs()
    later = transfer.stage(executor.client, manifest, [second], store, peers=[first])
    assert later.nodes == {second}
    assert not later.errors
    assert later.bytes_sent == sizes[lost] + sizes[forged]  # only those two, from the driver
    assert later.peer_bytes == size - sizes[lost] - sizes[forged]
    assert _lacking(executor.client, manifest)[second] == []

    def content(name: str, dask_worker: Any) -> bytes:
        from jupyter_runtimeenv.dask.node_ops import agent_of

        return blob_path(agent_of(dask_worker).cache_root, name).read_bytes()

    good = (store / "shared" / "blobs" / forged[:2] / forged).read_bytes()
    assert executor.client.run(content, forged, workers=[second])[second] == good


def test_a_peer_that_is_gone_falls_back_to_the_driver(make_executor: Any, tmp_path: Path):
    executor = make_executor()
    executor.staging.register_plugin()
    manifest, store, size = _manifest(tmp_path)
    first = executor.staging.nodes()[0]
    later = transfer.stage(executor.client, manifest, [first], store, peers=["tcp://127.0.0.1:9"])
    assert later.nodes == {first}
    assert later.bytes_sent == size
    assert later.peer_bytes == 0
