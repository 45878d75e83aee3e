"""Zygote workers (issue 19 item 1): forked from a template where a fork gives exactly what a
spawn would, spawned where it cannot.

Each test compares what a worker sees (``snapshot``: ``os.environ``, ``sys.path``, cwd,
``sys.flags``, resource limits, umask, niceness, affinity, process group and session, its
parent, its command line, signal mask and handlers, its descriptors, its watchdog threads)
with what a worker spawned as before (``JUPYTER_RUNTIMEENV_ZYGOTE=0``) sees, in the same
driver state. The driver's state is changed after its template started (umask, a resource
limit, the cwd, a variable): a forked worker must follow the driver, not the template.
Real processes throughout: the template, its forks, spawned workers, a real agent building
the ``py_executable`` env.
"""

from __future__ import annotations

import os
import resource
import signal
import site
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from processes import cmdline, of, survivors

from jupyter_runtimeenv.client import EmbeddedClient
from jupyter_runtimeenv.context import EnvContext
from jupyter_runtimeenv.plugins._uv import uv_bin
from jupyter_runtimeenv.workers import lifeline, process, zygote
from jupyter_runtimeenv.workers.pool import Pool
from tests.workers.helpers import submit

#: Workers and templates start in the driver's session (``lifeline.OWN_GROUP``).
IN_DRIVERS_SESSION = "process_group" in lifeline.OWN_GROUP

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or os.uname().machine not in ("x86_64", "aarch64"),
    reason="templates fork workers on Linux x86_64/aarch64",
)


def snapshot() -> dict[str, Any]:
    """What a worker sees of its process (runs in the worker)."""
    import os
    import resource
    import signal
    import stat
    import sys

    mask = os.umask(0o022)
    os.umask(mask)
    lifeline = int(sys.argv[sys.argv.index("--lifeline") + 1])
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))

    def kind(fd: int) -> str:
        mode = os.fstat(fd).st_mode
        for name in ("FIFO", "CHR", "SOCK"):
            if getattr(stat, f"S_IS{name}")(mode):
                return name.lower()
        return "other"

    with open("/proc/self/cmdline", "rb") as f:
        cmdline = f.read().split(b"\0")
    return {
        "environ": dict(os.environ),
        "sys_path": list(sys.path),
        "cwd": os.getcwd(),
        "flags": tuple(sys.flags),
        "warnoptions": list(sys.warnoptions),
        "executable": (sys.executable, sys.prefix, sys.base_prefix),
        "rlimits": {
            name: resource.getrlimit(getattr(resource, name))
            for name in dir(resource)
            if name.startswith("RLIMIT_")
        },
        "umask": mask,
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "affinity": sorted(os.sched_getaffinity(0)),
        "leader": (os.getpgid(0) == os.getpid(), os.getsid(0)),
        "ppid": os.getppid(),
        "entry": [part for part in cmdline if part.endswith(b"_entry.py")] != [],
        "forked": cmdline[-2:] == [b"--forked", b""] and sys.argv[-1] == "--forked",
        "sigmask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "handlers": {
            int(s): repr(signal.getsignal(s)) for s in signal.valid_signals() if s < signal.SIGRTMIN
        },
        "stdio": [kind(fd) for fd in (0, 1, 2)],
        "lifeline": kind(lifeline),
        "fd_count": len(fds) - 1,  # the one listdir opened
        "threads": len(os.listdir("/proc/self/task")),
        "stdout_encoding": (sys.stdout.encoding, sys.stdout.line_buffering),
        "filesystem_encoding": sys.getfilesystemencoding(),
    }


def same_but_spawned(snap: dict[str, Any]) -> dict[str, Any]:
    """A snapshot without what is not the same in two workers whatever their start: whether
    it was forked, and the switch that says so."""
    out = dict(snap)
    out.pop("forked")
    out["environ"] = {k: v for k, v in snap["environ"].items() if k != zygote.ZYGOTE_VAR}
    return out


