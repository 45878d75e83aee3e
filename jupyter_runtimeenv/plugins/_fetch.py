"""Downloading a ``working_dir`` or ``py_modules`` archive from an http(s) URL.

Who calls it: those plugins' ``create``. The transfer runs in a thread (urllib: no new
dependency) while holding one of the agent's download slots; transient failures (connection
errors, 5xx, 429) are retried with backoff, client errors (404, 403) are not. A download is
capped (``limit``: the field's ``max_bytes``): an announced ``Content-Length`` past it is
refused before the body is read, and the body stops at the limit otherwise. URLs appear in
logs and errors without user info, query or fragment (``_remote.redact``).
"""

from __future__ import annotations

import threading
from pathlib import Path

from ..errors import BuildError
from ._remote import redact
from .base import BuildContext

RETRIES = 3
BACKOFF_SECONDS = 0.25
TIMEOUT_SECONDS = 60.0

__all__ = ["fetch"]


class _Transient(Exception):
    pass


async def fetch(
    url: str,
    dest: Path,
    build: BuildContext,
    *,
    limit: int | None = None,
    retries: int = RETRIES,
    backoff: float = BACKOFF_SECONDS,
) -> int:
    """Download ``url`` to the file ``dest``; returns its size. ``BuildError`` on failure,
    or past ``limit`` bytes."""
    import asyncio  # here, as urllib in _download: parsing a working_dir spec imports this
    # module (its plugin's), and a CLI build of a cached env must not pay for either.

    shown = redact(url)
    async with build.limit("download"):
        for attempt in range(1, retries + 1):
            cancel = threading.Event()
            try:
                size = await build.to_thread(_download, url, dest, cancel, limit)
            except asyncio.CancelledError:
                cancel.set()  # the thread stops at its next chunk
                raise
            except _Transient as exc:
                if attempt == retries:
                    raise BuildError(
                        f"cannot download {shown}: {exc} (tried {retries} times)"
                    ) from None
                delay = backoff * 2 ** (attempt - 1)
                build.log(f"download of {shown} failed: {exc}; retrying in {delay:g} s")
                await asyncio.sleep(delay)
                continue
            build.log(f"downloaded {shown} ({size} bytes)")
            return size
    raise AssertionError("unreachable")  # pragma: no cover


def too_large(shown: str, limit: int) -> BuildError:
    return BuildError(
        f"{shown} is larger than the limit of {limit / 2**20:.1f} MiB"
        " (the plugin's max_bytes, $JUPYTER_RUNTIMEENV_MAX_UPLOAD_BYTES)"
    )


def _download(url: str, dest: Path, cancel: threading.Event, limit: int | None = None) -> int:
    import urllib.error
    import urllib.request

    shown = redact(url)
    request = urllib.request.Request(url, headers={"User-Agent": "jupyter-runtimeenv"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            announced = response.headers.get("Content-Length", "")
            if limit is not None and announced.isdigit() and int(announced) > limit:
                raise too_large(shown, limit)  # before a byte of the body is read
            size = 0
            with open(dest, "wb") as out:
                while chunk := response.read(1 << 20):
                    if cancel.is_set():
                        raise _Transient("cancelled")
                    size += len(chunk)
                    if limit is not None and size > limit:
                        raise too_large(shown, limit)
                    out.write(chunk)
            return size
    except urllib.error.HTTPError as exc:
        status = f"HTTP {exc.code} {exc.reason}"
        if exc.code >= 500 or exc.code in (408, 429):
            raise _Transient(status) from None
        raise BuildError(f"cannot download {shown}: {status}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        cause = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise _Transient(str(cause)) from None
