"""Which uv cache an agent's installs use (issue 19 item 4): the user's own when it is on the
cache root's filesystem, a private one below the cache root otherwise; real uv installs from
the test wheelhouse into a real venv, files compared by inode."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.errors import BuildError
from jupyter_runtimeenv.plugins._uv import UV_CACHE_VAR, uv_cache
from jupyter_runtimeenv.plugins.pip import venv_site_packages

Agent = Callable[..., Any]


@pytest.fixture
def user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A uv cache of 'the user' on the cache root's filesystem, the choice left at its default."""
    path = tmp_path / "home-cache" / "uv"
    monkeypatch.setenv("UV_CACHE_DIR", str(path))
    monkeypatch.delenv(UV_CACHE_VAR, raising=False)
    return path


@pytest.fixture
def other_fs_dir() -> Iterator[Path]:
    """A directory on another filesystem than the tests' temp dirs (/dev/shm is a tmpfs)."""
    if (
        not os.path.isdir("/dev/shm")
        or os.stat("/dev/shm").st_dev == os.stat(tempfile.gettempdir()).st_dev
    ):
        pytest.skip("no second filesystem here (/dev/shm is the temp dir's)")
    path = Path(tempfile.mkdtemp(prefix="jre-uvcache-", dir="/dev/shm"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _inodes(root: Path) -> set[tuple[int, int]]:
    return {(p.stat().st_dev, p.stat().st_ino) for p in root.rglob("*") if p.is_file()}


def test_the_choice_follows_uv_and_the_filesystem(
    tmp_path: Path, other_fs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    private = root / "shared" / "uv"
    # $UV_CACHE_DIR first, then $XDG_CACHE_HOME/uv, then ~/.cache/uv (uv's own order).
    env = {"UV_CACHE_DIR": str(tmp_path / "a"), "XDG_CACHE_HOME": str(tmp_path / "x")}
    assert uv_cache(root, env) == (tmp_path / "a", "the user's uv cache")
    assert uv_cache(root, {"XDG_CACHE_HOME": str(tmp_path / "x"), "HOME": "/nonexistent"})[0] == (
        tmp_path / "x" / "uv"
    )
    assert uv_cache(root, {"HOME": str(tmp_path / "h")})[0] == tmp_path / "h" / ".cache" / "uv"
    # A relative UV_CACHE_DIR is the agent's directory's (uv runs in the venv's).
    monkeypatch.chdir(tmp_path)
    assert uv_cache(root, {"UV_CACHE_DIR": "rel"})[0] == tmp_path / "rel"
    # Asked for, or on another filesystem (hard links would fail): the private one, and why.
    assert uv_cache(root, {**env, UV_CACHE_VAR: "private"})[0] == private
    path, why = uv_cache(root, {"UV_CACHE_DIR": str(other_fs_dir / "uv")})
    assert path == private
    assert "another filesystem" in why
    assert str(other_fs_dir / "uv") in why
    with pytest.raises(BuildError, match=f"{UV_CACHE_VAR}='shared': must be 'user' or 'private'"):
        uv_cache(root, {UV_CACHE_VAR: "shared"})


async def test_an_env_hardlinks_from_the_users_uv_cache(
    make_agent: Agent, cache_dir: Path, user_cache: Path
) -> None:
    agent = await make_agent()
    ctx = await agent.get_or_create({"pip": ["gamma"]}, "t")
    log = await agent.log(ctx.env_id)
    assert f"uv cache: {user_cache} (the user's uv cache)" in log
    assert not (cache_dir / "shared" / "uv").exists()  # nothing downloaded twice
    site = venv_site_packages(Path(ctx.python).parent.parent)
    installed = {p for p in site.rglob("*.py") if "alpha" in p.parts or "beta" in p.parts}
    assert installed
    # Each installed file is the cache's own file (a hard link), not a copy.
    assert {(p.stat().st_dev, p.stat().st_ino) for p in installed} <= _inodes(user_cache)


async def test_a_user_cache_on_another_filesystem_is_left_alone(
    make_agent: Agent, cache_dir: Path, other_fs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = other_fs_dir / "uv"
    monkeypatch.setenv("UV_CACHE_DIR", str(theirs))
    monkeypatch.delenv(UV_CACHE_VAR, raising=False)
    agent = await make_agent()
    ctx = await agent.get_or_create({"pip": ["gamma"]}, "t")
    log = await agent.log(ctx.env_id)
    assert f"the user's uv cache {theirs} is on another filesystem" in log
    assert not theirs.exists()
    site = venv_site_packages(Path(ctx.python).parent.parent)
    installed = {p for p in site.rglob("*.py") if "alpha" in p.parts}
    assert installed
    assert {(p.stat().st_dev, p.stat().st_ino) for p in installed} <= _inodes(
        cache_dir / "shared" / "uv"
    )
