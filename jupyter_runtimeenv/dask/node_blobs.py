"""Blobs between nodes: a node serves its blobs to peers and fetches the ones it lacks.

Who calls it: ``NodeAgentPlugin.setup`` registers ``serve`` as the Dask worker's comm
handler ``jre_blobs``; ``NodeAgent.fetch`` (on the Dask worker's loop, asked by the driver's
``transfer.stage``) calls ``fetch``. The traffic is Dask's own worker-to-worker comms
(``Worker.rpc``), so it goes wherever Dask's does (TLS included) and never through the driver.

A peer may lack a blob it was said to hold (it was collected, or it lost it): it leaves the
blob out of its answer, and the fetcher tries the blob's next holder, then reports it as
still missing (the driver then sends it itself). Every received blob is checked against its
sha256 name before it is stored (``manifest.put_blob``); a peer sending other content is
treated like one that does not have it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..plugins._store import BLOB_MTIME_NS, blob_dir, blob_path
from .manifest import is_blob_name

log = logging.getLogger(__name__)

#: The Dask comm handler each node agent registers on its worker.
HANDLER = "jre_blobs"
#: At most this many bytes of blobs in one request to a peer.
BATCH_BYTES = 16 * 2**20
#: Requests in flight at once from one fetching node (to all its peers together).
PARALLEL = 4
#: Seconds to connect to a peer (a peer that died since the driver listed it must not
#: cost Dask's default half minute of retries), and for one batch to arrive.
CONNECT_TIMEOUT = 5.0
REQUEST_TIMEOUT = 120.0

#: Threads writing a batch of received blobs (file system calls release the GIL).
WRITERS = 4

__all__ = [
    "BATCH_BYTES",
    "HANDLER",
    "Fetched",
    "batches",
    "fetch",
    "read_blobs",
    "store_blobs",
]


def store_blobs(cache_root: Path, blobs: Mapping[str, bytes]) -> list[str]:
    """Store received blobs, each checked against its name (sha256, read-only mode);
    returns the names refused (not a blob name, or other content). Blocking; a batch is
    written by ``WRITERS`` threads, each blob to a temp file renamed into place."""
    refused: list[str] = []
    todo: list[tuple[str, bytes, int]] = []
    for name, data in blobs.items():
        mode = _mode_of(name)
        if mode is None or hashlib.sha256(data).hexdigest() != name[:64]:
            refused.append(name)
        else:
            todo.append((name, data, mode))
    for parent in {name[:2] for name, _d, _m in todo}:
        (blob_dir(cache_root) / parent).mkdir(parents=True, exist_ok=True)

    def write(item: tuple[str, bytes, int]) -> None:
        name, data, mode = item
        blob = blob_path(cache_root, name)
        tmp = f"{blob.parent}{os.sep}.{name}.{os.getpid()}.{threading.get_ident()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            os.utime(fd, ns=(BLOB_MTIME_NS, BLOB_MTIME_NS))
        finally:
            os.close(fd)
        try:
            os.replace(tmp, blob)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    if len(todo) <= 4:
        for item in todo:
            write(item)
    else:
        with concurrent.futures.ThreadPoolExecutor(WRITERS) as pool:
            list(pool.map(write, todo))
    return refused


def _mode_of(name: str) -> int | None:
    """The mode a blob named ``name`` is stored with, or None if it is not a blob name."""
    if not is_blob_name(name):
        return None
    flag = name[65:]
    if flag == "x":
        return 0o555
    return int(flag[1:], 8) if flag.startswith("m") else 0o444


def read_blobs(cache_root: Path, names: Sequence[str]) -> dict[str, bytes]:
    """The blobs of ``names`` this node's store holds intact; the others are left out.
    Blocking. Names outside the blob alphabet are ignored (they come from the network)."""
    out: dict[str, bytes] = {}
    total = 0
    for name in names:
        if not isinstance(name, str) or not is_blob_name(name):
            continue
        path = blob_path(cache_root, name)
        try:
            with open(path, "rb") as file:
                st = os.fstat(file.fileno())
                if st.st_mtime_ns != BLOB_MTIME_NS:
                    continue  # written through a link since it was stored: not the blob
                data = file.read()
        except OSError:
            continue
        out[name] = data
        total += len(data)
        if total >= 4 * BATCH_BYTES:
            break  # a greedy asker gets the rest on its next request
    return out


@dataclass
class Fetched:
    """What one node's fetch did: bytes received from peers, and blobs no peer gave."""

    peer_bytes: int = 0
    blobs: int = 0
    failed: list[str] = field(default_factory=list)


