"""Local code a spec ships to workers: directories, ``.py`` files, zips, wheels and URLs.

Who calls it: ``working_dir`` and ``py_modules`` — ``normalize`` from ``validate``,
``digest`` from ``identity``/``uris`` (blocking; parse and the agent run them in threads),
``create`` from their ``create``.

A local directory or ``.py`` file enters the env id and its resource URI by the digest of
its content (see ``_hashing``), so moving it keeps the id and editing it makes a new one;
archives enter by the sha256 of the file; URLs by themselves (the URL names the content).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import BuildError, SpecError
from ..spec.files import BadFile
from ..spec.paths import resolve_path
from ..spec.patterns import PatternError
from ..spec.ray import gcs_uri_reason
from . import _downloads, _remote
from ._fetch import fetch
from ._hashing import Tree, hash_file, hash_tree
from ._layout import LayOut
from ._spares import adopt, lay_out, new_layout
from ._store import blob_dir, default_store
from ._unpack import check_zip, flatten_single_dir, safe_unzip
from ._untar import TAR_SUFFIXES, is_tar, safe_untar
from ._uv import installer_env, uv_bin
from .base import BuildContext

#: The variable that names an env's trees to its workers (``workers/_cow.py``).
TREES_VAR = "JUPYTER_RUNTIMEENV_TREES"
#: Default cap on a local directory's size after excludes (Ray's is 500 MiB too).
DEFAULT_MAX_BYTES = 500 * 2**20
MAX_BYTES_VAR = "JUPYTER_RUNTIMEENV_MAX_UPLOAD_BYTES"

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_BYTES_VAR",
    "TREES_VAR",
    "create",
    "digest",
    "env_uri",
    "guard_tree",
    "kind_of",
    "normalize",
    "uri_digest",
]


def is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def kind_of(location: str) -> str:
    """``url`` (http), ``remote`` (fsspec), ``zip``, ``tar``, ``whl``, ``py`` or ``dir``."""
    if is_url(location):
        return "url"
    if _remote.is_remote(location):
        return "remote"
    if is_tar(location) and not os.path.isdir(location):
        return "tar"
    for suffix in ("zip", "whl", "py"):
        if location.endswith("." + suffix) and not os.path.isdir(location):
            return suffix
    return "dir"


def normalize(value: object, field: str, *, kinds: Sequence[str]) -> str:
    """``value`` as an absolute path or a URL; ``SpecError`` (field ``field``) otherwise."""
    if not isinstance(value, str) or not value:
        raise SpecError(field, f"expected a local path or an http(s) URL, got {value!r}")
    if is_url(value):
        if "url" not in kinds:
            raise SpecError(field, "URLs are not accepted here")
        path = value.split("#", 1)[0].split("?", 1)[0]
        if not path.endswith((".zip", ".whl", *TAR_SUFFIXES)):
            raise SpecError(
                field,
                f"{_remote.redact(value)}: URLs must name an archive (.zip, .whl, .tar.gz,"
                " .tgz, .tar), as in Ray",
            )
        return value
    gcs = gcs_uri_reason(value)
    if gcs:
        raise SpecError(field, gcs)
    if _remote.is_remote(value):
        if "url" not in kinds:
            raise SpecError(field, "URIs are not accepted here")
        if not value.split("?", 1)[0].endswith((".zip", ".whl", *TAR_SUFFIXES)):
            raise SpecError(
                field,
                f"{_remote.redact(value)}: remote URIs must name an archive"
                " (.zip, .whl, .tar.gz, .tgz, .tar), as in Ray",
            )
        _remote.check_protocol(value, field)
        return value
    if "://" in value:
        scheme = value.split("://", 1)[0]
        raise SpecError(field, f"{scheme}:// is not a URI scheme any fsspec protocol can take")
    path = resolve_path(value)
    if not os.path.exists(path):
        raise SpecError(field, f"{path} does not exist")
    kind = kind_of(path)
    if kind not in kinds:
        raise SpecError(field, f"{path}: expected {_describe(kinds)}")
    return path


def _describe(kinds: Sequence[str]) -> str:
    names = {
        "dir": "a directory",
        "py": "a .py file",
        "zip": "a .zip file",
        "tar": "a .tar.gz/.tgz/.tar file",
        "whl": "a .whl file",
        "url": "an http(s) URL or a remote URI (s3://, gs://, ...)",
    }
    return ", ".join(names[k] for k in kinds)


def max_bytes(configured: int | None) -> int:
    if configured is not None:
        return configured
    env = os.environ.get(MAX_BYTES_VAR)
    return int(env) if env else DEFAULT_MAX_BYTES


def tree_of(
    location: str,
    excludes: Sequence[str],
    keep_name: bool,
    *,
    limit: int | None = None,
    field: str = "",
    store: str | None = None,
    lay_out: LayOut | None = None,
) -> Tree:
    """The hashed tree at ``location``; over ``limit`` bytes a ``SpecError`` naming ``field``,
    as soon as the walk has counted that much. ``store``, ``lay_out``: see ``hash_tree``."""
    prefix = os.path.basename(location.rstrip(os.sep)) if keep_name else ""
    hint = f", or raise the limit (${MAX_BYTES_VAR})"
    return hash_tree(
        location,
        excludes,
        prefix=prefix,
        limit=limit,
        field=field,
        hint=hint,
        store=store,
        lay_out=lay_out,
    )


def family_of(location: str, keep_name: bool) -> str:
    """The family a spare is kept for: this source, as its field lays it out."""
    return f"{int(keep_name)}:{location}"


# The digest ``identity`` computed last for a source: ``uris`` reuses it, so the resource
# built is the content the env id was made from; if the files changed in between, ``create``
# notices (the content no longer matches) and fails instead of building other code under
# the old id.
_recent: dict[tuple[str, tuple[str, ...], bool], str] = {}
# The last trees hashed, by digest: ``create`` links their blobs without walking the
# directory again. Linking blobs by content gives exactly the hashed tree even if the
# source changed since; content stored anew is checked against its hash while copying.
_trees: dict[str, Tree] = {}


def digest(
    location: str,
    excludes: Sequence[str],
    field: str,
    *,
    keep_name: bool,
    limit: int,
    recall: bool = False,
) -> str:
    """What identifies the content at ``location``: ``kind:sha256`` or the URL.

    Blocking. ``SpecError`` when a local source is larger than ``limit`` bytes, naming its
    largest files. With ``recall``, the digest last computed for the same source is
    returned if there is one.
    """
    key = (location, tuple(excludes), keep_name)
    if recall and key in _recent:
        return _recent[key]
    if len(_recent) > 10_000:
        _recent.clear()
    _recent[key] = found = _digest(location, excludes, field, keep_name=keep_name, limit=limit)
    return found


def _digest(
    location: str, excludes: Sequence[str], field: str, *, keep_name: bool, limit: int
) -> str:
    kind = kind_of(location)
    if kind == "url":
        return f"url:{location}"
    if kind == "remote":
        tag, size = _remote.stat(location, field)
        if size > limit:
            raise SpecError(
                field, f"{_remote.redact(location)} is {_mb(size)}, over the limit of {_mb(limit)}"
            )
        return _remote.digest_of(location, tag)
    if kind in ("zip", "tar", "whl"):
        size = os.path.getsize(location)
        if size > limit:
            raise SpecError(field, f"{location} is {_mb(size)}, over the limit of {_mb(limit)}")
        try:
            return f"{kind}:{hash_file(location)}"
        except BadFile as exc:  # a FIFO named app.zip, a device: never read
            raise SpecError(field, str(exc)) from None
    # One pass: what is read to hash it goes into the store of this process's agent, and a
    # tree read whole is laid out as it is (the source's spare, which its build takes).
    store = default_store()
    layout = None if store is None else new_layout(store)
    try:
        tree = tree_of(
            location, excludes, keep_name, limit=limit, field=field, store=store, lay_out=layout
        )
        if store is not None and layout is not None and layout.done:
            adopt(store, family_of(location, keep_name), tree, layout)
    except (PatternError, BadFile) as exc:  # a .gitignore past its bounds, a FIFO, /proc
        raise SpecError(field, str(exc)) from None
    except BaseException:
        if layout is not None and layout.done:  # made, never adopted: nobody else removes it
            shutil.rmtree(layout.path, ignore_errors=True)
        raise
    _trees[tree.digest] = tree
    while len(_trees) > 16:
        _trees.pop(next(iter(_trees)))
    return f"tree:{tree.digest}"


def env_uri(field: str, digest: str, env_id: str) -> str:
    """The resource URI of ``digest`` for the env ``env_id``: every env gets its own copy of
    its code, so that what its tasks write there reaches no other env (its files are links
    to the content store, guarded in the workers: see ``workers/_cow.py``)."""
    return f"{field}:{digest}@{env_id}"


def uri_digest(uri: str) -> str:
    """The digest an ``env_uri`` was made of."""
    return uri.split(":", 1)[1].rsplit("@", 1)[0]


def guard_tree(env_vars: dict[str, str], path: str) -> None:
    """Name ``path`` in ``TREES_VAR``, so the env's workers copy its shared files before
    writing to them."""
    current = env_vars.get(TREES_VAR)
    env_vars[TREES_VAR] = f"{current}{os.pathsep}{path}" if current else path


def label(location: str, digest: str) -> str:
    """``data/ (3 files)``: a source as a user names it, with its file count when its tree
    was hashed in this process (``digest`` is what ``digest()`` returned)."""
    name = os.path.basename(location.rstrip("/" + os.sep)) or location
    kind = kind_of(location) if not is_url(location) else "url"
    if kind == "url":
        return location if len(location) <= 60 else location[:57] + "..."
    tree = _trees.get(digest.split(":", 1)[-1]) if digest.startswith("tree:") else None
    if kind == "dir":
        name += "/"
    if tree is None:
        return name
    count = len(tree.entries)
    return f"{name} ({count} file{'' if count == 1 else 's'})"


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


async def create(
    location: str,
    expected: str,
    build: BuildContext,
    *,
    keep_name: bool,
    flatten: bool,
    limit: int | None = None,
) -> int:
    """Fill ``build.target`` with the content at ``location``; returns bytes written.

    ``expected`` is the digest the URI was made from: a local tree that changed since then
    fails the build rather than silently giving different code under the same id. A
    download stops past ``limit`` bytes (default ``max_bytes(None)``).
    """
    limit = max_bytes(None) if limit is None else limit
    kind = kind_of(location)
    target = build.target
    if kind in ("url", "remote"):
        name = location.split("?", 1)[0].rsplit("/", 1)[-1] or "download.zip"
        kept = await build.to_thread(_downloads.cached, build.cache_root, expected, name)
        if kept is not None:
            build.log(f"{label(location, expected)}: downloaded before, unpacking a copy")
            return await _unpack_archive(kept, build, flatten=flatten)
        # Beside the target, not in it: the target must hold only the archive's content.
        # Named after the target, so the agent's start-up sweep removes it if we die.
        holder = target.with_name(target.name + ".download")
        try:
            holder.mkdir()
            archive = holder / name
            if kind == "url":
                await fetch(location, archive, build, limit=limit)
            else:
                await _remote.fetch(location, archive, expected, build, limit=limit)
            kept = await build.to_thread(_downloads.keep, build.cache_root, expected, archive)
            return await _unpack_archive(kept, build, flatten=flatten)
        finally:
            await build.to_thread(shutil.rmtree, holder, True)
    if kind in ("zip", "tar", "whl"):
        return await _unpack_archive(Path(location), build, flatten=flatten)
    tree = _trees.get(expected.removeprefix("tree:"))
    if tree is None:  # hashed in another process (or long ago): hash again, and compare
        store = str(blob_dir(build.cache_root))
        tree = await build.to_thread(
            lambda: tree_of(location, build.spec.excludes, keep_name, store=store)
        )
        if f"tree:{tree.digest}" != expected:
            raise BuildError(f"{location} changed after the spec was parsed; parse the spec again")
    family = family_of(location, keep_name)
    stored = await build.to_thread(lay_out, tree, build.cache_root, target, family)
    build.log(
        f"{location}: {len(tree.entries)} files, {_mb(tree.size)};"
        f" {_mb(stored)} new content stored, the rest linked"
    )
    return tree.size


async def _unpack_archive(archive: Path, build: BuildContext, *, flatten: bool) -> int:
    # py_modules (no flatten) installs a wheel; working_dir unpacks it like the zip it is.
    if archive.name.endswith(".whl") and not flatten:
        return await _install_wheel(archive, build)
    unpack = safe_untar if is_tar(archive.name) else safe_unzip
    size = await build.to_thread(unpack, archive, build.target)
    if flatten:
        await build.to_thread(flatten_single_dir, build.target)
    build.log(f"unpacked {archive.name} ({_mb(size)})")
    return size


async def _install_wheel(wheel: Path, build: BuildContext) -> int:
    """Install a wheel's files into the target (its own dependencies belong in ``pip``)."""
    # A wheel is a zip: the installer unpacks it, within the same limits as any archive.
    (await build.to_thread(check_zip, wheel)).close()
    async with build.limit("install"):
        await build.run(
            [
                *(uv_bin(), "pip", "install", "--no-deps", "--python", sys.executable),
                *("--target", str(build.target), str(wheel)),
            ],
            env=installer_env(build.cache_root),
            what=f"installing {wheel.name}",
        )
    return 0
