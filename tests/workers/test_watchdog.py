"""No worker outlives the process that started it, however it dies (issue 17, item 4).

A worker has two watchdogs (``_entry.watchdog``): Linux's ``PR_SET_PDEATHSIG`` and, on
every platform, a thread blocked reading the driver's lifeline pipe. Either one, when the
driver dies, SIGKILLs the worker's process group, so the task's children go too, and it
works while a task runs. Each is tested alone here (a driver whose fork keeps the lifeline
open leaves only the signal; a command prefix that forks, so that the worker's parent is
not the driver, leaves only the lifeline), then both together in a real kernel.

The drivers are real processes (a script; an ipykernel through jupyter_client), killed with
SIGKILL while their task runs; the task's own ``sleep`` child must go too. The issue asks
for 2 s: the wait starts once the driver is dead, and polls.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import cloudpickle
import psutil
import pytest
from jupyter_client.manager import KernelManager
from kernel_process import kernel_manager
from processes import Proc, children, cmdline, kill_all, of, survivors

from jupyter_runtimeenv.workers.process import CLOUDPICKLE_VAR, ENTRY

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX only")

WITHIN = 2.0

DRIVER = textwrap.dedent(
    """
    import ctypes, json, os, sys, time
    from jupyter_runtimeenv.context import EnvContext
    from jupyter_runtimeenv.workers.future import RemoteFuture, Task
    from jupyter_runtimeenv.workers.output import OutputTarget
    from jupyter_runtimeenv.workers.pool import Pool
    from jupyter_runtimeenv.workers.serialize import dump_call

    marker, prefix, keep_lifeline = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
    forked = sys.argv[4] == "1"

    def hang(marker):
        import os, pathlib, subprocess, time
        child = subprocess.Popen(["sleep", "300"])
        pathlib.Path(marker + ".tmp").write_text(f"{os.getpid()} {child.pid}")
        os.replace(marker + ".tmp", marker)  # whole: the test polls for it
        time.sleep(300)

    ctx = EnvContext(python=sys.executable, command_prefix=prefix)
    if not forked:  # a first worker is forked from the template it starts: none at all
        os.environ["JUPYTER_RUNTIMEENV_ZYGOTE"] = "0"
    if forked:  # the first worker starts the template; the task's worker is forked from it
        from jupyter_runtimeenv.workers import zygote
        warm = Pool(lambda: ctx)
        first = RemoteFuture("first")
        task = Task(b"", first, OutputTarget.capture("first"))
        task.payload = dump_call(task.id, os.getpid, (), {}, "first")
        warm.submit(task)
        first.result(120)
        while not [t for t in zygote.templates() if t.state == "ready"]:
            time.sleep(0.02)
    pool = Pool(lambda: ctx)
    future = RemoteFuture("hang")
    task = Task(b"", future, OutputTarget.capture("hang"))
    task.payload = dump_call(task.id, hang, (marker,), {}, "hang")
    pool.submit(task)
    if keep_lifeline:
        # libc's fork, not os.fork: Python's at-fork handlers (which drop the inherited
        # lifeline) do not run, so this child keeps the lifeline's write end open.
        if ctypes.CDLL(None).fork() == 0:
            time.sleep(300)
            os._exit(0)
    time.sleep(300)
    """
)


@pytest.fixture
def tracked() -> Iterator[list[Proc]]:
    procs: list[Proc] = []
    yield procs
    kill_all(procs)


def start_driver(
    tmp_path: Path, prefix: list[str], keep_lifeline: bool, forked: bool = False
) -> subprocess.Popen[bytes]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    argv = [sys.executable, str(script), str(tmp_path / "pids"), json.dumps(prefix)]
    flags = ["1" if keep_lifeline else "0", "1" if forked else "0"]
    return subprocess.Popen([*argv, *flags], cwd=tmp_path)


def read_marker(marker: Path, timeout: float = 120) -> list[int]:
    deadline = time.monotonic() + timeout
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline, "the task never started"
        time.sleep(0.02)
    return [int(word) for word in marker.read_text().split()]


def _seen(parent: int, which: Callable[[list[str]], bool]) -> list[Proc]:
    """The children of ``parent`` running now whose command line ``which`` takes."""
    found = []
    for child in children(parent):
        argv = cmdline(child)
        if argv and which(argv) and (proc := Proc.of(child.pid)) is not None:
            found.append(proc)
    return found


def sigkill(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(30)


@pytest.mark.parametrize("forked", [False, True], ids=["spawned", "forked"])
def test_the_parent_death_signal_alone_ends_the_worker_and_its_children(
    tmp_path: Path, tracked: list[Proc], forked: bool
) -> None:
    if sys.platform != "linux":
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    driver = start_driver(tmp_path, [], keep_lifeline=True, forked=forked)
    try:
        worker, child = (of(pid) for pid in read_marker(tmp_path / "pids"))
        assert (b"--forked" in Path(f"/proc/{worker.pid}/cmdline").read_bytes()) == forked
        tracked += [worker, child]
        # The driver forks after it submitted the task: under load the task may have written
        # its pids first. Children are looked at as they are (any may exit meanwhile).
        deadline = time.monotonic() + 60
        while not (holders := _seen(driver.pid, lambda argv: "_entry.py" not in " ".join(argv))):
            assert time.monotonic() < deadline, (
                "the driver's fork (holding the lifeline) did not start"
            )
            time.sleep(0.02)
        tracked += holders
        templates = _seen(driver.pid, lambda argv: argv[-1:] == ["--zygote"])
        tracked += templates
        assert bool(templates) == forked
    finally:
        sigkill(driver)
    assert survivors([worker, child], WITHIN) == []
    # A template goes too: at once if it was ready (forked: the driver waited for it), else
    # as soon as its start is done and it finds its parent gone (``_zygote.serve``).
    assert survivors(templates, 60) == []


def test_a_template_whose_driver_died_as_it_started_exits(tmp_path: Path) -> None:
    # The driver died while its template imported: the template's parent is not the one
    # it was told. Its control socket and lifeline are held here, as a fork of the driver
    # (a notebook's multiprocessing) would hold them, so only the parent check can tell.
    # Before that check the template said HELLO and served (forever).
    if sys.platform != "linux":
        pytest.skip("templates are Linux's")
    ours, theirs = socket.socketpair()
    life_r, life_w = os.pipe()
    stranger = subprocess.Popen(["sleep", "300"])  # alive, and not the template's parent
    argv = [
        sys.executable, ENTRY, "--fd", str(theirs.fileno()), "--lifeline", str(life_r),
        "--parent", str(stranger.pid), "--zygote",
    ]  # fmt: skip
    template = subprocess.Popen(
        argv,
        pass_fds=(theirs.fileno(), life_r),
        env={**os.environ, CLOUDPICKLE_VAR: os.path.dirname(cloudpickle.__file__)},
        start_new_session=True,
    )
    try:
        theirs.close()
        os.close(life_r)
        ours.settimeout(120)
        assert ours.recv(4096) == b"", "the template said HELLO to a driver that is gone"
        assert template.wait(120) == 0
    finally:
        for proc in (template, stranger):
            proc.kill()
            proc.wait()
        ours.close()
        os.close(life_w)


def test_the_lifeline_alone_ends_the_worker_and_its_children(
    tmp_path: Path, tracked: list[Proc]
) -> None:
    timeout = shutil.which("timeout")
    if timeout is None:
        pytest.skip("needs coreutils' timeout (a command prefix that forks)")
    # ``timeout`` forks the worker and waits: the worker's parent is not the driver, so
    # the parent-death signal is not armed and only the lifeline can tell.
    driver = start_driver(tmp_path, [timeout, "600"], keep_lifeline=False)
    try:
        worker, child = (of(pid) for pid in read_marker(tmp_path / "pids"))
        wrapper = of(psutil.Process(worker.pid).ppid())
        tracked += [worker, child, wrapper]
        assert wrapper.pid != driver.pid
    finally:
        sigkill(driver)
    assert survivors([worker, child, wrapper], WITHIN) == []


def test_a_sigkilled_kernel_takes_its_workers_and_their_children(
    tmp_path: Path, tracked: list[Proc]
) -> None:
    with kernel_manager() as km:  # on unix sockets: no TCP port for another process to take
        _sigkill_a_kernel(km, tmp_path, tracked)


def _sigkill_a_kernel(km: KernelManager, tmp_path: Path, tracked: list[Proc]) -> None:
    km.start_kernel(
        cwd=str(tmp_path), env={**os.environ, "JUPYTER_RUNTIMEENV_CACHE": str(tmp_path / "cache")}
    )
    client = km.blocking_client()
    client.start_channels()
    marker = tmp_path / "pids"
    try:
        client.wait_for_ready(timeout=60)
        code = textwrap.dedent(
            f"""
            import jupyter_runtimeenv as jre

            def hang(marker):
                import os, pathlib, subprocess, time
                child = subprocess.Popen(["sleep", "300"])
                pathlib.Path(marker + ".tmp").write_text(f"{{os.getpid()}} {{child.pid}}")
                os.replace(marker + ".tmp", marker)  # whole: the test polls for it
                time.sleep(300)

            futures = [jre.remote(hang).remote({str(marker)!r} + str(i)) for i in range(2)]
            """
        )
        reply = client.execute_interactive(code, timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
        pids = [pid for i in range(2) for pid in read_marker(Path(f"{marker}{i}"))]
        procs = [of(pid) for pid in pids]
        tracked += procs
        kernel = km.provisioner.process  # type: ignore[union-attr]
        # And whatever else the kernel started: the template its workers fork from, if any.
        below = [
            p for d in psutil.Process(kernel.pid).children(recursive=True) if (p := Proc.of(d.pid))
        ]
        tracked += below
        procs += below
        kernel.kill()
        kernel.wait(30)
        assert survivors(procs, WITHIN) == []
    finally:
        client.stop_channels()


BY_HAND = textwrap.dedent(
    """
    import os, socket, subprocess, sys, time
    entry, cloudpickle_var, cloudpickle_dir = sys.argv[1:4]
    ours, theirs = socket.socketpair()
    # In this group, as the bootstrap is; it holds the channel's other end open, so that
    # the bootstrap does not end at the channel's EOF: only its watchdog can tell.
    sibling = subprocess.Popen(["sleep", "300"], pass_fds=(ours.fileno(),))
    bootstrap = subprocess.Popen(
        [sys.executable, entry, "--fd", str(theirs.fileno()), "--parent", str(os.getpid())],
        pass_fds=(theirs.fileno(),),
        env={**os.environ, cloudpickle_var: cloudpickle_dir},
    )
    theirs.close()
    ours.settimeout(120)
    assert ours.recv(1), "no HELLO"
    print(sibling.pid, bootstrap.pid, flush=True)
    time.sleep(300)
    """
)


def test_an_orphaned_bootstrap_in_its_drivers_group_kills_no_one_else(
    tmp_path: Path, tracked: list[Proc]
) -> None:
    # A bootstrap started as a plain child (run by hand: not the leader of a group of its
    # own) shares its driver's process group. Orphaned, it exits and leaves that group
    # alone. The driver here leads a session, as a kernel does; the rule before workers
    # moved into their driver's session ("our group leads our session") took the shared
    # group for the worker's own and SIGKILLed it, the sibling too.
    script = tmp_path / "by_hand.py"
    script.write_text(BY_HAND)
    argv = [sys.executable, str(script), ENTRY, CLOUDPICKLE_VAR]
    driver = subprocess.Popen(
        [*argv, os.path.dirname(cloudpickle.__file__)],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert driver.stdout is not None
        sibling, bootstrap = (of(int(pid)) for pid in driver.stdout.readline().split())
        tracked += [sibling, bootstrap]
        assert os.getpgid(bootstrap.pid) == os.getpgid(sibling.pid) == driver.pid
    finally:
        sigkill(driver)
    assert survivors([bootstrap], WITHIN) == []  # it noticed, and went
    assert survivors([sibling], 0.5) == [sibling]  # and its group lives on
