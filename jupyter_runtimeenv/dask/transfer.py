"""Staging: the driver offers a manifest to nodes and sends each the blobs it lacks, once.

Who calls it: ``DaskExecutor``, from its staging threads (it blocks on ``Client.run``).
Blobs missing on several nodes go in one ``Client.run`` to all of them; batches are kept
under ``BATCH_BYTES``. Nothing is read from the driver's source directories here: the
blobs come from the driver's store, where ``build_manifest`` put them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .manifest import Manifest, read_blob
from .node import node_offer, node_put

BATCH_BYTES = 16 * 2**20


@dataclass
class Staged:
    """What one staging round did: nodes that have the env, bytes and blobs sent (counted
    per receiving node), and why the others could not take it."""

    nodes: set[str] = field(default_factory=set)
    bytes_sent: int = 0
    blobs_sent: int = 0
    errors: dict[str, str] = field(default_factory=dict)


def stage(client: Any, manifest: Manifest, nodes: list[str], store_root: Path) -> Staged:
    """Make ``manifest`` available on ``nodes``; blocking."""
    result = Staged()
    if not nodes:
        return result
    offered = client.run(node_offer, manifest.to_json(), workers=nodes, on_error="return")
    lacking: dict[str, list[str]] = {}
    for node, answer in offered.items():
        if isinstance(answer, BaseException):
            result.errors[node] = f"{type(answer).__name__}: {answer}"
        elif answer:
            lacking[node] = list(answer)
        else:
            result.nodes.add(node)
    if not lacking:
        return result
    # Group each blob by the set of nodes lacking it: one send per group and batch.
    who: dict[str, list[str]] = defaultdict(list)
    for node, names in lacking.items():
        for name in names:
            who[name].append(node)
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for name, lacking_nodes in who.items():
        groups[tuple(sorted(lacking_nodes))].append(name)
    sizes = manifest.blobs()
    remaining: dict[str, Any] = {}
    for targets, names in groups.items():
        for batch in _batches(sorted(names), sizes):
            blobs = {name: read_blob(store_root, name) for name in batch}
            answers = client.run(
                node_put, manifest.token, blobs, workers=list(targets), on_error="return"
            )
            sent = sum(len(data) for data in blobs.values())
            for node, answer in answers.items():
                if isinstance(answer, BaseException):
                    result.errors[node] = f"{type(answer).__name__}: {answer}"
                else:
                    result.bytes_sent += sent
                    result.blobs_sent += len(blobs)
                remaining[node] = answer
    for node in lacking:
        if node not in result.errors and remaining.get(node) == []:
            result.nodes.add(node)
        elif node not in result.errors:
            result.errors[node] = f"still lacks {remaining.get(node)!r} after the transfer"
    return result


def _batches(names: list[str], sizes: dict[str, int]) -> list[list[str]]:
    batches: list[list[str]] = [[]]
    total = 0
    for name in names:
        if batches[-1] and total + sizes[name] > BATCH_BYTES:
            batches.append([])
            total = 0
        batches[-1].append(name)
        total += sizes[name]
    return batches
