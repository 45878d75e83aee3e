"""A node as its kernel's report shows it, its garbage collection, and stopping a worker.

Who calls it: the ``node_*`` functions of ``node_ops`` (coroutines on the Dask worker's
loop, asked by the driver's ``cluster_ops``). Blocking work (the cache's index, walking
the blob store) runs in threads; the agent's coroutines on its own loop thread.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import psutil

from ..errors import EnvNotFound
from ..workers.report import rss_of
from . import node_store
from .node import NodeAgent, NotStaged


async def states(node: NodeAgent, tokens: list[str]) -> dict[str, str]:
    """Token -> the env's state here: ``not staged``, ``staged`` (never used here), or
    the agent's (``READY`` ...; ``not built`` once collected)."""
    staged = node.staged()
    out: dict[str, str] = {}
    for token in tokens:
        if token not in staged:
            out[token] = "not staged"
            continue
        env_id = node.env_id_of(token)
        out[token] = "staged" if env_id is None else await _state(node, env_id)
    return out


async def _state(node: NodeAgent, env_id: str) -> str:
    thread = node.thread
    if thread is None:
        return "stopped"
    try:
        status = await thread.run_async(node.agent.env_status(env_id))
    except EnvNotFound:
        return "not built"
    return str(status.get("state", "?"))


async def snapshot(node: NodeAgent, owner: str, tokens: list[str]) -> dict[str, Any]:
    """This node for the kernel of executor ``owner``: its cache's size and budget, and per
    env of ``tokens`` staged here its env id, state, size and ``owner``'s workers."""
    staged = node.staged()
    with node.lock:
        pools = {token: pool for (who, token), pool in node.pools.items() if who == owner}
    envs = []
    for token in tokens:
        if token not in staged:
            continue
        env_id = node.env_id_of(token)
        pool = pools.get(token)
        workers: list[dict[str, Any]] = []
        if pool is not None:
            stats = await asyncio.to_thread(pool.stats)
            listed: Any = stats.get("workers") or []
            workers = [dict(w) for w in listed]
            for worker in workers:
                worker["rss"] = await asyncio.to_thread(rss_of, int(worker["pid"]))
        envs.append(
            {
                "token": token,
                "env_id": env_id or "",
                "state": "staged" if env_id is None else await _state(node, env_id),
                "bytes": 0 if env_id is None else await asyncio.to_thread(_env_bytes, node, env_id),
                "workers": workers,
            }
        )
    cache = node.agent.cache
    return {
        "address": node.address,
        "cache_bytes": await asyncio.to_thread(cache.total_bytes),
        "max_bytes": node.max_bytes,
        "envs": envs,
    }


def _env_bytes(node: NodeAgent, env_id: str) -> int:
    """The bytes of an env's resources here (a file hardlinked into two counts twice)."""
    cache = node.agent.cache
    total = 0
    for uri in cache.env_uris(env_id):
        row = cache.resource(uri)
        if row is not None:
            total += int(row["size"])
    return total


async def collect(node: NodeAgent, max_bytes: int | None = None) -> dict[str, Any]:
    """Collect this node's cache down to ``max_bytes`` (default: its budget;
    ``NodeAgent.trim``). Returns
    ``{"freed_bytes"`` (measured on disk, each inode once), ``"evicted"`` (resource URIs),
    ``"cache_bytes"}``."""
    if node.thread is None:
        raise NotStaged(node.address, "")
    before = await asyncio.to_thread(node_store.disk_bytes, node.cache_root)
    evicted = await node.trim(max_bytes)
    after = await asyncio.to_thread(node_store.disk_bytes, node.cache_root)
    return {
        "freed_bytes": max(0, before - after),
        "evicted": evicted,
        "cache_bytes": await asyncio.to_thread(node.agent.cache.total_bytes),
    }


async def stop_worker(node: NodeAgent, owner: str, pid: int) -> bool:
    """SIGKILL environment worker ``pid`` if it belongs to one of ``owner``'s pools here
    and descends from this process; its pool sees it die (its task fails with
    ``BrokenWorker``). False if it is not such a worker (or already gone)."""
    with node.lock:
        pools = [pool for (who, _t), pool in node.pools.items() if who == owner]
    if not any(pid in pool.pids for pool in pools):
        return False
    return await asyncio.to_thread(_kill_descendant, pid)


def _kill_descendant(pid: int) -> bool:
    try:
        process = psutil.Process(pid)
        if os.getpid() not in {parent.pid for parent in process.parents()}:
            return False
        process.send_signal(signal.SIGKILL)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False  # it ended between the look and the kill, or is not ours
    return True
