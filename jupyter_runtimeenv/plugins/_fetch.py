"""Downloading a ``working_dir`` or ``py_modules`` archive from an http(s) URL.

Who calls it: those plugins' ``create``. The transfer runs in a thread (urllib: no new
dependency) while holding one of the agent's download slots; transient failures (connection
errors, 5xx, 429) are retried with backoff, client errors (404, 403) are not.
"""

from __future__ import annotations

import asyncio
import threading
import urllib.error
import urllib.request
from pathlib import Path

from ..errors import BuildError
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
    retries: int = RETRIES,
    backoff: float = BACKOFF_SECONDS,
) -> int:
    """Download ``url`` to the file ``dest``; returns its size. ``BuildError`` on failure."""
    async with build.limit("download"):
        for attempt in range(1, retries + 1):
            cancel = threading.Event()
            try:
                size = await build.to_thread(_download, url, dest, cancel)
            except asyncio.CancelledError:
                cancel.set()  # the thread stops at its next chunk
                raise
            except _Transient as exc:
                if attempt == retries:
                    raise BuildError(
                        f"cannot download {url}: {exc} (tried {retries} times)"
                    ) from None
                delay = backoff * 2 ** (attempt - 1)
                build.log(f"download of {url} failed: {exc}; retrying in {delay:g} s")
                await asyncio.sleep(delay)
                continue
            build.log(f"downloaded {url} ({size} bytes)")
            return size
    raise AssertionError("unreachable")  # pragma: no cover


def _download(url: str, dest: Path, cancel: threading.Event) -> int:
    request = urllib.request.Request(url, headers={"User-Agent": "jupyter-runtimeenv"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            size = 0
            with open(dest, "wb") as out:
                while chunk := response.read(1 << 20):
                    if cancel.is_set():
                        raise _Transient("cancelled")
                    out.write(chunk)
                    size += len(chunk)
            return size
    except urllib.error.HTTPError as exc:
        status = f"HTTP {exc.code} {exc.reason}"
        if exc.code >= 500 or exc.code in (408, 429):
            raise _Transient(status) from None
        raise BuildError(f"cannot download {url}: {status}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        cause = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise _Transient(str(cause)) from None
