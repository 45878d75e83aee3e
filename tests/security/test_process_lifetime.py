"""Threat: installers outlive the agent that started them (they run in their own session,
so a signal to the agent does not reach them), keep CPU, disk and locks, and write into a
cache nobody watches.

Rules under test (``agent/pgroups.py``): on SIGTERM/SIGHUP (the CLI and a real ``jupyter
server``) and at normal exit, the agent kills the process groups it started; after a
SIGKILL the next agent to open the cache ends the dead agent's groups; a live agent's groups
(two agents share one cache) and a recycled pid are never touched.

Everything here is real: the CLI and the server are subprocesses, the build is a real
``uv`` building the wheelhouse's ``hang`` sdist, whose build backend sleeps forever.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import processes
import psutil
import pytest
from jupyter_process import JupyterProcess
from wheelhouse import make_wheelhouse

from jupyter_runtimeenv.agent import Cache
from jupyter_runtimeenv.agent.pgroups import start_time

HANG_SPEC = json.dumps({"pip": ["hang"], "config": {"setup_timeout_seconds": -1}})


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))


@pytest.fixture
def env(tmp_path: Path, wheelhouse: Path, cache_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "UV_NO_INDEX": "1",
        "UV_FIND_LINKS": str(wheelhouse),
        "UV_OFFLINE": "1",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheelhouse),
        "HANG_PID_FILE": str(tmp_path / "hang.pid"),
        "JUPYTER_RUNTIMEENV_CACHE": str(cache_dir),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
    }


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[Any]]]:
    """Processes a test starts; killed (with what is left of their trees) afterwards."""
    procs: list[subprocess.Popen[Any]] = []
    yield procs
    for proc in procs:
        for p in [*processes.descendants(proc.pid), proc.pid]:
            processes.kill(p)
        proc.wait(30)


def cli(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "jupyter_runtimeenv", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until(check: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def installers_of(owner: int, pid_file: Path) -> list[psutil.Process]:
    """The owner's descendants once the build backend runs (uv, the backend, ...)."""
    wait_until(pid_file.exists, "the build backend to start")
    wait_until(lambda: pid_file.read_text().strip() != "", "the pid file")
    backend = int(pid_file.read_text())
    tree = processes.descendants(owner)
    assert backend in [p.pid for p in tree], "the build backend is not the owner's descendant"
    # Their own session: a signal to the owner does not reach them by itself.
    assert {session_of(p.pid) for p in tree} - {None} != {os.getsid(owner)}
    return tree


def session_of(pid: int) -> int | None:
    """The session of ``pid``; None if it exited since it was listed (a short-lived helper)."""
    try:
        return os.getsid(pid)
    except ProcessLookupError:
        return None


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if processes.alive(p)]


