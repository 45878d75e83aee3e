"""``%%remote`` and the widgets in a real ipykernel kernel, through jupyter_client: output
streams while the cell runs, rich results are display messages, an interrupt kills the
cell's worker and gives the kernel back, and the build widget's model reaches the frontend
(its comm messages carry the state the widget's traitlets hold)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from kernel_process import running_kernel
from processes import alive


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    # "python3" is ipykernel's native spec, this very interpreter.
    cache = {"JUPYTER_RUNTIMEENV_CACHE": str(tmp_path / "cache")}
    with running_kernel(tmp_path, cache) as (km, client):
        yield km, client


def execute(
    client: BlockingKernelClient, code: str, timeout: float = 120
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run ``code``; the reply's content and every iopub message of it, in order."""
    messages: list[dict[str, Any]] = []
    reply = client.execute_interactive(code, output_hook=messages.append, timeout=timeout)
    return reply["content"], messages


def streamed(messages: list[dict[str, Any]]) -> str:
    return "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")


def test_output_streams_while_the_cell_runs_and_results_are_rich(
    kernel: tuple[KernelManager, BlockingKernelClient], tmp_path: Path
) -> None:
    _, client = kernel
    reply, _ = execute(client, "%load_ext jupyter_runtimeenv")
    assert reply["status"] == "ok"
    flag = tmp_path / "go"
    code = "class Card:\n    def _repr_html_(self):\n        return '<b>card</b>'\ncard = Card()\n"
    assert execute(client, code)[0]["status"] == "ok"
    client.execute(
        "%%remote --out answer\n"
        "import os, time\n"
        "print('first line', flush=True)\n"
        f"while not os.path.exists({str(flag)!r}):\n"
        "    time.sleep(0.05)\n"
        "display(card)\n"
        "answer = 42\n"
        "card"
    )
    # The first line arrives while the cell still waits for the flag.
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while "first line" not in streamed(seen):
        assert time.monotonic() < deadline, seen
        seen.append(client.get_iopub_msg(timeout=60))
    assert not any(
        m["msg_type"] == "status" and m["content"]["execution_state"] == "idle" for m in seen
    )
    flag.touch()
    while not any(
        m["msg_type"] == "status" and m["content"]["execution_state"] == "idle" for m in seen[-1:]
    ):
        seen.append(client.get_iopub_msg(timeout=60))
    assert streamed(seen) == "first line\n"  # no "(task pid=N)" prefix on a cell's lines
    displays = [m for m in seen if m["msg_type"] == "display_data"]
    assert displays[0]["content"]["data"]["text/html"] == "<b>card</b>"
    [result] = [m for m in seen if m["msg_type"] == "execute_result"]
    assert result["content"]["data"]["text/html"] == "<b>card</b>"
    reply, messages = execute(client, "print(answer)")
    assert streamed(messages) == "42\n"


def test_an_interrupt_kills_the_cells_worker_and_returns_the_kernel(
    kernel: tuple[KernelManager, BlockingKernelClient],
) -> None:
    km, client = kernel
    assert execute(client, "%load_ext jupyter_runtimeenv")[0]["status"] == "ok"
    client.execute(
        "%%remote\nimport os, time\nprint('pid', os.getpid(), flush=True)\ntime.sleep(600)"
    )
    seen: list[dict[str, Any]] = []
    while not re.search(r"pid (\d+)", streamed(seen)):
        seen.append(client.get_iopub_msg(timeout=60))
    pid = int(re.search(r"pid (\d+)", streamed(seen)).group(1))  # type: ignore[union-attr]
    assert alive(pid)

    km.interrupt_kernel()
    interrupted = time.monotonic()
    reply = client.get_shell_msg(timeout=30)
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "RemoteInterrupt"
    while alive(pid):
        assert time.monotonic() - interrupted < 3.0, "the worker outlived the interrupt by 3 s"
        time.sleep(0.02)
    while True:  # the error the cell showed: one line, no traceback of the magic
        msg = client.get_iopub_msg(timeout=30)
        if msg["msg_type"] == "error":
            assert msg["content"]["traceback"] == [
                "KeyboardInterrupt: %%remote cell stopped; its worker was killed, and the"
                " remote namespace of the default env was lost with it"
            ]
            break
    # The kernel is back, and the env still runs cells. (ipykernel aborts requests that
    # arrive just after an error, while it is still "stopping on error": ask again then.)
    for _ in range(50):
        reply, messages = execute(client, "%%remote\nprint('again')")
        if reply["status"] != "aborted":
            break
        time.sleep(0.1)
    assert reply["status"] == "ok"
    assert streamed(messages) == "again\n"