@pytest.fixture
def pools() -> Iterator[Callable[..., Pool]]:
    made: list[Pool] = []

    def make(ctx: EnvContext, idle_timeout: float = 60.0) -> Pool:
        pool = Pool(lambda: ctx, max_workers=1, idle_timeout=idle_timeout)
        made.append(pool)
        return pool

    yield make
    for pool in made:
        pool.close()
    zygote.stop_all()


def template_ready(
    ctx: EnvContext, pools: Callable[..., Pool], idle_timeout: float = 60.0
) -> zygote.Template:
    """Start ``ctx``'s template (its first worker is forked from it) and wait until it is ready."""
    submit(pools(ctx, idle_timeout), os.getpid).result(120)
    deadline = time.monotonic() + 120
    while True:
        ready = [t for t in zygote.templates() if t.python == ctx.python and t.state == "ready"]
        if ready:
            return ready[0]
        assert time.monotonic() < deadline, f"no template became ready: {zygote.templates()}"
        time.sleep(0.02)


def run_snapshot(ctx: EnvContext, pools: Callable[..., Pool], *, spawn: bool) -> dict[str, Any]:
    """A new worker's snapshot: forked if it can be, or spawned (``spawn``: templates off)."""
    if spawn:
        os.environ[zygote.ZYGOTE_VAR] = "0"
    try:
        return dict(submit(pools(ctx), snapshot).result(120))
    finally:
        os.environ.pop(zygote.ZYGOTE_VAR, None)


@pytest.fixture
def driver_changed(tmp_path: Path) -> Iterator[Path]:
    """The driver changes what workers inherit after its template started."""
    cwd, mask = os.getcwd(), os.umask(0o027)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    os.chdir(tmp_path)
    os.environ["JRE_SET_LATE"] = "after the template"
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1000), hard))
    try:
        yield tmp_path
    finally:
        os.chdir(cwd)
        os.umask(mask)
        os.environ.pop("JRE_SET_LATE", None)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_forked_worker_is_what_a_spawned_one_would_be(
    ctx: EnvContext, pools: Callable[..., Pool], request: pytest.FixtureRequest
) -> None:
    template = template_ready(ctx, pools)
    request.getfixturevalue("driver_changed")
    forked = run_snapshot(ctx, pools, spawn=False)
    spawned = run_snapshot(ctx, pools, spawn=True)
    assert forked["forked"], "the worker was not forked from the template"
    assert not spawned["forked"]
    assert same_but_spawned(forked) == same_but_spawned(spawned)
    # And what that means, said plainly:
    assert forked["environ"]["JRE_SET_LATE"] == "after the template"
    assert forked["environ"]["JRE_TEST"] == "direct"
    assert forked["cwd"] == os.path.realpath(request.getfixturevalue("tmp_path"))
    assert forked["umask"] == 0o027
    # The leader of its own group, in the driver's session (its turn on the CPUs is the
    # driver's: lifeline.OWN_GROUP), as a spawned one is; Python 3.10: a session of its own.
    assert forked["leader"][0]
    assert (forked["leader"][1] == os.getsid(0)) == IN_DRIVERS_SESSION
    assert forked["ppid"] == os.getpid() != template.pid
    assert forked["entry"]
    assert forked["lifeline"] == "fifo"
    assert forked["stdio"] == ["chr", "fifo", "fifo"]
    assert forked["threads"] == 3  # main, and the watchdog's two
    assert signal.SIGRTMIN + 6 in forked["sigmask"]


def test_the_first_worker_of_the_drivers_interpreter_is_forked_from_the_template_it_starts(
    ctx: EnvContext, pools: Callable[..., Pool]
) -> None:
    # Not spawned beside its template (two interpreter starts at once): it waits for the
    # template and is forked from it.
    zygote.stop_all()
    first = run_snapshot(ctx, pools, spawn=False)
    assert first["forked"]
    (template,) = [t for t in zygote.templates() if t.python == ctx.python]
    assert template.state == "ready"
    assert same_but_spawned(first) == same_but_spawned(run_snapshot(ctx, pools, spawn=True))


