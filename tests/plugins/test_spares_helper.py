"""A large spare tree laid out by the idle hash helper (``plugins/_spares.py``'s
``_link_spare``, ``plugins/_hash_child.py``'s ``link_tree``): the same tree as a whole
lay-out, none of its links made by a thread of this process, and every failure a spare
dropped, never a tree that differs.

Real parts: real files, the real content store, the real helper process and spares' thread.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_spares import hashed, shape, wait_ready, write

from jupyter_runtimeenv.plugins import _hashhelp, _hashing, _spares, _store

FILES = 200  # at least _spares.HELPER_FROM


#: No spare may be left in the cache's tmp after a test (``conftest.cache``).
SPARES_LEFT = False


@pytest.fixture
def helper() -> Iterator[_hashhelp.Helper]:
    """A new helper, idle: the one ``_hashhelp.take_idle`` finds."""
    old = _hashhelp.take()
    if old is not None:
        old.stop()
    new = _hashhelp.Helper()
    _hashhelp.give_back(new)
    yield new
    idle = _hashhelp.take_idle()
    if idle is not None:
        idle.stop()
    if not new.stopped:
        new.stop(kill=True)


def source(root: Path) -> Path:
    write(root, {f"d{i % 9}/sub{i % 2}/f{i}.txt": f"content {i}\n" for i in range(FILES)})
    return root


def links_by_thread(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many ``os.link`` calls each thread of this process makes from now on."""
    made: dict[str, int] = {}
    real: Callable[..., None] = os.link

    def link(src: str, dst: str, *args: object, **kwargs: object) -> None:
        name = threading.current_thread().name
        made[name] = made.get(name, 0) + 1
        real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", link)
    return made


def first_version(src: Path, cache: Path, target: Path, family: str) -> _hashing.Tree:
    """The source's first lay-out, whole, with no spare offered for it."""
    _hashing.forget_stat_cache()
    tree = hashed(src, cache)
    target.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_spares, "_offer", lambda *args: None)
        _spares.lay_out(tree, cache, target, family)
    return tree


def offer_and_wait(cache: Path, family: str, tree: _hashing.Tree) -> None:
    """Offer a spare of ``tree`` and wait (bounded) until the spares' thread is done with it."""
    _spares._offer((str(_store.blob_dir(cache)), family), tree, cache)
    deadline = time.monotonic() + 30
    while True:
        with _spares._lock:
            if not _spares._jobs and not _spares._busy:
                return
        assert time.monotonic() < deadline, "the spare was never laid out"
        time.sleep(0.01)


def no_spare_left(cache: Path) -> None:
    """Wait (bounded) until the spares' thread has removed what it made of a dropped spare
    (after it let the spare go)."""
    deadline = time.monotonic() + 30
    while [p for p in (cache / "tmp").iterdir() if "-spare-" in p.name]:
        assert time.monotonic() < deadline, "a dropped spare was left behind"
        time.sleep(0.01)


def next_version(
    src: Path, cache: Path, target: Path, family: str, change: dict[str, str | None]
) -> _hashing.Tree:
    """``change`` made in the source, its tree hashed and laid out at ``target`` (from the
    spare when there is one): the same tree as a whole lay-out (``materialize``) makes."""
    write(src, change)
    time.sleep(0.01)
    tree = hashed(src, cache)
    target.mkdir()
    _spares.lay_out(tree, cache, target, family)
    whole = target.with_name(target.name + "-whole")
    _store.materialize(tree, cache, whole)
    assert shape(target) == shape(whole)
    return tree


def dropped(cache: Path, family: str) -> None:
    """The spare of ``family`` was dropped, and what it made removed."""
    assert _spares.spares() == [(str(_store.blob_dir(cache)), family, False)]
    no_spare_left(cache)


def test_a_large_spare_is_linked_by_the_idle_helper_and_is_the_whole_tree(
    tmp_path: Path, cache: Path, helper: _hashhelp.Helper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spare of a tree of ``HELPER_FROM`` files or more is linked by the idle helper, on
    its own core: the spares' thread makes none of its links (before, all of them, each
    giving the GIL back and waiting for it again while the driver parsed the next edit).
    The next version made from it is the tree a whole lay-out makes, and the helper is
    idle again after it."""
    src = source(tmp_path / "src")
    family = f"0:{src}"
    first_version(src, cache, tmp_path / "v0", family)
    write(src, {"d3/sub1/f3.txt": "changed\n"})
    time.sleep(0.01)
    tree = hashed(src, cache)
    made = links_by_thread(monkeypatch)
    target = tmp_path / "v1"
    target.mkdir()
    _spares.lay_out(tree, cache, target, family)  # whole (no spare), then offers one
    wait_ready(family)
    assert made.get("jre-tree-spares", 0) == 0, made
    monkeypatch.undo()
    assert _hashhelp.take_idle() is helper  # given back
    _hashhelp.give_back(helper)
    change = {"d4/sub0/f4.txt": "changed too\n", "d5/new.txt": "new\n", "d0/sub0/f0.txt": None}
    target = tmp_path / "v2"
    tree = next_version(src, cache, target, family, change)  # from the helper's spare
    for entry in tree.entries:  # links to the blobs, as a whole lay-out makes them
        blob = Path(_store.blob_path(cache, entry.blob_name))
        assert (target / entry.rel).stat().st_ino == blob.stat().st_ino


def test_a_blob_gone_before_the_helper_links_it_drops_the_spare(
    tmp_path: Path, cache: Path, helper: _hashhelp.Helper
) -> None:
    """A blob removed from the store before its spare is linked: the helper answers the
    error, the spare is dropped with what it made, the helper is kept; the next build lays
    its tree out whole, the same as ``materialize`` makes."""
    src = source(tmp_path / "src")
    family = f"0:{src}"
    tree = first_version(src, cache, tmp_path / "v0", family)
    os.unlink(_store.blob_path(cache, tree.entries[-1].blob_name))
    offer_and_wait(cache, family, tree)
    dropped(cache, family)
    assert _hashhelp.take_idle() is helper  # its answer was read: still usable
    _hashhelp.give_back(helper)
    next_version(src, cache, tmp_path / "v1", family, {"d1/sub1/f1.txt": "changed\n"})


def test_a_helper_gone_during_a_spares_links_drops_the_spare(
    tmp_path: Path, cache: Path, helper: _hashhelp.Helper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The helper killed while it links a spare: the spare is dropped and removed (after the
    helper is reaped, so nothing writes into it), and the next build lays its tree out
    whole; no helper process is left."""
    src = source(tmp_path / "src")
    family = f"0:{src}"
    tree = first_version(src, cache, tmp_path / "v0", family)
    real = _hashhelp.Helper.link

    def link(self: _hashhelp.Helper, *args: object, **kwargs: object) -> str | None:
        os.kill(self.pid, signal.SIGKILL)
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_hashhelp.Helper, "link", link)
    offer_and_wait(cache, family, tree)
    monkeypatch.undo()
    dropped(cache, family)
    assert not os.path.exists(f"/proc/{helper.pid}")  # killed and reaped
    assert _hashhelp.take_idle() is None
    next_version(src, cache, tmp_path / "v1", family, {"d2/sub0/f2.txt": "changed\n"})
