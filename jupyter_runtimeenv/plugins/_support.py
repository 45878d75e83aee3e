"""What every worker imports before user code: ``cloudpickle`` and this package.

Who calls it: ``pip`` (isolated venvs) and ``conda`` in their ``create``, through
``build.to_thread``. An environment that does not see the agent's own site-packages gets a
``support`` directory holding symlinks to exactly these two packages — not to the
site-packages they live in, so nothing else leaks into an isolated environment. Both are
pure Python; the worker's cloudpickle is then the driver's own version, which is what
unpickling its tasks needs.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["SUPPORT_PACKAGES", "write_support"]

SUPPORT_PACKAGES = ("cloudpickle", "jupyter_runtimeenv")


def _package_dir(name: str) -> str:
    module = __import__(name)
    return os.path.dirname(os.path.abspath(module.__file__ or ""))


def write_support(dest: Path) -> Path:
    """Create ``dest`` with a symlink per support package; returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in SUPPORT_PACKAGES:
        link = dest / name
        if not link.exists():
            os.symlink(_package_dir(name), link, target_is_directory=True)
    return dest
