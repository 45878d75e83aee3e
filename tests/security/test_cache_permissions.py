"""Threat: the cache widens access to what it stores (other local users reading env_vars
values in the index, build logs, or a working_dir's owner-only files).

Rules under test (``agent/private.py``, ``plugins/_hashing.blob_mode``): the root is 0700
(created so; an existing wider one of ours is tightened with a warning; anything else is
refused); the index, its WAL/SHM companions and the logs are 0600; a working_dir file that
is owner-only (directly or through a symlink) stays owner-only in the store and never
shares an inode with a wider blob of the same content.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.agent import Cache
from jupyter_runtimeenv.errors import CacheUnavailable
from jupyter_runtimeenv.plugins._hashing import hash_tree

Agent = Callable[..., Any]


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


async def test_a_new_cache_is_owner_only_throughout(make_agent: Agent, tmp_path: Path) -> None:
    root = tmp_path / "new" / "cache"
    agent = await make_agent(cache_dir=root)
    project = tmp_path / "proj"
    project.mkdir()
    (project / "a.py").write_text("A = 1\n")
    await agent.get_or_create({"working_dir": str(project), "env_vars": {"TOKEN": "s3cr3t"}}, "t")

    assert mode(root) == 0o700
    for sub in ("resources", "tmp", "locks", "logs", "shared"):
        assert mode(root / sub) == 0o700, sub
    index = sorted(p.name for p in root.iterdir() if p.name.startswith("index.sqlite"))
    assert index == ["index.sqlite", "index.sqlite-shm", "index.sqlite-wal"]
    for name in index:
        assert mode(root / name) == 0o600, name
    logs = list((root / "logs").iterdir())
    assert logs
    assert {mode(p) for p in logs} == {0o600}


def test_a_wider_cache_of_ours_is_made_owner_only_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cache"
    Cache(root).close()
    os.chmod(root, 0o755)
    os.chmod(root / "index.sqlite", 0o644)  # as older versions left it
    with caplog.at_level(logging.WARNING, logger="jupyter_runtimeenv"):
        Cache(root).close()
    assert mode(root) == 0o700
    assert mode(root / "index.sqlite") == 0o600
    assert "was accessible to others (mode 0755); made it owner-only" in caplog.text

    empty = tmp_path / "empty"
    empty.mkdir(mode=0o777)
    os.chmod(empty, 0o777)
    Cache(empty).close()
    assert mode(empty) == 0o700


def test_a_wide_directory_that_is_not_a_cache_is_refused(tmp_path: Path) -> None:
    """``--cache-dir ~`` must not chmod the home directory: refused, mode untouched."""
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o755)
    (home / "notes.txt").write_text("mine")
    with pytest.raises(CacheUnavailable) as info:
        Cache(home)
    assert str(home) in str(info.value)
    assert "holds files that are not a cache" in str(info.value)
    assert mode(home) == 0o755
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt"]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_root_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 4242, 4242)
    with pytest.raises(CacheUnavailable, match="owned by uid 4242"):
        Cache(theirs)


def test_cli_warns_in_one_line_and_works(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    os.chmod(root, 0o750)
    result = subprocess.run(
        [sys.executable, "-m", "jupyter_runtimeenv", "--cache-dir", str(root), "list"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("\n") == 1
    assert "made it owner-only (0700)" in result.stderr
    assert mode(root) == 0o700


async def test_owner_only_files_stay_owner_only_in_the_store(
    make_agent: Agent, tmp_path: Path, cache_dir: Path
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    secret = tmp_path / "outside-secret.txt"  # a 0600 file the tree links to
    secret.write_text("same content\n")
    os.chmod(secret, 0o600)
    (project / "private.txt").write_text("same content\n")
    os.chmod(project / "private.txt", 0o600)
    (project / "public.txt").write_text("same content\n")
    os.chmod(project / "public.txt", 0o644)
    (project / "tool.sh").write_text("#!/bin/sh\n")
    os.chmod(project / "tool.sh", 0o700)
    (project / "linked.txt").symlink_to(secret)

    agent = await make_agent()
    ctx = await agent.get_or_create({"working_dir": str(project)}, "t")
    cwd = Path(ctx.cwd or "")
    modes = {p.name: mode(p) for p in cwd.iterdir()}
    assert modes == {
        "private.txt": 0o400,
        "linked.txt": 0o400,
        "public.txt": 0o444,
        "tool.sh": 0o500,
    }
    # Same content, different modes: never one inode (hardlinks share their mode).
    assert os.stat(cwd / "public.txt").st_ino != os.stat(cwd / "private.txt").st_ino
    assert os.stat(cwd / "private.txt").st_ino == os.stat(cwd / "linked.txt").st_ino
    blobs = await asyncio.to_thread(lambda: list((cache_dir / "shared" / "blobs").rglob("*")))
    for blob in [b for b in blobs if b.is_file()]:
        if blob.name.endswith("-m400"):
            assert mode(blob) == 0o400


def test_making_a_file_owner_only_makes_a_new_tree(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("x")
    os.chmod(tmp_path / "f.txt", 0o644)
    before = hash_tree(tmp_path).digest
    os.chmod(tmp_path / "f.txt", 0o600)
    assert hash_tree(tmp_path).digest != before
    os.chmod(tmp_path / "f.txt", 0o664)  # group-writable: stored like 0644, same tree
    assert hash_tree(tmp_path).digest == before
