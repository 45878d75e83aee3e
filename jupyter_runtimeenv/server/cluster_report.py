"""The ``cluster`` section of a kernel's report: what a kernel whose executor runs on Dask
says of its cluster (``server/openapi.yaml``, ``Cluster``), checked like the rest of the report.

Who calls it: the report's handler (``panel.KernelReportHandler.post``: ``validate_full``)
and the cluster handlers (``cluster.py``: ``listed``). Workers are checked exactly as a local
pool's (``kernels._pool``): the same fields, the same bounds.
"""

from __future__ import annotations

from typing import Any

from .kernels import ReportError, _pool, validate_report

#: Bounds of a report's cluster section.
MAX_NODES = 512
MAX_ENVS_PER_NODE = 64
_STATES = {"up", "unreachable"}


def validate_cluster(data: Any) -> dict[str, Any] | None:
    """A report's ``cluster`` section with only the fields we know, checked (``None`` when
    absent); ``ReportError`` naming the field."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ReportError("cluster: expected a JSON object or null")
    nodes = data.get("nodes", [])
    if not isinstance(nodes, list) or len(nodes) > MAX_NODES:
        raise ReportError(f"cluster.nodes: expected a list of at most {MAX_NODES} nodes")
    dashboard = data.get("dashboard")
    if dashboard is not None and not (
        isinstance(dashboard, str) and dashboard.startswith(("http://", "https://"))
    ):
        raise ReportError("cluster.dashboard: expected an http(s) URL or null")
    updated = data.get("updated")
    if updated is not None and (not isinstance(updated, int | float) or isinstance(updated, bool)):
        raise ReportError("cluster.updated: expected a time in seconds")
    return {
        "scheduler": _text(data.get("scheduler"), "cluster.scheduler"),
        "dashboard": dashboard[:2000] if isinstance(dashboard, str) else None,
        "updated": updated,
        "nodes": [_node(node, f"cluster.nodes[{i}]") for i, node in enumerate(nodes)],
    }


def _node(node: Any, where: str) -> dict[str, Any]:
    if not isinstance(node, dict):
        raise ReportError(f"{where}: expected a JSON object")
    state = node.get("state", "up")
    if state not in _STATES:
        raise ReportError(f"{where}.state: expected one of {sorted(_STATES)}")
    envs = node.get("envs", [])
    if not isinstance(envs, list) or len(envs) > MAX_ENVS_PER_NODE:
        raise ReportError(f"{where}.envs: expected a list of at most {MAX_ENVS_PER_NODE}")
    clean_envs = []
    for j, env in enumerate(envs):
        at = f"{where}.envs[{j}]"
        if not isinstance(env, dict):
            raise ReportError(f"{at}: expected a JSON object")
        # The workers as a local pool's: the same checks, the same fields.
        workers = _pool({"env_id": "x", "workers": env.get("workers", [])}, at)["workers"]
        clean_envs.append(
            {
                "env_id": _text(env.get("env_id"), f"{at}.env_id", 128),
                "driver_env_id": _text(env.get("driver_env_id"), f"{at}.driver_env_id", 128),
                "state": _text(env.get("state"), f"{at}.state", 40),
                "bytes": _count(env.get("bytes", 0), f"{at}.bytes"),
                "workers": workers,
            }
        )
    clean = {
        "address": _text(node.get("address"), f"{where}.address"),
        "name": _text(node.get("name"), f"{where}.name"),
        "state": state,
        "cache_bytes": _count(node.get("cache_bytes", 0), f"{where}.cache_bytes"),
        "max_bytes": _count(node.get("max_bytes", 0), f"{where}.max_bytes"),
        "envs": clean_envs,
    }
    if not clean["address"]:
        raise ReportError(f"{where}.address: expected a node's address")
    if node.get("error") is not None:
        clean["error"] = _text(node.get("error"), f"{where}.error", 300)
    return clean


def _text(value: Any, where: str, limit: int = 300) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ReportError(f"{where}: expected a string")
    return value[:limit]


def _count(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ReportError(f"{where}: expected a byte count")
    return value


def listed(report: dict[str, Any] | None, node: str, pid: int) -> bool:
    """Whether the kernel's report lists worker ``pid`` on node ``node``."""
    cluster = (report or {}).get("cluster") or {}
    return any(
        worker["pid"] == pid
        for each in cluster.get("nodes", [])
        if each["address"] == node
        for env in each["envs"]
        for worker in env["workers"]
    )


def validate_full(data: Any) -> dict[str, Any]:
    """A kernel's whole report checked: ``validate_report``'s part and the ``cluster``."""
    report = validate_report(data)
    report["cluster"] = validate_cluster(data.get("cluster"))
    return report
