"""Ray's ``worker_process_setup_hook`` and ``py_executable`` with arguments, with real workers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.errors import WorkerError, WorkerSetupError
from jupyter_runtimeenv.plugins._uv import uv_bin
from jupyter_runtimeenv.workers.executor import LocalExecutor

HOOK_LOG = "JRE_TEST_HOOK_LOG"


def record_start() -> None:
    """A hook: note this worker's pid (in a file and in its environment)."""
    os.environ["HOOKED_PID"] = str(os.getpid())
    with open(os.environ[HOOK_LOG], "a") as f:
        f.write(f"{os.getpid()}\n")


def hooked() -> tuple[int, str | None]:
    return os.getpid(), os.environ.get("HOOKED_PID")


def failing_hook() -> None:
    raise ValueError("no GPU configured")


def test_a_callable_hook_runs_once_in_each_worker_before_any_task(
    agent_executor: LocalExecutor, tmp_path: Path
) -> None:
    log = tmp_path / "hook.log"
    env = {"worker_process_setup_hook": record_start, "env_vars": {HOOK_LOG: str(log)}}
    f = jre.remote(runtime_env=env)(hooked)
    results = jre.get([f.remote() for _ in range(6)])
    for pid, seen in results:
        assert seen == str(pid)  # the hook ran in this very worker, before the task
    starts = log.read_text().split()
    assert sorted(starts) == sorted({str(pid) for pid, _ in results})  # once per worker


def test_an_import_path_hook(agent_executor: LocalExecutor, tmp_path: Path) -> None:
    (tmp_path / "hookmod.py").write_text(
        "import os\ndef setup():\n    os.environ['HOOKED_PID'] = str(os.getpid())\n"
    )
    env = {
        "py_modules": [str(tmp_path / "hookmod.py")],
        "worker_process_setup_hook": "hookmod.setup",
    }
    pid, seen = jre.get(jre.remote(runtime_env=env)(hooked).remote())
    assert seen == str(pid)


def test_a_failing_hook_is_a_named_worker_start_error(agent_executor: LocalExecutor) -> None:
    f = jre.remote(runtime_env={"worker_process_setup_hook": failing_hook})(hooked)
    with pytest.raises(WorkerSetupError) as info:
        jre.get(f.remote(), timeout=60)
    assert isinstance(info.value, WorkerError)
    assert "worker_process_setup_hook failing_hook raised ValueError: no GPU configured" in str(
        info.value
    )
    assert "no GPU configured" in info.value.traceback


def interpreter() -> tuple[str, str | None]:
    return sys.executable, os.environ.get("VIA_ENV")


def test_py_executable_with_arguments_like_rays_uv_run(agent_executor: LocalExecutor) -> None:
    # The form Ray's uv integration writes; uv finds the interpreter offline.
    command = f"{uv_bin()} run --no-project --python {sys.executable} python"
    got = jre.get(jre.remote(runtime_env={"py_executable": command})(interpreter).remote())
    assert got[0] == sys.executable
    via_env = f"env VIA_ENV=yes {sys.executable}"
    got = jre.get(jre.remote(runtime_env={"py_executable": via_env})(interpreter).remote())
    assert got == (sys.executable, "yes")
