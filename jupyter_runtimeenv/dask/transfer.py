"""Staging: the driver sends each blob at most once per cluster; nodes share the rest.

Who calls it: ``DaskExecutor``, from its staging threads (it blocks on ``Client.run``).

One round for a manifest and a set of nodes:

1. **Offer.** Every node gets the manifest and answers the blobs its store lacks. A node
   that lacks nothing is staged; a blob some node does not lack is held by that node.
2. **Seed.** Each blob that no node holds (nor any ``peers`` node, which staged the same
   manifest before) is sent by the driver to exactly one node that lacks it, the seeds
   chosen so each gets an even share of the bytes. This is all the driver sends.
3. **Share.** Every node still lacking blobs fetches them from their holders (``node_fetch``:
   Dask worker-to-worker comms, sha256-checked), all nodes at once. A staged node has the
   whole manifest, so nodes that join later copy from the others.
4. **Fall back.** What a node still lacks (its holder died, or sent other content) comes
   from the driver, as before there were peers.

So the driver's upload is the tree's size (plus what failed) whatever the number of nodes,
where it used to be one copy per node. ``Staged.bytes_sent`` counts the blob bytes the
driver sent, ``peer_bytes`` what nodes copied from each other.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .manifest import Manifest, read_blob
from .node_blobs import batches
from .node_ops import node_fetch, node_offer, node_put

#: Puts from the driver to different seeds at once.
PARALLEL_PUTS = 4


@dataclass
class Staged:
    """What one staging round did: nodes that have the env, bytes and blobs the driver sent,
    bytes nodes copied from peers, and why the others could not take it."""

    nodes: set[str] = field(default_factory=set)
    bytes_sent: int = 0
    blobs_sent: int = 0
    peer_bytes: int = 0
    errors: dict[str, str] = field(default_factory=dict)
    #: Seconds spent in each phase (offer, seed, share, fallback): where the time goes.
    phases: dict[str, float] = field(default_factory=dict)


def stage(
    client: Any,
    manifest: Manifest,
    nodes: list[str],
    store_root: Path,
    peers: list[str] | tuple[str, ...] = (),
) -> Staged:
    """Make ``manifest`` available on ``nodes``; blocking. ``peers``: nodes that staged it
    already (they hold every blob), asked before the driver."""
    result = Staged()
    if not nodes:
        return result
    clock = _Clock(result.phases)
    offered = client.run(node_offer, manifest.to_json(), workers=nodes, on_error="return")
    clock.lap("offer")
    lacking: dict[str, set[str]] = {}
    for node, answer in offered.items():
        if isinstance(answer, BaseException):
            result.errors[node] = f"{type(answer).__name__}: {answer}"
        elif answer:
            lacking[node] = set(answer)
        else:
            result.nodes.add(node)
    if not lacking:
        return result
    sizes = manifest.blobs()
    needed = set().union(*lacking.values())
    holders: dict[str, list[str]] = {name: [] for name in needed}
    sources = [n for n in offered if n not in result.errors] + [
        p for p in peers if p not in offered
    ]
    for name in needed:
        holders[name] = [n for n in sources if name not in lacking.get(n, ())]
    # 2. seed: what nobody holds goes from the driver to one node that lacks it.
    orphans = sorted((n for n in needed if not holders[n]), key=lambda n: (-sizes[n], n))
    seeds: dict[str, list[str]] = defaultdict(list)
    load = dict.fromkeys(sorted(lacking), 0)
    for name in orphans:
        node = min((n for n in load if name in lacking[n]), key=lambda n: (load[n], n))
        seeds[node].append(name)
        load[node] += sizes[name]
    remaining = _put(client, manifest, store_root, seeds, result)
    clock.lap("seed")
    for node, names in seeds.items():
        if node not in result.errors:
            for name in names:
                holders[name].append(node)
    for node, answer in remaining.items():
        if answer == []:
            lacking.pop(node, None)
            result.nodes.add(node)
    # 3. share: every node fetches what it still lacks from the nodes that hold it.
    fetchers = sorted(n for n in lacking if n not in result.errors)
    if fetchers:
        plan = {name: hold for name, hold in holders.items() if hold}
        answers = client.run(node_fetch, manifest.token, plan, workers=fetchers, on_error="return")
        for node, answer in answers.items():
            if isinstance(answer, BaseException):
                result.errors[node] = f"{type(answer).__name__}: {answer}"
                continue
            result.peer_bytes += int(answer.get("peer_bytes", 0))
            if answer["lacking"]:
                lacking[node] = set(answer["lacking"])
            else:
                lacking.pop(node, None)
                result.nodes.add(node)
    clock.lap("share")
    # 4. fall back: the driver sends what no peer could give.
    rest = {n: sorted(names) for n, names in lacking.items() if n not in result.errors}
    remaining = _put_grouped(client, manifest, store_root, rest, result)
    for node in rest:
        if node in result.errors:
            continue
        if remaining.get(node) == []:
            result.nodes.add(node)
        else:
            result.errors[node] = f"still lacks {remaining.get(node)!r} after the transfer"
    clock.lap("fallback")
    return result


class _Clock:
    """Laps into ``phases`` (name -> seconds)."""

    def __init__(self, phases: dict[str, float]) -> None:
        self.phases = phases
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.last
        self.last = now


def _put(
    client: Any,
    manifest: Manifest,
    store_root: Path,
    plan: dict[str, list[str]],
    result: Staged,
) -> dict[str, Any]:
    """Send each node its own blobs (nodes in parallel); node -> its last answer (the
    blobs it still lacks)."""
    sizes = manifest.blobs()
    last: dict[str, Any] = {}
    lock = threading.Lock()

    def send(node: str) -> None:
        for batch in batches(sorted(plan[node]), sizes):
            blobs = {name: read_blob(store_root, name) for name in batch}
            answer = client.run(
                node_put, manifest.token, blobs, workers=[node], on_error="return"
            ).get(node)
            with lock:
                if isinstance(answer, BaseException) or answer is None:
                    result.errors[node] = f"{type(answer).__name__}: {answer}"
                    return
                result.bytes_sent += sum(len(data) for data in blobs.values())
                result.blobs_sent += len(blobs)
                last[node] = answer

    with concurrent.futures.ThreadPoolExecutor(PARALLEL_PUTS) as pool:
        list(pool.map(send, sorted(plan)))
    return last


def _put_grouped(
    client: Any,
    manifest: Manifest,
    store_root: Path,
    lacking: dict[str, list[str]],
    result: Staged,
) -> dict[str, Any]:
    """The driver's fallback: each blob to every node still lacking it, one ``Client.run``
    per group of nodes lacking the same blobs and batch."""
    who: dict[str, list[str]] = defaultdict(list)
    for node, names in lacking.items():
        for name in names:
            who[name].append(node)
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for name, nodes in who.items():
        groups[tuple(sorted(nodes))].append(name)
    sizes = manifest.blobs()
    remaining: dict[str, Any] = {}
    for targets, names in groups.items():
        for batch in batches(sorted(names), sizes):
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
    return remaining
