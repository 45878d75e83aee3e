"""``%runtime_env``'s eager build starts the env's first worker, so the next cell's first
call finds it (real shell, real agent, real worker processes; no timing asserted: that is
benchmarks/run.py's W6)."""

from __future__ import annotations

import time

from IPython.core.interactiveshell import InteractiveShell

from jupyter_runtimeenv import api, session
from jupyter_runtimeenv.workers.executor import LocalExecutor


def test_an_eager_build_prestarts_the_worker_the_first_call_uses(shell: InteractiveShell) -> None:
    shell.run_line_magic("runtime_env", "--env-var EARLY=magic")
    executor = api._executor()
    assert isinstance(executor, LocalExecutor)
    [pool] = executor.pools
    deadline = time.monotonic() + 60
    while not pool.pids and time.monotonic() < deadline:
        time.sleep(0.01)
    [pid] = pool.pids  # started before any call
    shell.run_cell(
        "@remote\n"
        "def where():\n"
        "    import os\n"
        "    return os.getpid(), os.environ['EARLY']\n"
        "where_result = get(where.remote(), timeout=60)"
    )
    assert shell.user_ns["where_result"] == (pid, "magic")
    assert executor.pools == [pool]


def test_no_worker_is_prestarted_without_an_eager_build(shell: InteractiveShell) -> None:
    shell.run_line_magic("runtime_env", "--env-var EARLY=lazy --no-eager-install")
    executor = session.executor()
    assert not isinstance(executor, LocalExecutor) or executor.pools == []