async def fetch(
    pool: Any,
    cache_root: Path,
    wanted: Mapping[str, int],
    holders: Mapping[str, Sequence[str]],
    me: str,
) -> Fetched:
    """Fetch ``wanted`` (blob name -> size) from the peers ``holders`` names for each.

    ``pool`` is the Dask worker's ``ConnectionPool`` (``Worker.rpc``). Each blob is asked of
    its holders in turn (the first one spread across the holders, so no peer serves
    everything); requests are batched under ``BATCH_BYTES`` and at most ``PARALLEL`` are in
    flight.
    """
    result = Fetched()
    todo = {name: [h for h in holders.get(name, ()) if h != me] for name in wanted}
    result.failed.extend(sorted(name for name, peers in todo.items() if not peers))
    todo = {name: peers for name, peers in todo.items() if peers}
    load: dict[str, int] = defaultdict(int)
    gate = asyncio.Semaphore(PARALLEL)
    while todo:
        # Each blob to the least-loaded of its remaining holders, biggest blobs first.
        plan: dict[str, list[str]] = defaultdict(list)
        for name in sorted(todo, key=lambda n: (-wanted[n], n)):
            peer = min(todo[name], key=lambda p: (load[p], p))
            load[peer] += wanted[name]
            plan[peer].append(name)
        jobs = [
            _ask(pool, peer, batch, cache_root, gate)
            for peer, names in sorted(plan.items())
            for batch in batches(names, wanted)
        ]
        answers = await asyncio.gather(*jobs)
        retry: dict[str, list[str]] = {}
        for peer, got, missed in answers:
            for name, size in got.items():
                result.peer_bytes += size
                result.blobs += 1
                todo.pop(name, None)
            for name in missed:
                rest = [p for p in todo.get(name, ()) if p != peer]
                if rest:
                    retry[name] = rest
                else:
                    result.failed.append(name)
        todo = retry
    result.failed.sort()
    return result


async def _ask(
    pool: Any, peer: str, names: list[str], root: Path, gate: asyncio.Semaphore
) -> tuple[str, dict[str, int], list[str]]:
    """One request to ``peer``: (peer, stored name -> size, names not received intact)."""
    async with gate:
        try:
            answer = await _request(pool, peer, names)
        except Exception as exc:  # the peer is gone or unreachable: its holders' next
            log.info("jupyter-runtimeenv: blobs from %s failed: %s", peer, exc)
            answer = {}
    if not isinstance(answer, dict):
        answer = {}
    received: dict[str, bytes] = {}
    missed: list[str] = []
    for name in names:
        data = answer.get(name)
        if isinstance(data, bytes | bytearray | memoryview):
            received[name] = bytes(data)
        else:
            missed.append(name)
    refused = await asyncio.to_thread(store_blobs, root, received)
    if refused:  # other content than their names say
        log.warning("jupyter-runtimeenv: peer %s sent %d bad blobs", peer, len(refused))
        missed.extend(refused)
    got = {name: len(data) for name, data in received.items() if name not in set(refused)}
    return peer, got, missed


async def _request(pool: Any, peer: str, names: list[str]) -> Any:
    from distributed.core import send_recv

    comm = await pool.connect(peer, timeout=CONNECT_TIMEOUT)
    try:
        answer = await asyncio.wait_for(send_recv(comm, op=HANDLER, names=names), REQUEST_TIMEOUT)
    except BaseException:
        comm.abort()  # half-read: never back into the pool
        raise
    pool.reuse(peer, comm)
    return answer


def batches(names: Sequence[str], sizes: Mapping[str, int]) -> list[list[str]]:
    """``names`` in runs of at most ``BATCH_BYTES`` (a bigger blob is a batch alone)."""
    out: list[list[str]] = [[]]
    total = 0
    for name in names:
        if out[-1] and total + sizes[name] > BATCH_BYTES:
            out.append([])
            total = 0
        out[-1].append(name)
        total += sizes[name]
    return [batch for batch in out if batch]
