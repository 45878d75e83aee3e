"""Relative paths in a spec are relative to the file it came from, or to the cwd."""

from __future__ import annotations

import contextvars
import os
from collections.abc import Iterator
from contextlib import contextmanager

_base_dir: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "spec_base_dir", default=None
)


def resolve_path(path: str) -> str:
    """``path`` made absolute against the spec's base directory; ``~`` expanded."""
    path = os.path.expanduser(path)
    if os.path.isabs(path):
        return os.path.normpath(path)
    return os.path.normpath(os.path.join(_base_dir.get() or os.getcwd(), path))


@contextmanager
def base_dir(path: str | None) -> Iterator[None]:
    token = _base_dir.set(path)
    try:
        yield
    finally:
        _base_dir.reset(token)
