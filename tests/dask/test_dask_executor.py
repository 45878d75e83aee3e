"""``DaskExecutor`` on a real two-worker ``LocalCluster``: environments built on the nodes,
each node with its own cache root, local content shipped by content."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from processes import wait_gone

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.errors import BrokenWorker, BuildError, RemoteTaskError
from tests.dask.helpers import roots_of, worker_pids

distributed = pytest.importorskip("distributed")


def where() -> tuple[str, str, int]:
    """(the MODE variable, the cwd, the pid) of the worker that runs it."""
    return os.environ.get("MODE", ""), os.getcwd(), os.getpid()


def test_env_vars_output_and_session(make_executor: Any, capsys: pytest.CaptureFixture[str]):
    executor = make_executor()
    jre.init(runtime_env={"env_vars": {"MODE": "dask"}}, executor=executor)

    @jre.remote
    def shout(x: int) -> int:
        print(f"line {x}")
        return x * 2

    assert jre.get([shout.remote(i) for i in range(4)]) == [0, 2, 4, 6]
    mode, _cwd, pid = jre.get(jre.remote(where).remote())
    assert mode == "dask"
    out = capsys.readouterr().out
    for i in range(4):
        assert f"line {i}" in out
    # Prefixed with the task, the node and the process, like the local executor's lines.
    assert "(shout node=127.0.0.1:" in out
    assert " pid=" in out
    # The Dask worker process did not run the task itself: an environment worker did.
    assert pid not in worker_pids(executor.client).values()


def test_exception_keeps_type_and_remote_traceback(make_executor: Any):
    jre.init(executor=make_executor())

    @jre.remote
    def fail(key: str) -> None:
        raise KeyError(key)

    with pytest.raises(KeyError) as info:
        jre.get(fail.remote("missing"))
    error = info.value
    assert isinstance(error, RemoteTaskError)
    assert "raise KeyError(key)" in error.remote_traceback
    assert "test_dask_executor.py" in error.remote_traceback


def test_pip_environment_from_the_wheelhouse(make_executor: Any):
    executor = make_executor()
    jre.init(executor=executor)
    spec = {"pip": ["alpha==2.0"], "env_vars": {"MODE": "pip"}}

    def version() -> tuple[str, str]:
        import alpha  # type: ignore[import-not-found]

        return alpha.__version__, alpha.__file__

    built = executor.prepare(spec)
    assert sorted(built) == sorted(roots_of(executor.client))
    got, path = jre.get(jre.remote(version).options(runtime_env=spec).remote())
    assert got == "2.0"
    roots = roots_of(executor.client).values()
    assert any(path.startswith(root) for root in roots), path  # installed on a node
    assert len(set(roots)) == 2  # each node its own cache
    # The Dask worker processes passed bytes through: they never imported the package.
    imported = executor.client.run(lambda: "alpha" in __import__("sys").modules)
    assert not any(imported.values())


def test_build_failure_names_the_node(make_executor: Any):
    executor = make_executor()
    jre.init(executor=executor)
    spec = {"pip": ["alpha==9.9"]}  # not in the wheelhouse
    future = jre.remote(where).options(runtime_env=spec).remote()
    with pytest.raises(BuildError) as info:
        jre.get(future, timeout=240)
    assert "on Dask worker tcp://127.0.0.1:" in str(info.value)
    assert "alpha" in str(info.value)


def test_local_code_travels_and_driver_copy_may_vanish(
    make_executor: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.txt").write_text("from the working dir")
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "shipped_helper.py").write_text("def greet():\n    return 'hello from sys.path'\n")
    monkeypatch.syspath_prepend(str(lib))
    executor = make_executor()
    jre.init(runtime_env={"working_dir": str(work)}, executor=executor)
    executor.prepare()
    sent_before = executor.bytes_sent
    assert sent_before > 0
    # The driver's copies go away before any task runs.
    shutil.rmtree(work)
    shutil.rmtree(lib)

    @jre.remote
    def use(delay: float) -> tuple[str, str, str]:
        import shipped_helper  # type: ignore[import-not-found]

        time.sleep(delay)
        with open("data.txt") as f:
            return f.read(), shipped_helper.greet(), os.getcwd()

    # Two slow tasks at once on two single-threaded workers: one on each node.
    results = jre.get([use.remote(1.5), use.remote(1.5)])
    assert {r[:2] for r in results} == {("from the working dir", "hello from sys.path")}
    roots = list(roots_of(executor.client).values())
    used = {next(root for root in roots if cwd.startswith(root)) for _, _, cwd in results}
    assert used == set(roots)
    assert executor.bytes_sent == sent_before  # nothing sent again


def test_one_byte_change_sends_one_file_once(make_executor: Any, tmp_path: Path):
    work = tmp_path / "tree"
    for i in range(40):
        (work / f"d{i % 4}").mkdir(parents=True, exist_ok=True)
        (work / f"d{i % 4}" / f"f{i}.txt").write_text(f"file {i}\n" * 50)
    tree_bytes = sum(p.stat().st_size for p in work.rglob("*.txt"))
    executor = make_executor()
    spec = {"working_dir": str(work), "driver_sys_path": False}
    executor.prepare(spec)
    # Each blob left the driver once; the second node copied what it lacked from the first.
    assert executor.bytes_sent == tree_bytes
    assert executor.peer_bytes == tree_bytes
    assert executor.blobs_sent == 40
    (work / "d1" / "f5.txt").write_text("file 5\n" * 49 + "file X\n")
    blobs_before, bytes_before = executor.blobs_sent, executor.bytes_sent
    peer_before = executor.peer_bytes
    executor.prepare(spec)
    changed = (work / "d1" / "f5.txt").stat().st_size
    assert executor.blobs_sent - blobs_before == 1  # the one changed file, once
    assert executor.bytes_sent - bytes_before == changed
    assert executor.peer_bytes - peer_before == changed  # the other node's copy


def test_worker_process_killed_mid_task(make_executor: Any, tmp_path: Path):
    jre.init(executor=make_executor())
    marker = tmp_path / "pid"

    @jre.remote
    def hang(path: str) -> None:
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
        time.sleep(60)

    future = hang.remote(str(marker))
    pid = _wait_for_pid(marker)
    psutil.Process(pid).kill()
    with pytest.raises(BrokenWorker) as info:
        jre.get(future, timeout=60)
    assert "on Dask worker tcp://127.0.0.1:" in str(info.value)
    assert f"pid {pid}" in str(info.value)


def test_retries_run_an_idempotent_call_again(make_executor: Any, tmp_path: Path):
    jre.init(executor=make_executor())
    marker = tmp_path / "pid"

    @jre.remote(retries=1)
    def once_killed(path: str) -> str:
        if os.path.exists(path):
            return "second try"
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
        time.sleep(60)
        return "not reached"

    future = once_killed.remote(str(marker))
    psutil.Process(_wait_for_pid(marker)).kill()
    assert jre.get(future, timeout=60) == "second try"


def test_cancel_kills_the_running_task(make_executor: Any, tmp_path: Path):
    jre.init(executor=make_executor())
    marker = tmp_path / "pid"

    @jre.remote
    def hang(path: str) -> None:
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
        time.sleep(60)

    future = hang.remote(str(marker))
    pid = _wait_for_pid(marker)
    assert future.cancel()
    assert _gone(pid, timeout=15)


def test_two_executors_share_a_cluster(make_executor: Any, cluster: Any):
    with distributed.Client(cluster, set_as_default=False) as other_client:
        first, second = make_executor(), make_executor(other_client)
        env = jre.parse({"env_vars": {"MODE": "shared"}})
        a = first.submit(where, (), {}, runtime_env=env, name="where")
        b = second.submit(where, (), {}, runtime_env=env, name="where")
        assert a.result(60)[0] == b.result(60)[0] == "shared"
        assert a.result()[2] != b.result()[2]  # each executor its own workers
        second.shutdown()
        # The first executor goes on after the second has gone.
        assert first.submit(where, (), {}, runtime_env=env, name="where").result(60)[0] == (
            "shared"
        )


def _wait_for_pid(marker: Path, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert time.monotonic() < deadline, "the task never started"
        time.sleep(0.05)
    return int(marker.read_text())


def _gone(pid: int, timeout: float) -> bool:
    return not wait_gone([pid], timeout)


def write_results() -> str:
    with open("results.csv", "w") as f:
        f.write("x,y\n1,2\n")
    os.makedirs("out", exist_ok=True)
    with open("out/plot.txt", "w") as f:
        f.write("a plot")
    return os.getcwd()


def test_files_a_task_writes_come_back_by_content(
    make_executor: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    """Issue 20 item 7 on Dask: the node lists what the task wrote in its working dir; with
    files_out the files come back beside the notebook (blobs fetched from that node,
    sha256-checked) before the result is handed out."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "input.txt").write_text("in")
    notebook = tmp_path / "notebook"
    notebook.mkdir()
    monkeypatch.chdir(notebook)
    jre.init(executor=make_executor())
    env = {"working_dir": str(work)}

    listed = jre.remote(write_results).options(runtime_env=env).remote()
    node_cwd = listed.result(120)
    assert listed.files.created == ("out/plot.txt", "results.csv")
    assert listed.files.copied == ()
    assert not (notebook / "results.csv").exists()
    assert "wrote out/plot.txt, results.csv in its env's copy" in capsys.readouterr().out

    copied = (
        jre.remote(write_results)
        .options(runtime_env={**env, "env_vars": {"RUN": "2"}}, files_out=["*.csv", "out/"])
        .remote()
    )
    assert copied.result(120) != node_cwd  # another env: its own copy
    assert (notebook / "results.csv").read_text() == "x,y\n1,2\n"
    assert (notebook / "out" / "plot.txt").read_text() == "a plot"
    assert copied.files.copied == ("out/plot.txt", "results.csv")
    assert "copied 2 to" in capsys.readouterr().out


def helper_value() -> int:
    import dask_edit_helper  # type: ignore[import-not-found]

    return int(dask_edit_helper.VALUE)


def test_an_edit_to_the_working_dir_is_seen_by_the_next_call(
    make_executor: Any, tmp_path: Path
) -> None:
    """Issue 20 item 8 on Dask: each call looks at the local code again; an edited module
    ships (one file) and runs at the next call, an unchanged tree ships nothing."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "dask_edit_helper.py").write_text("VALUE = 1\n")
    executor = make_executor()
    jre.init(runtime_env={"working_dir": str(work)}, executor=executor)
    f = jre.remote(helper_value)
    assert f.remote().result(120) == 1
    sent = executor.bytes_sent
    assert f.remote().result(120) == 1
    assert executor.bytes_sent == sent  # unchanged: nothing staged again
    (work / "dask_edit_helper.py").write_text("VALUE = 22\n")
    assert f.remote().result(120) == 22
    assert executor.bytes_sent - sent == len("VALUE = 22\n")  # the one changed file
