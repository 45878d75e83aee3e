"""The hash helper forked from a warm zygote template (``_forks``, ``workers/zygote.py``'s
``fork_hash_helper``, ``workers/_zygote.py``'s ``_be_hash_helper``): where a template of this
interpreter is ready, a new tree's helper is forked from it (our child, in a group of its
own, with our cwd and umask, ``--hasher`` in its command line) and lays out the same tree;
where none is, or its fork fails, the helper is spawned as before; a forked helper ends as a
spawned one does (at its input's end, when idle, with its SIGKILLed process); the template
still forks workers after it, and its stop leaves the helper to its user; the template has
hashlib imported before its first spare.

Real parts: real templates and workers (a ``Pool``), real helpers, real files and store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_hashhelp import files_of, hashed, kill_and_outlive, no_helper, running, source

from jupyter_runtimeenv import _forks
from jupyter_runtimeenv.context import EnvContext
from jupyter_runtimeenv.plugins import _hash_child, _hashhelp
from jupyter_runtimeenv.workers import _zygote, zygote
from jupyter_runtimeenv.workers.executor import resolve_driver_sys_path
from jupyter_runtimeenv.workers.pool import Pool
from tests.workers.helpers import submit

pytestmark = pytest.mark.skipif(
    not zygote.enabled() or os.uname().machine not in ("x86_64", "aarch64"),
    reason="templates fork on Linux x86_64/aarch64",
)


@pytest.fixture
def pool() -> Iterator[Pool]:
    """A pool of this interpreter, its template ready (its first worker was spawned)."""
    ctx = EnvContext(python=sys.executable, driver_sys_path=resolve_driver_sys_path())
    made = Pool(lambda: ctx, max_workers=1)
    no_helper()
    try:
        submit(made, os.getpid).result(120)
        deadline = time.monotonic() + 120
        while not [t for t in zygote.templates() if t.state == "ready"]:
            assert time.monotonic() < deadline, f"no template became ready: {zygote.templates()}"
            time.sleep(0.02)
        yield made
    finally:
        made.close()
        no_helper()
        zygote.stop_all()


def status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def argv(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [part.decode() for part in f.read().split(b"\0")[:-1]]


def test_a_helper_taken_while_a_template_is_ready_is_forked_from_it(
    pool: Pool, tmp_path: Path, cache: Path
) -> None:
    """Forked, not spawned: our child (reaped by us, as a spawned one), the leader of its own
    group, the driver's cwd and umask as they are now (changed after the template started),
    only its two pipes and /dev/null open, ``--hasher`` in place of ``--zygote``. A large
    new tree hashed with it is the tree and lay-out the threads make."""
    cwd, mask = os.getcwd(), os.umask(0o027)
    os.chdir(tmp_path)
    try:
        helper = _hashhelp.take()
    finally:
        os.chdir(cwd)
        os.umask(mask)
    assert helper is not None
    try:
        assert helper.forked
        assert status(helper.pid)["PPid"] == str(os.getpid())
        helper.send(str(tmp_path), [])  # a job of no file: answered once the program runs
        assert helper.answer() == []
        assert os.getpgid(helper.pid) == helper.pid
        assert argv(helper.pid)[-1] == "--hasher"
        assert status(helper.pid)["Umask"] == "0027"
        assert os.readlink(f"/proc/{helper.pid}/cwd") == os.path.realpath(tmp_path)
        assert sorted(os.listdir(f"/proc/{helper.pid}/fd")) == ["0", "1", "2"]
        assert os.readlink(f"/proc/{helper.pid}/fd/2") == os.devnull
    finally:
        _hashhelp.give_back(helper)
    src = source(tmp_path / "src")
    done: list[int] = []
    answer = _hashhelp.Helper.answer

    def answered(self: _hashhelp.Helper) -> list[tuple[int, str, int, int]] | None:
        reply = answer(self)
        assert self.forked
        assert self.pid == helper.pid
        done.append(len(reply or ()))
        return reply

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_hashhelp.Helper, "answer", answered)  # observed only
        tree, layout = hashed(src, cache, "forked", True)
    assert done  # it took part (how many files it did depends on who got a core first)
    assert layout.done
    threads, by_threads = hashed(src, cache, "threads", False)
    assert tree == threads
    assert files_of(Path(layout.path)) == files_of(Path(by_threads.path))


def test_a_template_has_hashlib_before_its_first_spare(pool: Pool) -> None:
    """The template imports hashlib (OpenSSL's) while quiet, before it clones its first
    spare: a helper made of that spare does not import it on the path of a first tree."""
    (template,) = zygote.templates()
    name = _zygote.spare_name(template.pid).decode()
    deadline = time.monotonic() + 30
    while not any(comm(pid) == name for pid in children()):
        assert time.monotonic() < deadline, "the template cloned no spare"
        time.sleep(0.01)
    with open(f"/proc/{template.pid}/maps") as f:
        assert "/_hashlib." in f.read()


def children() -> list[int]:
    pids: list[int] = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            pids.extend(int(pid) for pid in f.read().split())
    return pids


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def test_without_a_ready_template_the_helper_is_spawned(
    pool: Pool, tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No template (stopped), a template that cannot fork (killed: its socket is dead), or
    no hook at all (no worker machinery imported): the helper is spawned, ``python -I -S
    _hash_child.py``, and the tree is laid out whole."""
    child = str(Path(_hash_child.__file__))
    (template,) = zygote.templates()
    os.kill(template.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while running(template.pid):  # a zombie until its stop reaps it
        assert time.monotonic() < deadline, "the template outlived its SIGKILL"
        time.sleep(0.01)
    helper = _hashhelp.take()
    assert helper is not None
    assert not helper.forked
    helper.send(str(tmp_path), [])  # answered once it runs (its command line is then set)
    assert helper.answer() == []
    assert child in argv(helper.pid)
    helper.stop()
    zygote.stop_all()
    monkeypatch.setattr(_forks, "hash_helper", None)
    helper = _hashhelp.take()
    assert helper is not None
    assert not helper.forked
    _hashhelp.give_back(helper)
    tree, layout = hashed(source(tmp_path / "src"), cache, "spawned", True)
    assert layout.done
    assert len(tree.entries) > 2 * _hashhelp.STREAM_FROM


def test_a_forked_helper_ends_when_idle_or_at_its_input_end(
    pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Told an idle time it ends itself after it; told 0 (kept ready while an agent runs) it
    does not, and ends when its input is closed. Either is reaped here (our child)."""
    monkeypatch.setattr(_hash_child, "IDLE_S", 0.2)
    quick = _hashhelp.Helper()
    kept = _hashhelp.Helper(lasting=True)
    assert quick.forked
    assert kept.forked
    deadline = time.monotonic() + 30
    while quick.alive():  # reaps it once it exited
        assert time.monotonic() < deadline, "the idle helper did not end itself"
        time.sleep(0.01)
    time.sleep(1.0)
    assert kept.alive()
    os.close(kept.to_w)
    deadline = time.monotonic() + 30
    while kept.alive():
        assert time.monotonic() < deadline, "the kept helper outlived its input"
        time.sleep(0.01)
    os.close(kept.from_r)
    os.close(quick.to_w)
    os.close(quick.from_r)


def test_the_template_forks_workers_after_a_helper_and_its_stop_leaves_the_helper(
    pool: Pool,
) -> None:
    """The helper took the template's spare (or a fork): the next workers are still forked
    from it, and stopping the template neither ends nor reaps the helper (its user does)."""
    (template,) = zygote.templates()
    forks = template.forks
    helper = _hashhelp.take()
    assert helper is not None
    assert helper.forked
    pids = {submit(pool, os.getpid).result(60) for _ in range(3)}
    pool.close()
    new = Pool(lambda: EnvContext(python=sys.executable), max_workers=1)
    try:
        assert submit(new, os.getpid).result(60) not in pids
    finally:
        new.close()
    assert template.forks > forks
    zygote.stop_all()
    assert running(helper.pid)
    assert helper.ready(5.0)
    helper.stop()
    assert not os.path.exists(f"/proc/{helper.pid}")


KILLED = """
import os, sys, time
import jupyter_runtimeenv as jre
from jupyter_runtimeenv.plugins import _hashhelp
from jupyter_runtimeenv.workers import _zygote, zygote
jre.remote(os.getpid).remote().result(120)  # the session's executor, its embedded agent
while not [t for t in zygote.templates() if t.state == "ready"]:
    time.sleep(0.02)
helper = _hashhelp.take()
_hashhelp.give_back(helper)
print(helper.pid, helper.forked, flush=True)
sys.stdin.readline()
"""


def test_a_forked_helper_dies_with_its_sigkilled_process(tmp_path: Path) -> None:
    """SIGKILL of a process whose helper was forked and is kept ready (a kernel with its
    agent): the helper ends too (its input closed; it is in no group the kill reaches)."""
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, JUPYTER_RUNTIMEENV_CACHE=str(tmp_path / "cache")),
    )
    assert child.stdout is not None
    pid, forked = child.stdout.readline().split()
    helper = int(pid)
    assert forked == "True"
    assert running(helper)
    kill_and_outlive(child, helper)
