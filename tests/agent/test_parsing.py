"""``ParseRunner``: parses in daemon threads of their own, bounded in number and in time."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import pytest

from jupyter_runtimeenv.agent.parsing import ParseRunner
from jupyter_runtimeenv.errors import SpecError


async def test_a_parse_past_its_deadline_is_a_spec_error_and_frees_its_slot_when_done() -> None:
    runner = ParseRunner(max_parallel=1, timeout=0.5)
    release = threading.Event()
    with pytest.raises(SpecError, match=r"took longer than 0\.5 s"):
        await runner.run(release.wait)
    assert runner.running == 1  # the thread still runs, holding the only slot
    # The next caller waits for the slot; it gets it once the stuck parse ends.
    release.set()
    assert await runner.run(lambda x: x + 1, 41) == 42
    deadline = time.monotonic() + 30
    while runner.running and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert runner.running == 0


async def test_errors_and_context_reach_the_caller() -> None:
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    var.set("caller's")
    runner = ParseRunner(max_parallel=2, timeout=None)
    assert await runner.run(var.get) == "caller's"
    with pytest.raises(SpecError, match="bad"):
        await runner.run(lambda: (_ for _ in ()).throw(SpecError("f", "bad")))
    results = await asyncio.gather(*(runner.run(lambda i=i: i * 2) for i in range(8)))
    assert results == [i * 2 for i in range(8)]


def test_a_hung_parse_does_not_hold_the_interpreter_exit() -> None:
    # asyncio.to_thread's workers are joined at exit; a parse thread is a daemon.
    code = (
        "import asyncio, threading\n"
        "from jupyter_runtimeenv.agent.parsing import ParseRunner\n"
        "async def main():\n"
        "    r = ParseRunner(timeout=0.2)\n"
        "    try:\n"
        "        await r.run(threading.Event().wait)\n"
        "    except Exception as e:\n"
        "        print(type(e).__name__)\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "SpecError"