def test_a_progress_line_shows_while_a_remote_cell_runs(
    kernel: tuple[KernelManager, BlockingKernelClient], tmp_path: Path
) -> None:
    """Issue 21 item 7: a ``\\r`` progress line arrives before its newline (and before the
    cell ends), without the task prefix, and reads as its last state."""
    _, client = kernel
    assert execute(client, "%load_ext jupyter_runtimeenv")[0]["status"] == "ok"
    flag = tmp_path / "go"
    client.execute(
        "%%remote\n"
        "import os, time\n"
        "for step in range(1, 6):\n"
        "    print(f'\\r{step * 10:3d}%', end='', flush=True)\n"
        f"while not os.path.exists({str(flag)!r}):\n"
        "    time.sleep(0.02)\n"
        "print('\\r100%')\n"
    )
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while " 50%" not in streamed(seen):  # the cell cannot end before the flag exists
        assert time.monotonic() < deadline, seen
        seen.append(client.get_iopub_msg(timeout=60))
    flag.touch()
    while not any(
        m["msg_type"] == "status" and m["content"]["execution_state"] == "idle" for m in seen[-1:]
    ):
        seen.append(client.get_iopub_msg(timeout=60))
    text = streamed(seen)
    assert "pid=" not in text
    assert text.endswith("\r100%\n")
    assert text.split("\n")[0].split("\r")[-1] == "100%"


def test_a_cells_last_line_stays_open_as_a_local_cells_does(
    kernel: tuple[KernelManager, BlockingKernelClient],
) -> None:
    """``print(i, end=' ')`` as a cell's last output: the same stream text as the local cell
    (no newline added when the task ends), and the next remote cell's lines are its own."""
    _, client = kernel
    assert execute(client, "%load_ext jupyter_runtimeenv")[0]["status"] == "ok"
    code = "for i in range(4):\n    print(i, end=' ')"
    reply, local = execute(client, code)
    assert reply["status"] == "ok"
    reply, remote = execute(client, "%%remote\n" + code)
    assert reply["status"] == "ok"
    assert streamed(remote) == streamed(local) == "0 1 2 3 "
    reply, messages = execute(client, "%%remote\nprint('next')\nprint('end', end='')")
    assert streamed(messages) == "next\nend"


def test_a_syntax_error_shows_as_the_same_code_in_a_plain_cell(
    kernel: tuple[KernelManager, BlockingKernelClient],
) -> None:
    """The body's own line numbers and the plain cell's file name, not counting the
    ``%%remote`` line: ename, evalue and the caret block are the local cell's."""
    _, client = kernel
    assert execute(client, "%load_ext jupyter_runtimeenv")[0]["status"] == "ok"
    codes = [
        "frame.loc[(:, 1), (:, 'HR')]",  # the Handbook's 03.05
        "%timeit sum(range(3),\n    start=0)",  # 03.12: an IndentationError on line 2
        "def f():\nreturn 1",  # the message names a line too
    ]
    for code in codes:
        shown = []
        for cell in (code, "%%remote\n" + code):
            reply, messages = execute(client, cell)
            assert reply["status"] == "error"
            [error] = [m["content"] for m in messages if m["msg_type"] == "error"]
            text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error["traceback"]))
            caret = re.sub(r"In\[\d+\]", "In[n]", text[text.rindex("Cell In[") :])
            shown.append((error["ename"], error["evalue"], caret))
        assert shown[1] == shown[0], code


def test_a_shell_command_shows_as_in_a_local_cell(
    kernel: tuple[KernelManager, BlockingKernelClient],
) -> None:
    """``!cmd`` runs in a pseudo-terminal, as ipykernel runs it (pexpect): its output and
    errors are one stdout stream whose lines end with ``\\r\\n`` (handbook.py: ``!head``,
    ``!ls`` of a missing file)."""
    _, client = kernel
    assert execute(client, "%load_ext jupyter_runtimeenv")[0]["status"] == "ok"
    code = "!echo out; echo err >&2; ls /nowhere-at-all; printf 'no end'"
    shown = []
    for cell in (code, "%%remote\n" + code):
        reply, messages = execute(client, cell)
        assert reply["status"] == "ok"
        streams: list[tuple[str, str]] = []
        for m in messages:
            if m["msg_type"] != "stream":
                continue
            name, text = m["content"]["name"], m["content"]["text"]
            if streams and streams[-1][0] == name:
                streams[-1] = (name, streams[-1][1] + text)
            else:
                streams.append((name, text))
        shown.append(streams)
    assert shown[0][0][1].startswith("out\r\nerr\r\n")  # the local cell, as ipykernel shows it
    assert shown[1] == shown[0]
