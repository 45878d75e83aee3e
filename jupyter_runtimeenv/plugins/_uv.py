"""Where the installers are and the environment they run with.

Who calls it: ``pip`` (venvs and installs) and ``py_modules`` (wheels), in their ``create``.
uv ships as a wheel (a dependency of this package), so it is always there; its package
cache is shared by every environment of one cache root and installs hardlink from it.
"""

from __future__ import annotations

import os
import shutil
from functools import cache
from pathlib import Path

from ..errors import BuildError

__all__ = ["installer_env", "uv_bin"]


@cache
def uv_bin() -> str:
    """The uv executable: the one shipped with the ``uv`` wheel, else one on PATH."""
    try:
        import uv

        found: str | None = uv.find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
    if not found:
        raise BuildError("uv is not installed: install the 'uv' package or set config.installer")
    return found


def installer_env(cache_root: Path) -> dict[str, str]:
    """The agent's environment plus the shared caches and settings of uv and pip.

    The caller's own ``UV_*``/``PIP_*`` settings (an index URL, ``--find-links`` in tests)
    pass through; only the caches and the link mode are set here.
    """
    shared = cache_root / "shared"
    env = dict(os.environ)
    env["UV_CACHE_DIR"] = str(shared / "uv")
    # Hardlinks from the cache: a second env with the same packages costs links, not copies.
    env.setdefault("UV_LINK_MODE", "hardlink")
    env.setdefault("UV_PYTHON_DOWNLOADS", "never")
    env["PIP_CACHE_DIR"] = str(shared / "pip")
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")  # live output from pip and build backends
    # uv shows a build backend's output only when the build fails; its build frontend's debug
    # log carries each line as the backend writes it ("DEBUG <line>"), and nothing else of
    # uv's debug output is turned on. An sdist that builds for minutes then shows its progress.
    env.setdefault("RUST_LOG", "uv_build_frontend=debug")
    # A VIRTUAL_ENV of the agent's own process must not redirect installs.
    env.pop("VIRTUAL_ENV", None)
    env.pop("CONDA_PREFIX", None)
    env["NO_COLOR"] = "1"
    return env
