"""The hash helper kept while an agent runs in this process (``_hashhelp.keep``, from
``_store.attach``): none started by the agent, the one a tree started neither retired nor
ending itself while it runs, retired after its stop, gone with its process; one started
before the agent still retired; where none can start, trees hash on threads.

Real parts: real agents, the real helper process, real files and content store.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_hashhelp import hashed, kill_and_outlive, no_helper, running, source

from jupyter_runtimeenv.plugins import _hash_child, _hashhelp, _hashing, _spares, _store


def gone(pid: int, within: float = 30.0) -> bool:
    """Whether ``pid`` is gone and reaped (a zombie's /proc entry stays until then)."""
    deadline = time.monotonic() + within
    while os.path.exists(f"/proc/{pid}"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


async def test_an_agent_keeps_the_helper_its_first_tree_started_until_its_stop(
    tmp_path: Path, make_agent: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent's start starts no helper (a kernel or CLI command that parses no tree has
    none: an extra process a kernel's interrupt left, tests/workers/test_interrupt.py); the
    one its first large tree starts is kept past ``RETIRE_S`` while the agent runs and
    taken by the next tree; after the agent's stop it is retired ``RETIRE_S`` later."""
    no_helper()
    monkeypatch.setattr(_hashhelp, "RETIRE_S", 0.2)
    agent = await make_agent()
    assert _hashhelp._idle == []
    taken: list[_hashhelp.Helper | None] = []
    take = _hashhelp.take

    def taking() -> _hashhelp.Helper | None:
        taken.append(take())
        return taken[-1]

    src = source(tmp_path / "src")
    _hashing.forget_stat_cache()
    with monkeypatch.context() as mp:
        mp.setattr(_hashhelp, "take", taking)  # observed only
        await asyncio.to_thread(agent.parse, {"working_dir": str(src)})
        (helper,) = taken
        assert helper is not None
        await asyncio.sleep(1.0)  # five retirements
        assert _hashhelp._idle == [helper]
        assert running(helper.pid)
        _hashing.forget_stat_cache()
        await asyncio.to_thread(agent.parse, {"working_dir": str(src), "excludes": ["x"]})
    assert taken == [helper, helper]
    await agent.stop()
    assert gone(helper.pid), "the helper was not retired after its agent's stop"
    assert _hashhelp._idle == []


def test_a_helper_started_before_an_agent_is_still_retired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper started while no agent ran ends itself ``IDLE_S`` idle: it is retired
    ``RETIRE_S`` after its last tree even once an agent runs. Kept, it ended itself and
    stayed this process's zombie until the next tree (seen by tests/workers' zombie check
    after tests/plugins' trees); the agent's next tree starts a helper that lasts."""
    no_helper()
    monkeypatch.setattr(_hashhelp, "RETIRE_S", 0.2)
    helper = _hashhelp.take()
    assert helper is not None
    assert not helper.lasting
    _hashhelp.give_back(helper)
    detach = _store.attach(tmp_path / "cache")
    try:
        assert gone(helper.pid, 10), "the helper was kept past its own idle end"
        assert _hashhelp._idle == []
        again = _hashhelp.take()
        assert again is not None
        assert again.lasting
        again.stop()
    finally:
        detach()


def test_a_helper_is_kept_while_any_agent_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two agents of one process (two caches): the helper is kept until the last of them
    stops, whichever order they stop in (a second undo is a no-op)."""
    no_helper()
    monkeypatch.setattr(_hashhelp, "RETIRE_S", 0.2)
    first = _store.attach(tmp_path / "one")
    second = _store.attach(tmp_path / "two")
    assert _hashhelp._idle == []
    helper = _hashhelp.take()
    assert helper is not None
    _hashhelp.give_back(helper)
    first()
    first()
    time.sleep(1.0)
    assert _hashhelp._idle == [helper]
    assert running(helper.pid)
    second()
    assert gone(helper.pid)
    assert _hashhelp._idle == []


def test_a_helper_in_use_when_its_agent_stops_retires_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent stops while a tree is being hashed with the kept helper: it is not
    stopped under that tree; given back, it is ended and reaped ``RETIRE_S`` later."""
    no_helper()
    monkeypatch.setattr(_hashhelp, "RETIRE_S", 0.2)
    detach = _store.attach(tmp_path / "cache")
    helper = _hashhelp.take()
    assert helper is not None
    detach()
    assert running(helper.pid)
    assert helper.ready(1.0)
    _hashhelp.give_back(helper)
    assert gone(helper.pid), "the helper was not retired after its agent's stop"
    assert _hashhelp._idle == []


def test_a_kept_helper_never_ends_itself_for_being_idle() -> None:
    """The helper program ends itself after ``IDLE_S`` without a job, unless told ``0`` (a
    helper kept ready: its caller ends it); either ends with its input."""
    child = str(Path(_hash_child.__file__))
    quick = subprocess.Popen([sys.executable, "-I", "-S", child, "0.2"], stdin=subprocess.PIPE)
    kept = subprocess.Popen([sys.executable, "-I", "-S", child, "0"], stdin=subprocess.PIPE)
    try:
        assert quick.wait(30) == 0
        time.sleep(1.0)
        assert kept.poll() is None
    finally:
        for proc in (quick, kept):
            assert proc.stdin is not None
            proc.stdin.close()
    assert kept.wait(30) == 0


KEEP_AND_WAIT = """
import sys
from pathlib import Path
from jupyter_runtimeenv.plugins import _hashhelp, _store
_store.attach(Path(sys.argv[1]))
helper = _hashhelp.take()
_hashhelp.give_back(helper)
print(helper.pid, flush=True)
sys.stdin.readline()
"""


def test_a_kept_helper_dies_with_its_process(tmp_path: Path) -> None:
    """SIGKILL of a process that keeps a helper ready (a kernel with its agent): the helper
    ends too (its input closed), it does not wait for its retirement."""
    child = subprocess.Popen(
        [sys.executable, "-c", KEEP_AND_WAIT, str(tmp_path / "cache")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    helper = int(child.stdout.readline())
    assert running(helper)
    kill_and_outlive(child, helper)


def test_where_no_helper_can_start_a_large_tree_hashes_on_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no helper can start (no interpreter at ``sys.executable``) an agent's first
    large tree is laid out by this process's threads, the lay-out and digest the same as
    with a helper, and nothing is kept."""
    no_helper()
    cache = tmp_path / "cache"
    (cache / "tmp").mkdir(parents=True)
    src = source(tmp_path / "src")
    with_helper, _layout = hashed(src, cache, "with", True)
    no_helper()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    detach = _store.attach(cache)
    try:
        assert _hashhelp._idle == []
        tree, layout = hashed(src, cache, "without", True)
        assert _hashhelp._idle == []
    finally:
        detach()
        _spares.drop(str(_store.blob_dir(cache)))
    assert layout.done
    assert tree == with_helper