def all_gone(procs: list[psutil.Process], timeout: float = 15) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while alive(procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(procs)


def recorded_groups(cache: Path) -> list[tuple[int, ...]]:
    db = sqlite3.connect(cache / "index.sqlite")
    try:
        return [tuple(r) for r in db.execute("SELECT pgid, owner_pid FROM pgroups")]
    finally:
        db.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_cli_signal_mid_build_kills_every_installer(
    env: dict[str, str],
    tmp_path: Path,
    cache_dir: Path,
    spawned: list[subprocess.Popen[Any]],
    sig: signal.Signals,
) -> None:
    proc = cli(env, "build", HANG_SPEC, "-q")
    spawned.append(proc)
    installers = installers_of(proc.pid, tmp_path / "hang.pid")
    assert [g for g in recorded_groups(cache_dir) if g[1] == proc.pid], "group not recorded"
    proc.send_signal(sig)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert f"stopped by {sig.name}" in err
    assert "Traceback" not in err
    assert all_gone(installers) == []
    assert recorded_groups(cache_dir) == []


def test_after_sigkill_the_next_start_ends_the_orphans(
    env: dict[str, str], tmp_path: Path, cache_dir: Path, spawned: list[subprocess.Popen[Any]]
) -> None:
    proc = cli(env, "build", HANG_SPEC, "-q")
    spawned.append(proc)
    installers = installers_of(proc.pid, tmp_path / "hang.pid")
    proc.kill()
    proc.wait(30)
    time.sleep(0.5)
    # The threat itself: SIGKILL leaves the installers running, in a tmp dir of the cache.
    assert alive(installers), "the installers died with the agent: nothing left to test"
    assert list((cache_dir / "tmp").iterdir())

    nxt = subprocess.run(
        [sys.executable, "-m", "jupyter_runtimeenv", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert nxt.returncode == 0, nxt.stderr
    assert all_gone(installers) == []
    assert recorded_groups(cache_dir) == []
    assert list((cache_dir / "tmp").iterdir()) == []


def test_a_live_agents_installers_are_left_alone(
    env: dict[str, str], tmp_path: Path, cache_dir: Path, spawned: list[subprocess.Popen[Any]]
) -> None:
    """Two agents on one cache: the second one's start must not end the first's build."""
    first = cli(env, "build", HANG_SPEC, "-q")
    spawned.append(first)
    installers = installers_of(first.pid, tmp_path / "hang.pid")
    second = subprocess.run(
        [sys.executable, "-m", "jupyter_runtimeenv", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode == 0, second.stderr
    assert "BUILDING" in second.stdout or "no environments" in second.stdout
    assert len(alive(installers)) == len(installers)
    assert recorded_groups(cache_dir)
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=60)
    assert all_gone(installers) == []


def test_a_recycled_pid_is_never_signalled(cache_dir: Path, tmp_path: Path) -> None:
    """A record of a dead owner whose group leader's pid now belongs to someone else (its
    start time differs) is dropped without a signal; one that matches is ended; a live
    owner's record is kept."""
    sleeper = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        real = start_time(sleeper.pid)
        assert real is not None
        cache = Cache(cache_dir)
        me = psutil.Process()
        dead_pid, dead_started = 2**22 + 12345, 1.0  # no such process
        with sqlite3.connect(cache_dir / "index.sqlite") as db:
            db.execute(
                "INSERT INTO pgroups VALUES (?, ?, ?, ?)",
                (sleeper.pid, real - 1000, dead_pid, dead_started),
            )
        assert cache.end_orphan_groups() == []
        assert sleeper.poll() is None, "a recycled pid was killed"
        assert recorded_groups(cache_dir) == []

        with sqlite3.connect(cache_dir / "index.sqlite") as db:
            db.execute(
                "INSERT INTO pgroups VALUES (?, ?, ?, ?)",
                (sleeper.pid, real, me.pid, me.create_time()),
            )
        assert cache.end_orphan_groups() == []  # its owner (this process) is alive
        assert sleeper.poll() is None
        assert recorded_groups(cache_dir) == [(sleeper.pid, me.pid)]

        with sqlite3.connect(cache_dir / "index.sqlite") as db:
            db.execute("UPDATE pgroups SET owner_pid = ?, owner_started = ?", (dead_pid, 1.0))
        assert cache.end_orphan_groups() == [sleeper.pid]
        assert sleeper.wait(10) == -signal.SIGKILL
        cache.close()
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


def _request(port: int, token: str, method: str, path: str, body: Any = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(
            method,
            "/jupyter-runtimeenv/api/" + path,
            body=data,
            headers={"Authorization": f"token {token}"},
        )
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_server_signal_mid_build_kills_every_installer(
    env: dict[str, str],
    tmp_path: Path,
    cache_dir: Path,
    spawned: list[subprocess.Popen[Any]],
    sig: signal.Signals,
) -> None:
    log = tmp_path / "server.log"
    server = JupyterProcess(
        "jupyter_server",
        tmp_path,
        log,
        env=env,
        args=[
            "--ServerApp.jpserver_extensions={'jupyter_runtimeenv': True}",
            f"--RuntimeEnvExtension.cache_dir={cache_dir}",
        ],
    )
    spawned.append(server.proc)
    try:
        assert _request(server.port, server.token, "POST", "envs", json.loads(HANG_SPEC)) == 201
        installers = installers_of(server.proc.pid, tmp_path / "hang.pid")
        server.proc.send_signal(sig)
        server.proc.wait(60)
    finally:
        server.stop()
    assert all_gone(installers) == [], log.read_text()[-3000:]
    assert recorded_groups(cache_dir) == []
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
