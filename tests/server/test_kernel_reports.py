"""``server/kernels.py`` alone: report validation, change events, who may be stopped."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

import jupyter_runtimeenv
from jupyter_runtimeenv.server.kernels import KernelReports, ReportError, validate_report
from jupyter_runtimeenv.server.panel import name_holder


def test_holders_are_named_as_users_know_them() -> None:
    paths = {"k1": "work/a.ipynb"}
    assert name_holder("kernel:k1/pool:1:2:abc", paths)["label"] == "work/a.ipynb (workers)"
    assert name_holder("kernel:k1/runtime_env-magic:9:1", paths)["label"] == (
        "work/a.ipynb (%runtime_env)"
    )
    # The provisioner's holder: the kernel runs in that env (a kernelspec made from it).
    assert name_holder("kernel:k1", paths)["label"] == "work/a.ipynb (kernel's env)"
    assert name_holder("kernel:zz123456789", paths)["label"] == "kernel zz123456 (kernel's env)"
    assert name_holder("cli", paths)["label"] == "CLI"
    # A `jupyter runtimeenv build`'s own reference names its process.
    assert name_holder("cli:4242", paths) == {
        "id": "cli:4242",
        "label": "CLI (pid 4242)",
        "kind": "cli",
    }
    assert name_holder("rebuild", paths)["label"] == "rebuild (sidebar)"
    assert name_holder("name:gpu", paths)["label"] == "env gpu"
    assert name_holder("odd", paths) == {"id": "odd", "label": "odd", "kind": "other"}


@pytest.mark.parametrize(
    ("report", "message"),
    [
        ("x", "report: expected a JSON object"),
        ({"pools": {}}, "pools: expected a list of at most 64 pools"),
        ({"pools": [{"env_id": ""}]}, "pools[0].env_id: expected a non-empty string"),
        ({"pools": [{"env_id": "e", "workers": [{"pid": True}]}]}, "pools[0].workers[0].pid"),
        ({"pools": [{"env_id": "e", "workers": [{"pid": 1}]}]}, "expected a process id"),
        ({"pools": [{"env_id": "e", "workers": [{"pid": 9, "rss": -1}]}]}, ".rss: expected"),
        ({"pools": [{"env_id": "e", "workers": [{"pid": 9, "sticky": 3}]}]}, ".sticky: expected"),
        ({"runtime_env": []}, "runtime_env: expected a JSON object or null"),
    ],
)
def test_bad_reports_name_the_field(report: Any, message: str) -> None:
    with pytest.raises(ReportError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate_report(report)


def test_a_report_publishes_only_changes_and_a_gone_event() -> None:
    events: list[dict[str, Any]] = []
    reports = KernelReports(events.append, lambda kernel_id: None)
    report = validate_report({"pools": [{"env_id": "e", "workers": [{"pid": 99}]}]})
    reports.put("k", report)
    reports.put("k", report)
    reports.put("k", {**report, "runtime_env": {"env_vars": {"TOKEN": "secret"}}})
    assert [e["kind"] for e in events] == ["report"]
    assert "runtime_env" not in events[0]  # env_vars values stay out of the event log
    assert reports.get("k")["runtime_env"] == {"env_vars": {"TOKEN": "secret"}}
    reports.prune({"k"})
    reports.prune(set())
    assert [e["kind"] for e in events] == ["report", "gone"]
    assert reports.all() == []


def test_only_a_reported_child_of_the_kernel_is_stopped() -> None:
    # The "kernel" is this process; its child sleeps with a worker's command line (the
    # bootstrap's path, started for this process); an unrelated process is not its child.
    entry = os.path.join(os.path.dirname(jupyter_runtimeenv.__file__), "workers", "_entry.py")
    argv = [
        sys.executable,
        "-c",
        "import time; time.sleep(60)",
        entry,
        "--parent",
        str(os.getpid()),
    ]
    child = subprocess.Popen(argv)
    try:
        for _ in range(6000):  # between fork and exec it still shows this process's cmdline
            with contextlib.suppress(psutil.Error):
                if psutil.Process(child.pid).cmdline() == argv:
                    break
            time.sleep(0.01)
        reports = KernelReports(lambda data: None, lambda kernel_id: os.getpid())
        report = {"pools": [{"env_id": "e", "workers": [{"pid": child.pid}, {"pid": 1234567}]}]}
        reports.put("k", validate_report(report))
        with pytest.raises(LookupError, match="reported no worker"):
            reports.stop_worker("k", os.getpid())
        with pytest.raises(LookupError, match="already stopped"):
            reports.stop_worker("k", 1234567)
        reports._kernel_pid = lambda kernel_id: None  # a kernel without a local process
        with pytest.raises(LookupError, match="cannot check"):
            reports.stop_worker("k", child.pid)
        reports._kernel_pid = lambda kernel_id: 1  # another kernel: not its child
        with pytest.raises(LookupError, match="not a worker of kernel k"):
            reports.stop_worker("k", child.pid)
        reports._kernel_pid = lambda kernel_id: os.getpid()
        reports.stop_worker("k", child.pid)
        assert child.wait(timeout=10) == -9
    finally:
        child.kill()
        child.wait()
