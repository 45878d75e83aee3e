"""What the Dask tests ask the nodes (through ``Client.run``)."""

from __future__ import annotations

import os
import time
from typing import Any


def node_pids(client: Any) -> list[int]:
    from jupyter_runtimeenv.dask.node_ops import node_info

    info = client.run(node_info, on_error="return")
    return [pid for answer in info.values() if isinstance(answer, dict) for pid in answer["pids"]]


def assert_no_env_workers(client: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while (pids := node_pids(client)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pids, f"environment workers left on the nodes: {pids}"


def roots_of(client: Any) -> dict[str, str]:
    from jupyter_runtimeenv.dask.node_ops import node_info

    return {node: info["cache_root"] for node, info in client.run(node_info).items()}


def worker_pids(client: Any) -> dict[str, int]:
    return client.run(os.getpid)
