"""Where a kernel on a Dask cluster goes, and how its environment gets there.

Who calls it: ``DaskKernelProvisioner.pre_launch`` (``remote.py``), on the kernel manager's
loop; every blocking step (hashing local files, talking to Dask) runs in a thread.

The spec's local files are hashed into this process's blob store (a manifest, as for
tasks: ``dask/manifest.py``); the node asks for the blobs it lacks (``dask/transfer.py``).
The node: on a restart the kernel's own while it lives; else one where the env is READY
(built there before, by a kernel or by tasks), the least loaded of those; else the least
loaded of all: fewest kernels, then running tasks per thread, then load average per CPU.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import KernelStartError
from .cluster import ClusterLink


async def manifest_for(runtime_env: Mapping[str, Any]) -> tuple[Any, Path]:
    """The kernel's spec parsed and its local files stored here: (manifest, store root)."""
    from ..dask.manifest import build_manifest
    from ..spec import parse

    spec = await asyncio.to_thread(parse, dict(runtime_env))
    store = await store_root()
    return await asyncio.to_thread(build_manifest, spec, store), store


async def place(
    link: ClusterLink, token: str, scheduler: str, current: str | None
) -> tuple[str, str | None]:
    """The node for the kernel and why (``None``: it stays on ``current``, still there)."""
    from ..dask.node_kernels import node_kernel_load

    nodes = await asyncio.to_thread(link.nodes)
    if current is not None and current in nodes:
        return current, None  # a restart stays on its node while it lives
    if not nodes:
        raise KernelStartError(f"the Dask scheduler {scheduler} has no workers")
    answers = await asyncio.to_thread(link.run_all, node_kernel_load, token, nodes=nodes)
    loads = {node: answer for node, answer in answers.items() if isinstance(answer, dict)}
    if not loads:
        why = "; ".join(f"{node}: {answer}" for node, answer in sorted(answers.items()))
        raise KernelStartError(f"no Dask worker of {scheduler} could take the kernel: {why}")
    return pick(loads)


def pick(loads: Mapping[str, Mapping[str, Any]]) -> tuple[str, str]:
    """A node among ``loads`` (node -> ``node_kernel_load``'s answer), and why."""
    ready = [node for node, load in loads.items() if load.get("ready")]
    choice = min(ready or list(loads), key=lambda node: _load_key(node, loads[node]))
    return choice, ("its environment is READY there" if ready else "the least loaded node")


def _load_key(node: str, load: Mapping[str, Any]) -> tuple[float, float, float, str]:
    threads = max(1, int(load.get("nthreads", 1)))
    return (
        float(load.get("kernels", 0)),
        float(load.get("executing", 0)) / threads,
        float(load.get("loadavg", 0.0)),
        node,
    )


async def stage_on(link: ClusterLink, manifest: Any, node: str, store: Path) -> None:
    """Make the manifest's files available on ``node`` (it receives what it lacks)."""
    from ..dask.transfer import stage

    staged = await asyncio.to_thread(stage, link.client, manifest, [node], store)
    if node not in staged.nodes:
        why = staged.errors.get(node, "it did not take the files")
        raise KernelStartError(
            f"staging the kernel's environment on Dask worker {node} failed: {why}", node=node
        )


async def store_root() -> Path:
    """Where this process keeps the blobs it ships: the server's cache when the extension
    runs here, else the default cache root."""
    from ..agent.cache import default_cache_dir
    from ..server.app import local_agent

    agent = await local_agent()
    if agent is not None:
        return Path(agent.cache.root)
    return default_cache_dir()
