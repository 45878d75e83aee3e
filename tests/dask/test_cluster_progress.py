"""``progress(futures)`` and ``wait(..., progress=True)`` on Dask futures count per node as
well as in total: real ``LocalCluster`` nodes, real tasks; where a running task runs comes
from the scheduler (``DaskExecutor.locate``)."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import Any

import pytest

import jupyter_runtimeenv as jre
from jupyter_runtimeenv import api
from jupyter_runtimeenv.ipython.tasks import TaskProgress, TaskProgressWidget
from jupyter_runtimeenv.workers.cluster import ClusterFuture


def _hold(path: str) -> str:
    while not os.path.exists(path):
        time.sleep(0.05)
    return "released"


def _nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@pytest.fixture
def executor(make_executor: Any) -> Any:
    made = make_executor()
    api.init(runtime_env={"env_vars": {"P": "1"}}, executor=made)
    return made


def test_running_tasks_are_counted_on_the_node_that_runs_them(executor: Any, tmp_path: Path):
    gate = tmp_path / "go"
    futures = [jre.remote(_hold).remote(str(gate)) for _ in range(2)]
    assert all(isinstance(f, ClusterFuture) for f in futures)
    tracker = TaskProgress(futures, widget=False, out=io.StringIO())
    nodes = sorted(executor.client.scheduler_info()["workers"])
    deadline = time.monotonic() + 120
    while True:
        counts = tracker.counts()
        running = {n.node: n.running for n in counts.nodes}
        if running == dict.fromkeys(nodes, 1):
            break  # one single-threaded node each: both run, one on each node
        assert time.monotonic() < deadline, f"not running on both nodes: {counts}"
        time.sleep(0.2)
    assert counts.running == 2
    gate.write_text("go")
    jre.get(futures, timeout=60)
    counts = tracker.counts()
    assert {n.node: (n.done, n.running) for n in counts.nodes} == dict.fromkeys(nodes, (1, 0))


def test_progress_prints_the_total_then_a_line_per_node(
    executor: Any, capsys: pytest.CaptureFixture[str]
):
    nap = jre.remote(_nap)
    futures = [nap.remote(0.2) for _ in range(6)]
    jre.progress(futures, widget=False)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("tasks: 6/6 finished (6 done, 0 failed, 0 running, 0 queued)")
    per_node = lines[1:]
    hosts = {n.split("://", 1)[1] for n in executor.client.scheduler_info()["workers"]}
    assert {line.split(":", 2)[0] + ":" + line.split(":", 2)[1] for line in per_node} == {
        f"  {host}" for host in hosts
    }
    assert sum(int(line.split(": ", 1)[1].split(" done")[0]) for line in per_node) == 6
    assert all(f.node is not None for f in futures)


def test_wait_with_progress_counts_failures_on_their_node(
    executor: Any, capsys: pytest.CaptureFixture[str]
):
    @jre.remote
    def maybe(i: int) -> int:
        if i % 2:
            raise ValueError(i)
        return i

    futures = [maybe.remote(i) for i in range(4)]
    ready, not_ready = jre.wait(futures, num_returns=4, progress=True, timeout=120)
    assert len(ready) == 4
    assert not not_ready
    out = capsys.readouterr().out
    assert "(2 done, 2 failed, 0 running, 0 queued)" in out
    node_lines = [line for line in out.splitlines() if line.startswith("  127.0.0.1:")]
    assert sum(int(line.split(", ")[1].split(" failed")[0]) for line in node_lines) == 2


def test_the_widget_shows_a_row_per_node(executor: Any):
    nap = jre.remote(_nap)
    futures = [nap.remote(0.1) for _ in range(4)]
    jre.get(futures, timeout=120)
    counts = TaskProgress(futures, widget=False, out=io.StringIO()).counts()
    widget = TaskProgressWidget()
    try:
        widget.show(counts)
        for node in counts.nodes:
            assert f"<code>{node.node}</code>" in widget.html.value
        assert sum(n.done for n in counts.nodes) == 4
        text = widget._repr_mimebundle_()["text/plain"]
        assert text.splitlines()[0].startswith("tasks: 4/4 finished")
        assert len(text.splitlines()) == 1 + len(counts.nodes)
    finally:
        widget.close()
