"""A staged manifest laid out on a node as resources of the node's cache; the node's GC.

Who calls it: the node agent, in threads (everything here blocks).

Each tree a manifest ships becomes the cache resource ``dask_tree:<digest>/<name>`` (a
directory of hardlinks to the node's blobs), each single file ``dask_file:<sha256>/<name>``;
the spec's placeholders become their paths. Being resources, they are collected by the node
agent's LRU GC together with the venvs and ``working_dir`` copies, within the node's byte
budget (``DaskExecutor(node_max_bytes=...)``). ``link`` ties them to the env built from them,
so they are kept while that env is held, and evicting one forgets the env.

Blobs (``shared/blobs``) that no tree or copy links any more (link count 1) are garbage once
no transfer waits for them: ``sweep_blobs`` deletes them, oldest first, while the cache is
over its budget. Sizes count a hardlinked file in each resource that holds it, so the budget
errs on the side of collecting; the bytes a GC reports freed are measured on disk (each inode
once), before and after.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ..agent.cache import Cache
from ..plugins import _spares
from ..plugins._hashing import FileEntry, Tree
from ..plugins._store import blob_dir, blob_path, materialize
from .manifest import PREFIX, Manifest, entries_of

TREE = "dask_tree"
FILE = "dask_file"
#: The fields whose values may hold placeholders.
FIELDS = ("working_dir", "py_modules", "driver_sys_path")


def place(manifest: Manifest, cache: Cache) -> tuple[dict[str, Any], list[str]]:
    """Lay out the manifest's trees and files as resources (those already there are
    reused); the spec with node paths, and the resources' URIs. Every blob must be in the
    node's store (``missing`` is empty). Blocking."""
    uris: list[str] = []

    def put(value: Any) -> Any:
        if isinstance(value, list):
            return [put(v) for v in value]
        if not isinstance(value, str) or not value.startswith(PREFIX):
            return value
        kind, key, name = value[len(PREFIX) :].split("/", 2)
        if kind == "tree":
            uri = f"{TREE}:{key}/{name}"
            root = _resource(
                cache, TREE, uri, lambda tmp: _lay_tree(manifest, key, tmp / name, cache.root)
            )
        else:
            uri = f"{FILE}:{key}/{name}"
            root = _resource(
                cache, FILE, uri, lambda tmp: _lay_file(manifest, key, tmp / name, cache.root)
            )
        uris.append(uri)
        return str(root / name)

    spec = dict(manifest.spec)
    for key in FIELDS:
        if key in spec:
            spec[key] = put(spec[key])
    return spec, uris


def _resource(cache: Cache, plugin: str, uri: str, fill: Any) -> Path:
    found = cache.lookup(uri)
    if found is not None:
        return found
    lock = cache.lock_for(uri)
    with lock:
        found = cache.lookup(uri)  # laid out by a twin meanwhile
        if found is not None:
            return found
        tmp = cache.new_tmp()
        try:
            size = fill(tmp)
            return cache.commit(plugin, uri, tmp, size)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def _lay_tree(manifest: Manifest, digest: str, target: Path, root: Path) -> int:
    entries = entries_of(manifest.trees[digest], root)
    materialize(Tree(digest, entries), root, target)
    # The bytes it pins (its files are links to the blobs); never 0: commit would measure.
    return sum(entry.size for entry in entries) or 1


def _lay_file(manifest: Manifest, sha: str, target: Path, root: Path) -> int:
    size, mode = manifest.files[sha]
    blob = blob_path(root, FileEntry("", "", int(mode), int(size), sha).blob_name)
    try:
        os.link(blob, target)
    except OSError:
        shutil.copy2(blob, target)  # another file system
    return int(size) or 1


def present(cache: Cache, uris: list[str]) -> bool:
    """Whether every resource of a staged spec is still there (GC may have taken one)."""
    return all(cache.lookup(uri) is not None for uri in uris)


def disk_bytes(root: Path) -> int:
    """Bytes of the files GC manages below the cache ``root`` (resources and blobs), each
    inode once: what deleting them frees."""
    seen: set[tuple[int, int]] = set()
    total = 0
    walks = [os.walk(root / "resources"), os.walk(blob_dir(root))]
    for base, _dirs, files in (step for walk in walks for step in walk):
        for name in files:
            try:
                st = os.lstat(os.path.join(base, name))
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if key not in seen:
                seen.add(key)
                total += st.st_size
    return total


def orphan_blobs(cache_root: Path, keep: set[str]) -> list[tuple[float, int, Path]]:
    """(ctime, size, path) of the blobs nothing links any more, oldest first, but those
    named in ``keep`` (blobs a pending transfer waits for)."""
    out = []
    for base, _dirs, files in os.walk(blob_dir(cache_root)):
        for name in files:
            if name.startswith(".") or name in keep:
                continue
            path = os.path.join(base, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if st.st_nlink == 1:
                out.append((st.st_ctime, st.st_size, Path(path)))
    out.sort()
    return out


def sweep_blobs(cache: Cache, keep: set[str], max_bytes: int) -> int:
    """Delete orphan blobs, oldest first, while the cache (its resources and its orphan
    blobs) is over ``max_bytes``; returns the bytes deleted."""
    # Spare trees (``plugins/_spares``: the next version of an edited working_dir, laid out
    # ahead) link blobs too, so a blob only they link would never look orphaned: they are an
    # optimisation, and go first.
    _spares.drop(str(blob_dir(cache.root)))
    orphans = orphan_blobs(cache.root, keep)
    total = cache.total_bytes() + sum(size for _c, size, _p in orphans)
    freed = 0
    for _ctime, size, path in orphans:
        if total <= max_bytes:
            break
        try:
            path.unlink()
        except OSError:
            continue
        total -= size
        freed += size
    return freed