def test_env_vars_and_cwd_of_the_env_reach_a_forked_worker(
    ctx: EnvContext, pools: Callable[..., Pool], tmp_path: Path
) -> None:
    template_ready(ctx, pools)
    other = ctx.replace(env_vars={"MODE": "fast", "PATH": "/opt/x:${PATH}"}, cwd=str(tmp_path))
    forked = run_snapshot(other, pools, spawn=False)
    assert forked["forked"]
    assert forked["environ"]["MODE"] == "fast"
    assert forked["environ"]["PATH"] == "/opt/x:" + os.environ["PATH"]
    assert "JRE_TEST" not in forked["environ"]
    assert forked["cwd"] == str(tmp_path)
    assert same_but_spawned(forked) == same_but_spawned(run_snapshot(other, pools, spawn=True))


@pytest.mark.parametrize(
    "why",
    ["command prefix", "py_executable", "PYTHON* variable", "loader variable"],
)
def test_what_cannot_be_forked_is_spawned_exactly(
    why: str,
    ctx: EnvContext,
    pools: Callable[..., Pool],
    client: EmbeddedClient,
) -> None:
    template_ready(ctx, pools)
    if why == "command prefix":
        other = ctx.replace(command_prefix=["nice", "-n", "3"])
    elif why == "py_executable":
        built = client.acquire_sync({"py_executable": sys.executable}, "test")
        assert built.spawn_only
        other = ctx.replace(
            python=built.python, command_prefix=list(built.command_prefix), spawn_only=True
        )
    elif why == "PYTHON* variable":
        other = ctx.replace(env_vars={"PYTHONWARNINGS": "ignore::UserWarning"})
    else:
        other = ctx.replace(env_vars={"LD_LIBRARY_PATH": "/nonexistent/lib"})
    first = run_snapshot(other, pools, spawn=False)
    assert not first["forked"], f"a worker with a {why} was forked"
    assert same_but_spawned(first) == same_but_spawned(run_snapshot(other, pools, spawn=True))
    if why == "command prefix":
        assert first["nice"] == os.getpriority(os.PRIO_PROCESS, 0) + 3
    if why == "PYTHON* variable":
        assert first["warnoptions"] == ["ignore::UserWarning"]


def test_a_template_stops_when_idle_and_its_workers_live_on(
    ctx: EnvContext, pools: Callable[..., Pool]
) -> None:
    template = template_ready(ctx, pools, idle_timeout=0.5)
    process = of(template.pid)
    pool = pools(ctx, 0.5)
    future = submit(pool, time.sleep, 60)  # busy: its pool's idle timeout cannot stop it
    deadline = time.monotonic() + 120
    while not pool.pids:
        assert time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.02)
    worker = of(pool.pids[0])
    cmdline = Path(f"/proc/{worker.pid}/cmdline")
    while b"--forked" not in cmdline.read_bytes():  # renamed as it sets up, before HELLO
        assert time.monotonic() < deadline, f"not a forked worker: {cmdline.read_bytes()!r}"
        time.sleep(0.02)
    assert survivors([process], 30) == [], "the idle template did not stop"
    assert template not in zygote.templates()
    assert worker.alive(), "a forked worker died with its template"
    future.cancel()


def test_a_dead_template_is_replaced_and_never_hangs_a_worker(
    ctx: EnvContext, pools: Callable[..., Pool]
) -> None:
    template = template_ready(ctx, pools)
    process = of(template.pid)
    os.kill(template.pid, signal.SIGKILL)
    assert survivors([process], 30) == []
    # The next worker is spawned (the template is found dead on the way), a later one
    # forked from a new template.
    assert isinstance(submit(pools(ctx), os.getpid).result(120), int)
    fresh = template_ready(ctx, pools)
    assert fresh.pid != template.pid
    assert run_snapshot(ctx, pools, spawn=False)["forked"]


