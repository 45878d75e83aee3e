"""The manifest: a spec whose local files travel by content, never by path.

Who calls it: ``DaskExecutor`` (driver side: ``build_manifest``, in a thread) and the node
agent (``missing``, ``put_blob``, ``materialize_manifest``, in threads). Everything here
blocks and imports nothing of ``distributed``.

On the driver, every local directory or file a spec names (``working_dir``, ``py_modules``,
``driver_sys_path`` entries) is hashed with ``_hashing`` (excludes and ``.gitignore``
applied), its files are put in the driver's blob store (so the driver may delete or edit
the directory afterwards), and its value in the spec becomes a placeholder
``jre-blob://tree/<digest>/<name>`` or ``jre-blob://file/<sha256>/<name>``. The manifest
lists each tree's files as ``[rel, mode, size, sha256]`` (the read-only mode of its blob).
A node asks for the blobs its own store lacks, receives each once, lays the trees out below
its cache root
(``dask/trees/<digest>/<name>``, hardlinks to its blobs) and parses the spec with the
placeholders replaced by those paths: no node ever reads a path of the driver.

A node trusts a manifest no more than a blob: whoever can reach the scheduler can send one.
Before any path is made from it (``Manifest.from_json`` checks it whole), a placeholder's
kind must be ``tree`` or ``file``, its key a sha256 the manifest lists, its name one plain
path component; a listing's paths plain relative paths (no ``..``, ``.``, empty or absolute
part, no NUL), its digests sha256s, its sizes counts and its modes read-only blob modes.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..plugins import _sources
from ..plugins._hashing import FileEntry, Tree, blob_mode, hash_file, hash_tree
from ..plugins._store import BLOB_MTIME_NS, blob_dir, blob_path, ensure_stored, materialize
from ..spec import RuntimeEnvSpec
from ..spec.files import BadFile
from ..spec.model import canonical_dumps
from ..spec.patterns import PatternError

PREFIX = "jre-blob://"
#: What may follow a blob's sha256: nothing (0444), ``x`` (0555) or ``m`` and a read-only mode.
_BLOB_MODE = re.compile(r"|x|m([0-7]{3})")

__all__ = [
    "Manifest",
    "build_manifest",
    "entries_of",
    "is_blob_name",
    "materialize_manifest",
    "missing",
    "put_blob",
]


@dataclass
class Manifest:
    """A spec with placeholders for local content, and the content's listing.

    ``token`` names it (the sha256 of the rest): the same spec and content give the same
    token, so a node that has it staged skips the transfer.
    """

    spec: dict[str, Any]
    trees: dict[str, list[list[Any]]] = field(default_factory=dict)
    files: dict[str, list[Any]] = field(default_factory=dict)
    token: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec, "trees": self.trees, "files": self.files, "token": self.token}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        """The manifest ``data`` (from another process), checked: ``ValueError`` naming the
        first entry that is not what a driver makes."""
        if not isinstance(data, dict):
            raise ValueError("manifest: expected a JSON object")
        manifest = cls(data["spec"], data["trees"], data["files"], data["token"])
        manifest.check()
        return manifest

    def check(self) -> None:
        """``ValueError`` unless every placeholder and listing is plain (see the module)."""
        if not isinstance(self.spec, dict) or not isinstance(self.trees, dict):
            raise ValueError("manifest: spec and trees must be objects")
        if not isinstance(self.files, dict):
            raise ValueError("manifest: files must be an object")
        for key, listing in self.trees.items():
            _check_sha(key, f"trees.{key[:80]}")
            if not isinstance(listing, list):
                raise ValueError(f"manifest: trees.{key}: expected a list of files")
            for i, item in enumerate(listing):
                _check_item(item, f"trees.{key}[{i}]")
        for key, item in self.files.items():
            _check_sha(key, f"files.{key[:80]}")
            if not isinstance(item, list) or len(item) != 2:
                raise ValueError(f"manifest: files.{key}: expected [size, mode]")
            _check_item(["file", item[1], item[0], key], f"files.{key}")
        for field_name in ("working_dir", "py_modules", "driver_sys_path"):
            values = self.spec.get(field_name)
            for value in values if isinstance(values, list) else [values]:
                if isinstance(value, str) and value.startswith(PREFIX):
                    _check_placeholder(value, self, field_name)

    def blobs(self) -> dict[str, int]:
        """Every blob the manifest needs: name -> size."""
        out: dict[str, int] = {}
        for entries in self.trees.values():
            for entry in entries_of(entries, Path()):
                out[entry.blob_name] = entry.size
        for sha, (size, mode) in self.files.items():
            out[FileEntry("", "", int(mode), int(size), sha).blob_name] = int(size)
        return out

    @property
    def size(self) -> int:
        return sum(self.blobs().values())


# -- the driver ---------------------------------------------------------------------------


def build_manifest(spec: RuntimeEnvSpec, store_root: Path) -> Manifest:
    """Hash the local content ``spec`` names and store it under ``store_root``. Blocking.

    ``spec`` is resolved for the driver (``driver_sys_path`` a list). ``SpecError`` naming
    the field when a directory is over the upload limit.
    """
    data = spec.to_json()
    manifest = Manifest(data)
    local = _Collector(manifest, store_root, spec.excludes, _sources.max_bytes(None))
    if isinstance(data.get("working_dir"), str):
        data["working_dir"] = local.add(data["working_dir"], "working_dir")
    if isinstance(data.get("py_modules"), list):
        data["py_modules"] = [
            local.add(loc, f"py_modules.{i}") for i, loc in enumerate(data["py_modules"])
        ]
    if isinstance(data.get("driver_sys_path"), list):
        data["driver_sys_path"] = [
            local.add(entry, f"driver_sys_path.{i}")
            for i, entry in enumerate(data["driver_sys_path"])
            if os.path.isdir(entry) or os.path.isfile(entry)  # a missing entry does nothing
        ]
    manifest.token = hashlib.sha256(
        canonical_dumps([data, manifest.trees, manifest.files]).encode()
    ).hexdigest()
    return manifest


@dataclass
class _Collector:
    manifest: Manifest
    store_root: Path
    excludes: list[str]
    limit: int

    def add(self, location: str, field: str) -> str:
        """The placeholder for ``location``, its content hashed, listed and stored;
        ``SpecError`` naming ``field`` for a file that is not read (a FIFO, /proc) or a
        ``.gitignore`` past its bounds."""
        try:
            return self._add(location, field)
        except (BadFile, PatternError) as exc:
            raise SpecError(field, str(exc)) from None

    def _add(self, location: str, field: str) -> str:
        if _sources.kind_of(location) in ("url", "remote"):
            return location  # http(s) or fsspec: the node fetches it itself
        name = os.path.basename(location.rstrip(os.sep)) or "root"
        if os.path.isfile(location):
            st = os.stat(location)
            if st.st_size > self.limit:
                raise SpecError(field, f"{location} is {st.st_size} bytes, {self._over()}")
            sha = hash_file(location, st)
            entry = FileEntry(name, location, blob_mode(st.st_mode), st.st_size, sha)
            ensure_stored([entry], self.store_root)
            self.manifest.files[sha] = [entry.size, entry.mode]
            return f"{PREFIX}file/{sha}/{name}"
        hint = " (or set driver_sys_path: false)" if field.startswith("driver_sys") else ""
        hint += f", or raise the limit (${_sources.MAX_BYTES_VAR})"
        # One pass: the content read to hash it is stored from the same read.
        store = str(blob_dir(self.store_root))
        tree = hash_tree(
            location, self.excludes, limit=self.limit, field=field, hint=hint, store=store
        )
        ensure_stored(tree.entries, self.store_root)
        listing = [[e.rel, e.mode, e.size, e.sha256] for e in tree.entries]
        self.manifest.trees[tree.digest] = listing
        return f"{PREFIX}tree/{tree.digest}/{name}"

    def _over(self) -> str:
        return f"over the upload limit of {self.limit} bytes ({_sources.MAX_BYTES_VAR})"


def _plain_name(name: Any) -> bool:
    return (
        isinstance(name, str)
        and 0 < len(name) <= 255
        and name not in (".", "..")
        and "/" not in name
        and "\0" not in name
    )


def _plain_rel(rel: Any) -> bool:
    return isinstance(rel, str) and len(rel) <= 4096 and all(map(_plain_name, rel.split("/")))


def _check_sha(value: Any, where: str) -> None:
    if not (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    ):
        raise ValueError(f"manifest: {where}: not a sha256")


def _check_item(item: Any, where: str) -> None:
    """``[rel, mode, size, sha256]`` of a tree (``files`` entries come with rel ``file``)."""
    if not isinstance(item, list) or len(item) != 4:
        raise ValueError(f"manifest: {where}: expected [path, mode, size, sha256]")
    rel, mode, size, sha = item
    if not _plain_rel(rel):
        raise ValueError(f"manifest: {where}: {str(rel)[:200]!r} is not a plain relative path")
    for number, what in ((mode, "mode"), (size, "size")):
        if not isinstance(number, int) or isinstance(number, bool) or number < 0:
            raise ValueError(f"manifest: {where}: the {what} is not a count")
    _check_sha(sha, where)
    if not is_blob_name(FileEntry("", "", mode, size, sha).blob_name):
        raise ValueError(f"manifest: {where}: mode {mode:o} is not a read-only blob mode")


def _check_placeholder(value: str, manifest: Manifest, where: str) -> None:
    kind, _, rest = value[len(PREFIX) :].partition("/")
    key, _, name = rest.partition("/")
    listed = manifest.trees if kind == "tree" else manifest.files if kind == "file" else None
    if listed is None or key not in listed or not _plain_name(name):
        raise ValueError(
            f"manifest: {where}: {value[:200]!r} is not a placeholder of a listed tree or file"
            " with a plain name"
        )


def read_blob(store_root: Path, name: str) -> bytes:
    """A blob's bytes from the driver's store. Blocking."""
    return blob_path(store_root, name).read_bytes()


# -- the node -----------------------------------------------------------------------------


def missing(manifest: Manifest, cache_root: Path) -> list[str]:
    """The blobs of ``manifest`` this node's store lacks. Blocking."""
    out = []
    for name, size in manifest.blobs().items():
        try:
            st = os.stat(blob_path(cache_root, name))
        except FileNotFoundError:
            out.append(name)
            continue
        if st.st_size != size or st.st_mtime_ns != BLOB_MTIME_NS:
            out.append(name)
    return sorted(out)


