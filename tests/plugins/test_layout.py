"""A new tree laid out while it is hashed (``plugins/_layout.py``): the files are written by
the hashing threads, the source's build takes the lay-out as its spare, and it is exactly the
tree a lay-out after the hash makes.

Real parts: real files, the real content store, the real hashing threads, a real agent.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_spares import shape, write

from jupyter_runtimeenv.plugins import _blobs, _hashing, _sources, _spares, _store
from jupyter_runtimeenv.plugins._layout import LayOut
from jupyter_runtimeenv.spec.files import BadFile

Agent = Callable[..., Any]
FILES = 40  # over _hashing._THREADS_FROM: hashed on threads


def source(root: Path) -> Path:
    write(root, {f"d{i % 4}/sub/f{i}.txt": f"content {i}\n" for i in range(FILES)})
    write(root, {"top.txt": "top"})
    (root / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "run.sh", 0o755)
    return root


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_new_tree_is_laid_out_by_the_threads_that_hash_it(tmp_path: Path, cache: Path) -> None:
    """Each file is written there by the thread that read and hashed it, from those bytes:
    its own file (as ``cp -r`` makes it), not a link to a blob; the store gets them after
    the env is ready (``tests/plugins/test_store_later.py``)."""
    src = source(tmp_path / "src")
    _hashing.forget_stat_cache()
    written_by: set[int] = set()
    real = _blobs.create_at

    def create_at(*args: Any) -> int:
        written_by.add(threading.get_ident())
        return real(*args)

    layout = LayOut(str(cache / "tmp" / "pre"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_blobs, "create_at", create_at)  # observed only: every file is written
        tree = _hashing.hash_tree(src, store=_store.blob_dir(cache), lay_out=layout)
    assert layout.done
    assert written_by
    assert threading.get_ident() not in written_by  # the hashing threads wrote, not we
    whole = tmp_path / "whole"
    _store.materialize(tree, cache, whole)
    assert shape(Path(layout.path)) == shape(whole)
    for entry in tree.entries:  # its own files, not the blobs
        blob = Path(_store.blob_path(cache, entry.blob_name))
        assert (Path(layout.path) / entry.rel).stat().st_ino != blob.stat().st_ino


def test_a_tree_not_read_whole_is_not_laid_out(tmp_path: Path, cache: Path) -> None:
    """Only a tree whose every file this hash reads is laid out (else its build lays it out
    from the spare of its last version, or whole); nothing is left at the path."""
    src = source(tmp_path / "src")
    store = _store.blob_dir(cache)
    _hashing.forget_stat_cache()
    _hashing.hash_tree(src, store=store)
    write(src, {"top.txt": "changed"})
    layout = LayOut(str(cache / "tmp" / "pre"))
    _hashing.hash_tree(src, store=store, lay_out=layout)
    assert not layout.done
    assert not os.path.exists(layout.path)
    small = tmp_path / "small"
    write(small, {"a.txt": "a"})
    layout = LayOut(str(cache / "tmp" / "pre-small"))
    _hashing.hash_tree(small, store=store, lay_out=layout)  # too few files for threads
    assert not layout.done
    assert not os.path.exists(layout.path)


def test_a_failed_hash_leaves_no_lay_out_and_no_descriptor(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that fails to be read half-way through (here: made to fail, a stand-in for a
    file that changes under the read) fails the hash; the lay-out is removed and its
    descriptors are closed once the last hashing thread lets go of it."""
    src = source(tmp_path / "src")
    _hashing.forget_stat_cache()
    real = _hashing._hash_one
    victim = str(src / "d1" / "sub" / "f21.txt")

    def hash_one(path: str, *args: Any, **kwargs: Any) -> str:
        if path == victim:
            raise BadFile(f"{path} changed while it was read")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(_hashing, "_hash_one", hash_one)
    before = fds()
    layout = LayOut(str(cache / "tmp" / "pre"))
    with pytest.raises(BadFile):
        _hashing.hash_tree(src, store=_store.blob_dir(cache), lay_out=layout)
    assert not layout.done
    deadline = time.monotonic() + 30
    while os.path.exists(layout.path) or fds() > before:
        assert time.monotonic() < deadline, "the lay-out or its descriptors were left"
        time.sleep(0.01)


def test_a_file_written_through_another_link_after_the_hash_is_not_kept(
    tmp_path: Path, cache: Path
) -> None:
    """A write in place through another env's link to a blob between the parse and the
    build: the lay-out's files are its own (written while hashed, not links to the blobs),
    so the build gets the content the tree was hashed with."""
    src = source(tmp_path / "src")
    store = _store.blob_dir(cache)
    family = f"0:{src}"
    _hashing.forget_stat_cache()
    layout = LayOut(str(cache / "tmp" / "pre"))
    tree = _hashing.hash_tree(src, store=store, lay_out=layout)
    assert layout.done
    _spares.adopt(str(store), family, tree, layout)
    other = tmp_path / "other-env"
    _store.materialize(tree, cache, other)
    victim = other / "top.txt"
    os.chmod(victim, 0o644)
    with open(victim, "r+") as f:
        f.write("EVIL")
    target = tmp_path / "env"
    target.mkdir()
    _spares.lay_out(tree, cache, target, family)
    assert (target / "top.txt").read_text() == "top"
    assert os.stat(target / "top.txt").st_mode & 0o777 == 0o444
    whole = tmp_path / "whole"
    _store.materialize(tree, cache, whole)
    assert shape(target) == shape(whole)


async def test_the_build_takes_the_tree_laid_out_when_the_spec_was_parsed(
    make_agent: Agent, tmp_path: Path, cache_dir: Path
) -> None:
    """An agent's parse lays a new working_dir out while hashing it, and the env's build
    renames that very directory into place (the same inode) instead of linking its files."""
    src = await asyncio.to_thread(source, tmp_path / "src")
    await asyncio.to_thread(_hashing.forget_stat_cache)
    agent = await make_agent()
    spec = await asyncio.to_thread(agent.parse, {"working_dir": str(src)})
    family = _sources.family_of(str(src), False)
    store = str(_store.blob_dir(cache_dir))
    assert (store, family, True) in _spares.spares()
    (pre,) = [p for p in (cache_dir / "tmp").iterdir() if "-spare-" in p.name]
    inode = pre.stat().st_ino
    ctx = await agent.get_or_create(spec, "t")
    assert ctx.cwd is not None
    assert Path(ctx.cwd).stat().st_ino == inode
    assert sorted(await asyncio.to_thread(shape, Path(ctx.cwd))) == sorted(
        await asyncio.to_thread(shape, src)
    )
