"""A node's staged environments: manifests offered, blobs received, trees laid out, and the
guard that keeps the blob sweep off work in progress.

Who calls it: ``NodeAgent`` (``node.py``), which owns one ``NodeStaging``. The coroutines run
on the Dask worker's loop and do their blocking work in threads; everything that stores or
links blobs runs inside ``busy()``, and the blob sweep (``NodeAgent.trim``) only inside
``sweeping()``, which never overlaps it: a blob that looks unlinked to the sweep is never one a
staging or build is about to link.

A token names a manifest (``manifest.py``). It is staged when the node has all its blobs and
has laid its trees out as cache resources (``node_store.place``); ``parsed`` gives its spec
parsed once, or ``NotStaged`` when it is not staged here or GC took its files meanwhile (the
driver then stages it again).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..agent.cache import Cache
from ..errors import SpecError
from ..spec import RuntimeEnvSpec
from . import node_blobs, node_store
from .manifest import Manifest, missing


class NotStaged(Exception):
    """This node lacks the environment's manifest or blobs: the driver stages it and
    submits the task again. Never reaches the user."""

    def __init__(self, node: str, token: str) -> None:
        super().__init__(node, token)
        self.node = node
        self.token = token


class NodeStaging:
    """The staged tokens of one node agent. ``cache()`` is the node agent's cache (opened
    when the agent starts); ``parse`` parses a spec with the node agent's plugins."""

    def __init__(
        self,
        address: str,
        cache: Callable[[], Cache],
        parse: Callable[[dict[str, Any]], RuntimeEnvSpec],
        rpc: Any,
    ) -> None:
        self.address = address
        self._cache = cache
        self._parse = parse
        self._rpc = rpc
        self.lock = threading.Lock()
        self._staged: dict[str, dict[str, Any]] = {}  # token -> spec with node paths
        self._uris: dict[str, list[str]] = {}  # token -> the resources it laid out
        self._parsed: dict[str, RuntimeEnvSpec] = {}  # token -> that spec, parsed once
        self._pending: dict[str, Manifest] = {}
        #: Builds and stagings under way; the blob sweep waits for none and blocks new ones.
        self._busy = 0
        self._sweeping = False
        self._quiet = threading.Condition(self.lock)
        self.closed = False

    @property
    def root(self) -> Any:
        return self._cache().root

    # -- staging (coroutines on the Dask worker's loop) ------------------------------------

    async def offer(self, data: dict[str, Any]) -> list[str]:
        """Take a manifest; the blobs still needed (none: it is staged)."""
        manifest = Manifest.from_json(data)
        return await asyncio.to_thread(self._settle, manifest, True)

    async def put(self, token: str, blobs: dict[str, bytes]) -> list[str]:
        """Store blobs; the blobs ``token`` still needs (none: it is staged). ``ValueError``
        when one is not what its name says."""
        refused = await asyncio.to_thread(self._store, blobs)
        if refused:
            raise ValueError(f"blobs that are not what their names say: {refused[:3]}")
        return await asyncio.to_thread(self._settle_pending, token)

    async def fetch(self, token: str, holders: dict[str, list[str]]) -> dict[str, Any]:
        """Fetch the blobs ``token`` still needs from the peers ``holders`` names (blob ->
        addresses). ``{"lacking": [...], "peer_bytes": n}``: no lacking blob means staged."""
        with self.lock:
            manifest = self._pending.get(token)
        if manifest is None:
            return {
                "lacking": await asyncio.to_thread(self._settle_pending, token),
                "peer_bytes": 0,
            }
        lacking = await asyncio.to_thread(missing, manifest, self.root)
        sizes = manifest.blobs()
        # No busy span while blobs are on the wire: they are a pending manifest's (never
        # swept), and the sweep need not wait for the network.
        got = await node_blobs.fetch(
            self._rpc,
            self.root,
            {name: sizes[name] for name in lacking if name in holders},
            holders,
            self.address,
        )
        lacking = await asyncio.to_thread(self._settle_pending, token)
        return {"lacking": lacking, "peer_bytes": got.peer_bytes}

    def _store(self, blobs: dict[str, bytes]) -> list[str]:
        with self.busy():
            return node_blobs.store_blobs(self.root, blobs)

    def _settle_pending(self, token: str) -> list[str]:
        with self.lock:
            manifest = self._pending.get(token)
            staged = token in self._staged
        if manifest is None:
            return [] if staged else ["?manifest"]
        return self._settle(manifest, False)

    def _settle(self, manifest: Manifest, offered: bool) -> list[str]:
        """The blobs ``manifest`` still lacks here; with none, lay it out and stage it. One
        ``busy`` span from the look to the links: no sweep in between. Blocking."""
        token = manifest.token
        with self.busy():
            with self.lock:
                uris = self._uris.get(token)
            if offered and token in self.staged() and uris is not None:
                if node_store.present(self._cache(), uris):
                    return []
                self.unstage(token)  # GC took its files: stage it anew
            lacking = missing(manifest, self.root)
            if lacking:
                with self.lock:
                    self._pending[token] = manifest  # its blobs are never swept meanwhile
                return lacking
            spec, uris = node_store.place(manifest, self._cache())
        python = spec.get("driver_python")
        if isinstance(python, str) and not os.path.exists(python):
            spec["driver_python"] = sys.executable  # the driver's is not on this node
        with self.lock:
            self._staged[token] = spec
            self._uris[token] = uris
            self._parsed.pop(token, None)
            self._pending.pop(token, None)
        return []

    def unstage(self, token: str) -> None:
        """Forget a staged env (its files were collected): the next task restages it."""
        with self.lock:
            self._staged.pop(token, None)
            self._uris.pop(token, None)
            self._parsed.pop(token, None)

    def unstage_collected(self) -> None:
        """Unstage every env whose laid-out files GC took. Blocking."""
        with self.lock:
            uris = dict(self._uris)
        for token, needs in uris.items():
            if not node_store.present(self._cache(), needs):
                self.unstage(token)

    def staged(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            return dict(self._staged)

    def spec_of(self, token: str) -> dict[str, Any] | None:
        with self.lock:
            spec = self._staged.get(token)
        return None if spec is None else dict(spec)

    def pending_blobs(self) -> set[str]:
        """The blobs transfers under way wait for (never swept)."""
        with self.lock:
            manifests = list(self._pending.values())
        return {name for manifest in manifests for name in manifest.blobs()}

    def parsed(self, token: str) -> RuntimeEnvSpec:
        """The staged env of ``token``, parsed once (its local trees hashed once); blocking.
        ``NotStaged`` when it is not staged here, or its files are gone (collected)."""
        with self.lock:
            spec, parsed = self._staged.get(token), self._parsed.get(token)
            uris = list(self._uris.get(token, ()))
        if spec is None or self.closed:
            raise NotStaged(self.address, token)
        if not node_store.present(self._cache(), uris):  # collected: stage it again
            self.unstage(token)
            raise NotStaged(self.address, token)
        if parsed is not None:
            return parsed
        try:
            parsed = self._parse(spec)
        except SpecError:  # a path of the staged spec was collected meanwhile
            self.unstage(token)
            raise NotStaged(self.address, token) from None
        with self.lock:
            if token in self._staged:
                self._parsed[token] = parsed
        return parsed

    def env_id_of(self, token: str) -> str | None:
        """The env id of a staged env on this node, if it was parsed (no work done)."""
        with self.lock:
            parsed = self._parsed.get(token)
        return parsed.env_id if parsed is not None else None

    def linked(self, token: str, env_id: str) -> None:
        """The env ``env_id`` was built from ``token``'s trees: tie them to it (kept while
        it is held, collected with it) and mark them used now. Blocking."""
        with self.lock:
            uris = list(self._uris.get(token, ()))
        if uris:
            cache = self._cache()
            cache.link_resources(env_id, uris)
            cache.touch(uris)

    # -- the guard between work that links blobs and the sweep that deletes them -----------

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Around work that stores or links blobs (blocking: waits while a sweep runs)."""
        self.enter_busy()
        try:
            yield
        finally:
            self.leave_busy()

    def enter_busy(self) -> None:
        with self._quiet:
            while self._sweeping:
                self._quiet.wait()
            self._busy += 1

    def leave_busy(self) -> None:
        with self._quiet:
            self._busy -= 1
            self._quiet.notify_all()

    @contextlib.contextmanager
    def sweeping(self) -> Iterator[bool]:
        """Around the blob sweep: yields False (do not sweep) while anything is busy."""
        with self._quiet:
            if self._busy or self._sweeping:
                yield False
                return
            self._sweeping = True
        try:
            yield True
        finally:
            with self._quiet:
                self._sweeping = False
                self._quiet.notify_all()

    def sweep(self, limit: int) -> int:
        """Delete blobs nothing links, oldest first, while the cache is over ``limit``;
        nothing while a staging or build is under way. Blocking."""
        with self.sweeping() as clear:
            if not clear:
                return 0  # a build or transfer is linking blobs now: the next trim sweeps
            return node_store.sweep_blobs(self._cache(), self.pending_blobs(), limit)
