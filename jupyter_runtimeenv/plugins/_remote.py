"""Remote URIs through fsspec: ``s3://``, ``gs://``, ``file://``, ``abfs://``... (any protocol
whose fsspec implementation is installed; ``s3fs`` and ``gcsfs`` come with the ``s3`` and
``gcs`` extras). ``http(s)://`` keeps its own downloader (``_fetch``: no aiohttp needed).

Who calls it: ``_sources`` (``working_dir``, ``py_modules``: ``stat`` at parse time for the
env id, ``fetch`` in ``create``), ``_requirements`` and ``conda`` (``read_text`` of a remote
requirements or environment file at parse time). Everything here blocks but ``fetch``, which
holds one of the agent's download slots and runs the transfer in a thread.

A remote object enters the env id and its resource URI by its URI *and* its version: the
object's ETag (S3, GCS), version id or generation, else its mtime and size. An unchanged
object is therefore never fetched twice, and a changed one makes a new environment.

Credentials come from where the protocol's library looks (environment variables, config
files, instance metadata); none is ever logged, and URIs are logged without user info or
query strings. Errors are one line naming the URI: not found, access denied, no credentials.
"""

from __future__ import annotations

import hashlib
import os
import threading
import urllib.parse
from pathlib import Path
from typing import Any

from ..errors import BuildError, SpecError
from ..redact import redact_url
from ..spec.files import MAX_TEXT_BYTES
from ..spec.ray import gcs_uri_reason
from .base import BuildContext

#: Where a protocol's implementation comes from, for the install hint.
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}
_LOCAL_SCHEMES = ("http", "https")
#: Variables the stores' libraries read credentials and endpoints from.
_CREDENTIAL_PREFIXES = ("AWS_", "GOOGLE_", "GCE_", "GCS", "AZURE_", "FSSPEC_", "BOTO")
_instances: dict[tuple[Any, ...], Any] = {}
_lock = threading.Lock()
#: Keys of fsspec's info() that identify an object's version, best first.
_VERSION_KEYS = ("VersionId", "ETag", "etag", "generation", "md5Hash", "crc32c", "sha256")

__all__ = [
    "check_protocol",
    "describe_error",
    "digest_of",
    "fetch",
    "is_remote",
    "local_path",
    "read_text",
    "redact",
    "stat",
    "version_of",
]


class _Cancelled(Exception):
    pass


class _Unsupported(Exception):
    pass


def is_remote(value: str) -> bool:
    """Whether ``value`` is a URI fsspec handles (any ``scheme://`` but http(s))."""
    scheme, sep, _ = value.partition("://")
    return bool(sep) and scheme.lower() not in _LOCAL_SCHEMES and scheme.isidentifier()


def local_path(uri: str) -> str | None:
    """The local path a ``file:`` (or fsspec ``local://``) URI names; None for the others."""
    try:
        parts = urllib.parse.urlsplit(uri)
    except ValueError:
        return None
    if parts.scheme.lower() not in ("file", "local"):
        return None
    # urllib.request (http.client, ssl, email) only for a file: URI: parsing a pip spec
    # asks every requirement whether it is remote (the CLI's start, a kernel's first spec).
    from urllib.request import url2pathname

    return url2pathname(parts.path) or "/"


#: ``uri`` without user info, query or fragment: what logs and errors show.
redact = redact_url


def _filesystem(uri: str) -> tuple[Any, str]:
    import fsspec

    scheme = uri.split("://", 1)[0]
    try:
        cls = fsspec.get_filesystem_class(scheme)
    except ImportError as exc:
        extra = _EXTRAS.get(scheme)
        hint = f" (pip install 'jupyter-runtimeenv[{extra}]')" if extra else ""
        raise _Unsupported(f"the {scheme}:// protocol needs a package: {exc}{hint}") from None
    except ValueError:
        raise _Unsupported(f"no fsspec implementation of {scheme}:// is known") from None
    options = cls._get_kwargs_from_urls(uri)
    path = cls._strip_protocol(uri)
    # One instance per protocol, options and credential variables (a new S3 client costs
    # ~0.5 s; setting AWS_* in the notebook after a failure must take effect). Not fsspec's
    # own instance cache, which ignores the environment. Its listing cache could hide a
    # changed object, so what we ask about is dropped from it.
    key = (scheme, repr(sorted(options.items())), _credential_env())
    with _lock:
        fs = _instances.get(key)
        if fs is None:
            if len(_instances) > 32:
                _instances.clear()
            fs = _instances[key] = cls(skip_instance_cache=True, **options)
    fs.invalidate_cache(path)
    return fs, path


def _credential_env() -> tuple[tuple[str, str], ...]:
    """The credential-like variables, values hashed (a key, not a copy of secrets)."""
    return tuple(
        sorted(
            (name, hashlib.sha256(value.encode()).hexdigest())
            for name, value in os.environ.items()
            if name.startswith(_CREDENTIAL_PREFIXES)
        )
    )


def _forget_instances() -> None:
    """After a failure: the next attempt starts from fresh clients (e.g. refreshed tokens)."""
    with _lock:
        _instances.clear()


