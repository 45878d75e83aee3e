"""Where the installers are and the environment they run with.

Who calls it: ``pip`` (venvs and installs) and ``py_modules`` (wheels), in their ``create``.
uv ships as a wheel (a dependency of this package), so it is always there; its package
cache is shared by every environment of one cache root and installs hardlink from it.

Which package cache (``uv_cache``): the user's own uv cache (``$UV_CACHE_DIR``, else uv's
default ``$XDG_CACHE_HOME/uv`` or ``~/.cache/uv``) when it is on the cache root's filesystem
and writable, so wheels uv already has are not downloaded again and envs hardlink from the
same files; else (another filesystem: hard links would fail and uv would copy every file;
or ``$JUPYTER_RUNTIMEENV_UV_CACHE=private``) a private one below the cache root.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from functools import cache
from pathlib import Path

from ..errors import BuildError

__all__ = ["UV_CACHE_VAR", "installer_env", "uv_bin", "uv_cache"]

#: ``user`` (the default: the user's uv cache where it can hardlink) or ``private``.
UV_CACHE_VAR = "JUPYTER_RUNTIMEENV_UV_CACHE"


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


def _user_uv_cache(environ: Mapping[str, str]) -> Path | None:
    """The cache uv itself would use for this user (a ``cache-dir`` in a uv.toml is not
    read: ``$UV_CACHE_DIR`` is how to name one here); ``None`` when there is no home."""
    if environ.get("UV_CACHE_DIR"):
        # Relative to the agent's directory, not the venv that uv runs in.
        return Path(environ["UV_CACHE_DIR"]).expanduser().absolute()
    if environ.get("XDG_CACHE_HOME") and os.path.isabs(environ["XDG_CACHE_HOME"]):
        return Path(environ["XDG_CACHE_HOME"]) / "uv"
    home = Path(environ.get("HOME") or os.path.expanduser("~"))
    return home / ".cache" / "uv" if home.is_absolute() else None


def _device(path: Path) -> int | None:
    """The filesystem of ``path``, or of its nearest existing parent (uv makes the rest)."""
    for candidate in (path, *path.parents):
        try:
            return candidate.stat().st_dev
        except FileNotFoundError:
            continue
        except OSError:
            return None
    return None


def _writable(path: Path) -> bool:
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    return existing is not None and os.access(existing, os.W_OK | os.X_OK)


def uv_cache(cache_root: Path, environ: Mapping[str, str] | None = None) -> tuple[Path, str]:
    """The uv cache the agent's installs use, and why (for the build log)."""
    environ = os.environ if environ is None else environ
    private = cache_root / "shared" / "uv"
    choice = environ.get(UV_CACHE_VAR, "user").strip().lower() or "user"
    if choice == "private":
        return private, f"private, as {UV_CACHE_VAR}=private asks"
    if choice != "user":
        raise BuildError(f"{UV_CACHE_VAR}={environ[UV_CACHE_VAR]!r}: must be 'user' or 'private'")
    user = _user_uv_cache(environ)
    if user is None:
        return private, "private: this user has no home for uv's cache"
    mine, theirs = _device(cache_root), _device(user)
    if mine is None or mine != theirs:
        return private, f"private: the user's uv cache {user} is on another filesystem"
    if not _writable(user):
        return private, f"private: the user's uv cache {user} is not writable"
    return user, "the user's uv cache"


def installer_env(cache_root: Path) -> dict[str, str]:
    """The agent's environment plus the shared caches and settings of uv and pip.

    The caller's own ``UV_*``/``PIP_*`` settings (an index URL, ``--find-links`` in tests)
    pass through; only the caches and the link mode are set here.
    """
    shared = cache_root / "shared"
    env = dict(os.environ)
    env["UV_CACHE_DIR"] = str(uv_cache(cache_root, env)[0])
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
