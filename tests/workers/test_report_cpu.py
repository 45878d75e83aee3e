"""The CPU a kernel's report shows for each worker (``workers/report.CpuMeter``), on real
processes: a busy loop and a sleeper."""

from __future__ import annotations

import subprocess
import sys
import time

from jupyter_runtimeenv.workers.report import CpuMeter


def _spawn(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def test_the_first_look_says_the_cpu_since_the_process_started() -> None:
    busy = _spawn("while True: pass")
    idle = _spawn("import time; time.sleep(60)")
    try:
        time.sleep(1.0)
        meter = CpuMeter()
        # Seen for the first time, already busy: its CPU now, not at the next look.
        # (Relative bounds: on a loaded machine the busy loop gets a fraction of a core.)
        first = meter.percent(busy.pid)
        quiet = meter.percent(idle.pid)
        assert first is not None
        assert quiet is not None
        assert first > quiet, (first, quiet)
        assert quiet < 50, quiet  # the sleeper's start-up, spread over its second of sleep
        time.sleep(0.5)
        second = meter.percent(busy.pid)  # since the first look
        assert second is not None
        assert second > 0, second
    finally:
        for process in (busy, idle):
            process.kill()
            process.wait()


def test_a_process_too_young_or_gone_says_nothing() -> None:
    meter = CpuMeter()
    meter.MIN_AGE = 3600.0  # every process is young to it
    child = _spawn("import time; time.sleep(60)")
    try:
        assert meter.percent(child.pid) is None
        # The next look measures from the first one, whatever the process's age.
        time.sleep(0.2)
        assert meter.percent(child.pid) is not None
    finally:
        child.kill()
        child.wait()
    assert meter.percent(child.pid) is None  # reaped: gone
    meter.forget_except(set())
    assert not meter._seen
