"""Relative paths in a spec are relative to the file it came from, or to the cwd."""

from __future__ import annotations

import contextvars
import os
import shutil
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


def find_executable(value: str) -> str | None:
    """The absolute path of an executable given as a path (relative to the spec's base
    directory) or as a command on ``PATH``; None if there is none."""
    path = resolve_path(value) if os.sep in value else shutil.which(value)
    if path is None or not os.path.isfile(path) or not os.access(path, os.X_OK):
        return None
    return path


@contextmanager
def base_dir(path: str | None) -> Iterator[None]:
    token = _base_dir.set(path)
    try:
        yield
    finally:
        _base_dir.reset(token)