def spare_of(template: zygote.Template) -> int:
    """The pid of the template's spare (a worker forked ahead of its request) once it has
    made one: our child, template-shaped, not the template."""
    deadline = time.monotonic() + 60
    while not (spares := spares_among_children(template)):
        assert time.monotonic() < deadline, "the template made no spare"
        time.sleep(0.02)
    assert len(spares) == 1, f"more than one spare: {spares}"
    return spares[0]


def spares_among_children(template: zygote.Template) -> list[int]:
    """Our children that are template-shaped but not ``template``: its spares."""
    return [
        child.pid
        for child in psutil.Process().children()
        if child.pid != template.pid and cmdline(child)[-1:] == ["--zygote"]
    ]


def reaped(pid: int) -> bool:
    """Whether our child ``pid`` is gone and reaped (neither running nor a zombie)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_the_templates_spare_becomes_the_next_worker_and_a_stopped_one_is_reaped(
    ctx: EnvContext, pools: Callable[..., Pool]
) -> None:
    template = template_ready(ctx, pools)
    spare = spare_of(template)
    assert cmdline(spare)[-1:] == ["--zygote"]  # not a worker until it is handed one
    # Its group made ahead of its request (not at the instant of its clone: it is named a
    # spare from birth, and a loaded machine showed it here before its setpgid).
    deadline = time.monotonic() + 30
    while os.getpgid(spare) != spare:
        assert time.monotonic() < deadline, "the spare made no group of its own"
        time.sleep(0.01)
    # In the driver's session, as the template is (each its own group): the kernel's turn
    # on the CPUs, not one of their own each.
    assert (os.getsid(spare) == os.getsid(0)) == IN_DRIVERS_SESSION
    assert os.getpgid(template.pid) == template.pid
    assert (os.getsid(template.pid) == os.getsid(0)) == IN_DRIVERS_SESSION
    assert comm(spare) == f"jrespare{template.pid}"  # what the driver finds orphans by
    assert submit(pools(ctx), os.getpid).result(120) == spare
    # A worker now: its own name back (not compared with the template's, which carries
    # the spare name itself for the instant it clones the next spare)
    assert comm(spare) != f"jrespare{template.pid}"
    # It was handed out (a worker now, ours to reap as any): the template makes another,
    # our child too (the driver hears of it with the template's next answer, or as it stops).
    following = spare_of(template)
    assert following != spare
    zygote.stop_all()
    deadline = time.monotonic() + 30
    while not reaped(following):  # it sees its template's EOF, exits, and is reaped
        assert time.monotonic() < deadline, f"spare {following} is not reaped"
        time.sleep(0.02)


def comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


def test_a_spare_the_driver_never_heard_of_is_reaped_when_its_template_stops(
    ctx: EnvContext, pools: Callable[..., Pool]
) -> None:
    # A template SIGKILLed between cloning a spare and sending the driver its pid leaves a
    # spare only its name tells (a zombie at the end of a whole-suite run under a CPU hog;
    # the instant cannot be hit on demand). The stand-in for that spare is a real child of
    # ours under the spare's name that exits at EOF, as a spare whose template died does.
    template = template_ready(ctx, pools)
    r, w = os.pipe()
    code = (
        "import ctypes, os, sys\n"
        "ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)\n"
        "os.read(int(sys.argv[2]), 1)"
    )
    name = f"jrespare{template.pid}"
    orphan = subprocess.Popen([sys.executable, "-c", code, name, str(r)], pass_fds=(r,))
    os.close(r)
    deadline = time.monotonic() + 60
    while comm(orphan.pid) != name:
        assert time.monotonic() < deadline, "the stand-in never took the spare's name"
        time.sleep(0.02)
    process = of(template.pid)
    os.kill(template.pid, signal.SIGKILL)
    assert survivors([process], 30) == []
    os.close(w)  # its template is gone: EOF
    zygote.stop_all()
    assert reaped(orphan.pid), "the spare nobody heard of was left a zombie"


def test_a_dead_spare_is_reaped_and_the_worker_forked_at_once(
    ctx: EnvContext, pools: Callable[..., Pool]
) -> None:
    template = template_ready(ctx, pools)
    spare = spare_of(template)
    process = of(spare)
    os.kill(spare, signal.SIGKILL)
    assert survivors([process], 30) == []  # dead; a zombie until the driver reaps it
    worker = run_snapshot(ctx, pools, spawn=False)
    assert worker["forked"], "the worker was not forked when the spare was dead"
    assert same_but_spawned(worker) == same_but_spawned(run_snapshot(ctx, pools, spawn=True))
    assert reaped(spare), "the dead spare was left a zombie"


def test_a_template_stopped_while_it_is_launched_is_reaped_before_stop_returns(
    ctx: EnvContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A template's launch waits its turn on the launcher thread (every worker and template
    is started there: seconds under CPU hogs). A stop in that wait found no process, reaped
    nothing and returned; the start then launched the template, saw the stop and gave up
    without waiting for it: a zombie for the driver's life (the one seen at the teardown of
    test_learned_imports under two hogs was a child nobody reaped). Here the launch is held
    (a wrapper around the real one, which waits for the test) until the stop runs."""
    launching, go = threading.Event(), threading.Event()
    real = lifeline.launch
    launched: list[int] = []

    def held(start: Callable[[], Any]) -> Any:
        launching.set()
        assert go.wait(60)
        proc = real(start)
        launched.append(proc.pid)
        return proc

    monkeypatch.setattr(lifeline, "launch", held)
    template = zygote.Template(ctx.python, dict(os.environ), process.ENTRY)
    starting = threading.Thread(target=template.start, daemon=True)
    starting.start()
    try:
        assert launching.wait(60)
        threading.Timer(0.2, go.set).start()  # the launch goes on while stop() runs
        template.stop()
        assert launched, "stop() returned before the launch it raced"
        assert reaped(launched[0]), "the template launched after its stop is not reaped"
        assert template.state == "stopped"
    finally:
        go.set()
        starting.join(60)
        for pid in launched:  # a failure's leftovers: ours until reaped
            if not reaped(pid):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)


