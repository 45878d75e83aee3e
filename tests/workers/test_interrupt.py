"""An interrupt stops the remote work it interrupted (issue 8, item 7).

A real SIGINT: to a script blocked in ``get``, ``result``, ``wait`` and ``await``, and to a
real kernel (jupyter_client) blocked in a cell. Each time the futures waited on are
cancelled, their workers are gone within seconds, the message is one line, and the next
task runs on a fresh worker. ``cancel`` (the reusable form) is tested in-process.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from kernel_process import kernel_manager

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.errors import RemoteInterrupt
from jupyter_runtimeenv.workers.interrupt import describe, interrupted
from jupyter_runtimeenv.workers.pool import Pool
from tests.workers.helpers import submit, wait_gone

SCRIPT = Path(__file__).with_name("_interrupt_script.py")


@pytest.mark.parametrize(
    ("mode", "raised", "message"),
    [
        ("get", "RemoteInterrupt", "cancelled 3 remote tasks of crunch"),
        ("result", "RemoteInterrupt", "cancelled 1 remote task of crunch"),
        ("wait", "RemoteInterrupt", "cancelled 3 remote tasks of crunch"),
        # asyncio.run turns Ctrl-C into cancelling its task, which cancels the future.
        ("await", "KeyboardInterrupt", None),
    ],
)
def test_sigint_while_waiting_cancels_and_kills(
    mode: str, raised: str, message: str | None, tmp_path: Path
) -> None:
    env = dict(os.environ, JUPYTER_RUNTIMEENV_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first, proc.communicate(timeout=30)[1]
        pids = json.loads(first)["pids"]
        assert pids
        assert all(psutil.pid_exists(p) for p in pids)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["raised"] == raised
    if message is not None:
        assert report["message"] == message
        assert report["suppressed_context"] is True
    assert all(report["cancelled"])
    assert report["alive_after"] == []
    assert report["next_pid"] not in pids
    assert report["children_left"] == []
    wait_gone(pids)


# -- in a real kernel -------------------------------------------------------------------

SETUP = """
import os, time
import jupyter_runtimeenv as jre
from jupyter_runtimeenv.workers.executor import LocalExecutor
if "executor" in globals():
    executor.shutdown()
executor = LocalExecutor(max_workers=2)
jre.init(executor=executor)

@jre.remote
def crunch(x):
    print("started", flush=True)
    time.sleep(600)
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KernelManager, Any]]:
    env = dict(os.environ, JUPYTER_RUNTIMEENV_CACHE=str(tmp_path_factory.mktemp("kcache")))
    with kernel_manager() as km:  # on unix sockets: no TCP port for another process to take
        km.start_kernel(env=env)
        client = km.client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            reply = client.execute_interactive(SETUP, timeout=60)
            assert reply["content"]["status"] == "ok", reply["content"]
            yield km, client
        finally:
            client.stop_channels()


def _kernel_workers(km: KernelManager) -> list[int]:
    kernel = psutil.Process(km.provisioner.pid)  # type: ignore[union-attr]
    found = []
    for child in kernel.children(recursive=True):
        try:
            argv = child.cmdline()
            # Workers; not the kernel's template that forks them (it is no task's worker).
            if any(part.endswith("_entry.py") for part in argv) and argv[-1:] != ["--zygote"]:
                found.append(child.pid)
        except psutil.NoSuchProcess:
            pass
    return found


def _collect_until_idle(client: BlockingKernelClient, msg_id: str) -> list[dict[str, Any]]:
    messages = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            msg = client.get_iopub_msg(timeout=5)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return messages
    raise AssertionError(f"the kernel did not finish the cell: {messages}")