def describe_error(exc: BaseException) -> str:
    """One line for what went wrong talking to the store; never a credential."""
    name = type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return "not found (no such object or bucket)"
    if isinstance(exc, PermissionError):
        return "access denied"
    if "NoCredentials" in name or "CredentialRetrieval" in name or "DefaultCredentials" in name:
        return (
            "no credentials found (looked where the protocol's library looks: environment"
            " variables, config files, instance metadata)"
        )
    if isinstance(exc, _Unsupported):
        return str(exc)
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{name}: {text[:200]}" if text else name


def version_of(info: dict[str, Any]) -> str:
    """What identifies this version of an object in fsspec's ``info``."""
    for key in _VERSION_KEYS:
        if info.get(key):
            return f"{key}={str(info[key]).strip(chr(34))}"
    stamp = info.get("mtime") or info.get("LastModified") or info.get("updated") or ""
    return f"mtime={stamp};size={info.get('size')}"


def check_protocol(uri: str, field: str) -> None:
    """``SpecError`` if no fsspec implementation of ``uri``'s protocol is installed."""
    import fsspec

    scheme = uri.split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(scheme)
    except (ImportError, ValueError) as exc:
        error = exc
    else:
        return
    try:
        _filesystem(uri)
    except _Unsupported as exc:
        raise SpecError(field, f"{redact(uri)}: {exc}") from None
    raise SpecError(field, f"{redact(uri)}: {error}")  # pragma: no cover


def stat(uri: str, field: str) -> tuple[str, int]:
    """(version tag, size) of the object at ``uri``; ``SpecError`` naming field and URI."""
    try:
        fs, path = _filesystem(uri)
        info = fs.info(path)
    except Exception as exc:
        _forget_instances()
        raise SpecError(field, f"{redact(uri)}: {describe_error(exc)}") from None
    if info.get("type") == "directory":
        raise SpecError(field, f"{redact(uri)}: is a directory; give an archive (.zip, .tar.gz)")
    _check_file(info, uri, field)
    return version_of(info), int(info.get("size") or 0)


def _check_file(info: dict[str, Any], uri: str, field: str) -> None:
    # file:// (and any protocol that says so) can name a FIFO or a device: never read one.
    kind = info.get("type")
    if kind not in (None, "file"):
        raise SpecError(field, f"{redact(uri)}: is {kind!s:.40}, not a regular file")


def digest_of(uri: str, tag: str) -> str:
    return "remote:" + hashlib.sha256(f"{uri}\0{tag}".encode()).hexdigest()[:40]


def read_text(uri: str, field: str) -> str:
    """The text of a small remote file (a requirements or environment file)."""
    ray_gcs = gcs_uri_reason(uri)
    if ray_gcs:
        raise SpecError(field, ray_gcs)
    try:
        fs, path = _filesystem(uri)
        info = fs.info(path)
    except Exception as exc:
        _forget_instances()
        raise SpecError(field, f"{redact(uri)}: {describe_error(exc)}") from None
    _check_file(info, uri, field)
    size = int(info.get("size") or 0)
    if size > MAX_TEXT_BYTES:
        raise SpecError(field, f"{redact(uri)}: {size} bytes; at most {MAX_TEXT_BYTES} are read")
    try:
        with fs.open(path, "rb") as f:
            data: bytes = f.read(MAX_TEXT_BYTES + 1)
    except Exception as exc:
        _forget_instances()
        raise SpecError(field, f"{redact(uri)}: {describe_error(exc)}") from None
    if len(data) > MAX_TEXT_BYTES:
        raise SpecError(field, f"{redact(uri)}: more than {MAX_TEXT_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(field, f"{redact(uri)}: is not UTF-8 text") from None


async def fetch(
    uri: str, dest: Path, expected: str, build: BuildContext, *, limit: int | None = None
) -> int:
    """Download ``uri`` to ``dest`` if it still is the version ``expected`` (its digest);
    ``BuildError`` past ``limit`` bytes."""
    import asyncio  # the build's loop runs: imported already

    async with build.limit("download"):
        cancel = threading.Event()
        try:
            size = await build.to_thread(_download, uri, dest, expected, cancel, limit)
        except asyncio.CancelledError:
            cancel.set()  # the thread stops at its next chunk
            raise
    build.log(f"downloaded {redact(uri)} ({size} bytes)")
    return size


def _download(
    uri: str, dest: Path, expected: str, cancel: threading.Event, limit: int | None = None
) -> int:
    try:
        fs, path = _filesystem(uri)
        info = fs.info(path)
        if digest_of(uri, version_of(info)) != expected:
            raise BuildError(
                f"{redact(uri)} changed after the spec was parsed; parse the spec again"
            )
        if info.get("type") not in (None, "file"):
            raise BuildError(f"{redact(uri)} is not a regular file")
        size = 0
        with fs.open(path, "rb") as src, open(dest, "wb") as out:
            while chunk := src.read(1 << 20):
                if cancel.is_set():
                    raise _Cancelled
                size += len(chunk)
                if limit is not None and size > limit:
                    raise BuildError(
                        f"{redact(uri)} is larger than the limit of {limit / 2**20:.1f} MiB"
                        " (the plugin's max_bytes, $JUPYTER_RUNTIMEENV_MAX_UPLOAD_BYTES)"
                    )
                out.write(chunk)
        return size
    except (BuildError, _Cancelled):
        raise
    except Exception as exc:
        _forget_instances()
        raise BuildError(f"cannot download {redact(uri)}: {describe_error(exc)}") from None