def import_and_pid(name: str) -> int:
    __import__(name)
    return os.getpid()


def test_a_forked_worker_reports_what_its_calls_imported_not_what_its_template_had(
    ctx: EnvContext, pools: Callable[..., Pool]
) -> None:
    # It knows its template's modules without a copy of sys.modules (_serve.remember_modules).
    spare = spare_of(template_ready(ctx, pools))
    pool = pools(ctx)
    assert submit(pool, import_and_pid, "xml.dom.minidom").result(120) == spare  # forked
    assert "xml.dom.minidom" in pool.habits.imports
    assert not {"json", "pickle", "cloudpickle"} & set(pool.habits.imports)


def test_only_the_latest_one_worker_interpreters_are_remembered(
    ctx: EnvContext, pools: Callable[..., Pool], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process that uses thousands of one-off envs keeps no record of each: one forgotten
    # is only spawned alone again.
    monkeypatch.setattr(zygote, "SPAWNED_ONCE", 1)
    paths = (*ctx.driver_sys_path, *site.getsitepackages())
    envs = []
    for name in ("a", "b"):
        venv = tmp_path / name
        subprocess.run([uv_bin(), "venv", "-q", str(venv), "--python", sys.executable], check=True)
        envs.append(ctx.replace(python=str(venv / "bin" / "python"), driver_sys_path=paths))
    a, b = envs
    assert not run_snapshot(a, pools, spawn=False)["forked"]
    assert not run_snapshot(b, pools, spawn=False)["forked"]  # a is forgotten
    assert not run_snapshot(a, pools, spawn=False)["forked"]  # a's "first" again
    assert zygote.templates() == []
    assert len(zygote._spawned_once) == 1