@pytest.mark.parametrize(
    ("cell", "started", "expected"),
    [
        ("fs = [crunch.remote(i) for i in range(3)]\njre.get(fs)", 2, "3 remote tasks"),
        ("crunch.remote(1).result()", 1, "1 remote task"),
        ("fs = [crunch.remote(i) for i in range(3)]\njre.wait(fs, 3)", 2, "3 remote tasks"),
    ],
    ids=["get", "result", "wait"],
)
def test_interrupting_a_kernel_kills_the_workers_and_says_one_line(
    kernel: tuple[KernelManager, Any], cell: str, started: int, expected: str
) -> None:
    km, client = kernel
    msg_id = client.execute(cell)
    seen = 0
    deadline = time.monotonic() + 120
    while seen < started:  # the tasks print when they start: the cell is waiting by now
        assert time.monotonic() < deadline, "the tasks did not start"
        try:
            msg = client.get_iopub_msg(timeout=5)
        except queue.Empty:
            continue
        if msg["msg_type"] == "stream" and "started" in msg["content"]["text"]:
            seen += msg["content"]["text"].count("started")
    workers = _kernel_workers(km)
    assert len(workers) >= started
    km.interrupt_kernel()
    messages = _collect_until_idle(client, msg_id)
    (error,) = [m["content"] for m in messages if m["msg_type"] == "error"]
    assert error["traceback"] == [f"KeyboardInterrupt: cancelled {expected} of crunch"]
    assert error["ename"] == "RemoteInterrupt"
    wait_gone(workers, timeout=10)
    # The kernel answers, and the next task runs on a fresh worker.
    outputs: list[dict[str, Any]] = []
    reply = client.execute_interactive(
        "print(jre.get(jre.remote(os.getpid).remote(), timeout=60))",
        timeout=90,
        output_hook=outputs.append,
    )
    assert reply["content"]["status"] == "ok"
    text = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
    assert int(text.split()[-1]) not in workers
    # A fresh executor for the next test; this one's idle worker must not outlive the test.
    reply = client.execute_interactive(SETUP, timeout=60)
    assert reply["content"]["status"] == "ok"


# -- in process -------------------------------------------------------------------------


def _nap(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def test_cancel_kills_running_tasks_and_drops_queued_ones(make_pool: Any) -> None:
    pool: Pool = make_pool(max_workers=1)
    done = submit(pool, _nap, 0)
    assert done.result(30)
    running = submit(pool, _nap, 600)
    queued = submit(pool, _nap, 0)
    deadline = time.monotonic() + 30
    while not running.running():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    victim = pool.pids
    assert jre.cancel([done, running, queued]) == [running, queued]
    assert running.cancelled()
    assert queued.cancelled()
    assert not done.cancelled()
    wait_gone(victim)
    assert submit(pool, _nap, 0).result(30) not in victim
    assert jre.cancel(running) == []  # already cancelled: nothing to do
    with pytest.raises(TypeError, match="expects futures"):
        jre.cancel(["not a future"])  # type: ignore[list-item]


def test_the_interrupt_counts_what_an_inner_wait_cancelled(make_pool: Any) -> None:
    pool: Pool = make_pool(max_workers=1)
    first, second = submit(pool, _nap, 600), submit(pool, _nap, 600)
    inner = interrupted(first, KeyboardInterrupt())
    assert str(inner) == "cancelled 1 remote task of _nap"
    outer = interrupted([first, second], inner)
    assert outer.cancelled == [first, second]
    assert str(outer) == "cancelled 2 remote tasks of _nap"
    assert isinstance(outer, KeyboardInterrupt)
    assert not isinstance(outer, Exception)
    assert outer._render_traceback_() == ["KeyboardInterrupt: cancelled 2 remote tasks of _nap"]
    assert str(interrupted([first], None)) == ""  # nothing left to cancel: a bare interrupt
    assert RemoteInterrupt("")._render_traceback_() == ["KeyboardInterrupt"]


def test_describe_names_the_functions() -> None:
    class Named:
        def __init__(self, name: str) -> None:
            self.name = name

    futures: Any = [Named(n) for n in ["a", "b", "a", "c", "d", "e"]]
    assert describe(futures) == "cancelled 6 remote tasks of a, b, c and 2 more"