def is_blob_name(name: str) -> bool:
    """Whether ``name`` is a blob's name: a sha256, then nothing, ``-x`` or ``-m`` and a
    read-only mode. Checked before any path is made from a name that came over the network."""
    sha, _, flag = name.partition("-")
    mode = _BLOB_MODE.fullmatch(flag)
    if len(sha) != 64 or mode is None or any(c not in "0123456789abcdef" for c in sha):
        return False
    return not (mode[1] and int(mode[1], 8) & 0o7222)


def put_blob(cache_root: Path, name: str, data: bytes) -> None:
    """Store a received blob, after checking it is what its name says. Blocking."""
    sha, _, flag = name.partition("-")
    mode = _BLOB_MODE.fullmatch(flag)
    if not is_blob_name(name) or mode is None:
        raise ValueError(f"not a blob name (or a writable one): {name!r}")
    if hashlib.sha256(data).hexdigest() != sha:
        raise ValueError(f"blob {name} arrived with other content")
    blob = blob_path(cache_root, name)
    blob.parent.mkdir(parents=True, exist_ok=True)
    tmp = blob.with_name(f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    try:
        tmp.write_bytes(data)
        os.chmod(tmp, 0o555 if flag == "x" else int(mode[1], 8) if mode[1] else 0o444)
        os.utime(tmp, ns=(BLOB_MTIME_NS, BLOB_MTIME_NS))
        os.replace(tmp, blob)
    finally:
        tmp.unlink(missing_ok=True)


def materialize_manifest(manifest: Manifest, cache_root: Path) -> dict[str, Any]:
    """Lay out the manifest's trees and files on this node; the spec with node paths.

    Every blob must be in the node's store (``missing`` is empty). Blocking.
    """
    base = cache_root / "dask"

    def place(value: Any) -> Any:
        if isinstance(value, list):
            return [place(v) for v in value]
        if not isinstance(value, str) or not value.startswith(PREFIX):
            return value
        kind, key, name = value[len(PREFIX) :].split("/", 2)
        if kind == "tree":
            target = base / "trees" / key / name
            if not target.is_dir():
                entries = entries_of(manifest.trees[key], cache_root)
                _atomically(target, lambda tmp: materialize(Tree(key, entries), cache_root, tmp))
            return str(target)
        size, mode = manifest.files[key]
        target = base / "files" / key / name
        if not target.is_file():
            blob = blob_path(cache_root, FileEntry("", "", mode, size, key).blob_name)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".tmp-{uuid.uuid4().hex}")
            try:
                os.link(blob, tmp)
            except OSError:
                shutil.copy2(blob, tmp)
            os.replace(tmp, target)
        return str(target)

    spec = dict(manifest.spec)
    for key in ("working_dir", "py_modules", "driver_sys_path"):
        if key in spec:
            spec[key] = place(spec[key])
    return spec


def entries_of(listing: Iterable[list[Any]], cache_root: Path) -> tuple[FileEntry, ...]:
    """A listing's entries, each with its blob in ``cache_root`` as the source."""
    out = []
    for rel, mode, size, sha in listing:
        entry = FileEntry(str(rel), "", int(mode), int(size), str(sha))
        out.append(replace(entry, source=str(blob_path(cache_root, entry.blob_name))))
    return tuple(out)


def _atomically(target: Path, fill: Any) -> None:
    """Fill a fresh directory and rename it to ``target`` (a concurrent twin may win)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        fill(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
