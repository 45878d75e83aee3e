"""Issue 20 item 7: the files a task writes in its working directory are listed after it
(one line), and ``files_out`` copies them beside the notebook before its result is returned.
Real workers and a real agent; the "notebook" is the test's working directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.plugins import _watch
from jupyter_runtimeenv.workers import files
from jupyter_runtimeenv.workers.executor import LocalExecutor


def write_results() -> str:
    with open("results.csv", "w") as f:
        f.write("x,y\n1,2\n")
    os.makedirs("out", exist_ok=True)
    with open("out/plot.txt", "w") as f:
        f.write("a plot")
    with open("data.csv", "a") as f:  # an existing file of the working_dir, changed
        f.write("3,4\n")
    os.makedirs("__pycache__", exist_ok=True)
    with open("__pycache__/noise.pyc", "w") as f:
        f.write("not reported")
    return os.getcwd()


def nothing() -> int:
    return 1


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    src = tmp_path / "project"
    src.mkdir()
    (src / "data.csv").write_text("x,y\n")
    notebook = tmp_path / "notebook"
    notebook.mkdir()
    monkeypatch.chdir(notebook)
    return src


def test_written_files_are_listed_and_stay_in_the_env(
    agent_executor: LocalExecutor, project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = jre.remote(write_results).options(runtime_env={"working_dir": str(project)})
    future = f.remote()
    cwd = future.result(120)
    written = future.files
    assert written.created == ("out/plot.txt", "results.csv")
    assert written.changed == ("data.csv",)
    assert written.copied == ()
    assert Path(cwd, "results.csv").read_text() == "x,y\n1,2\n"
    assert not Path("results.csv").exists()  # nothing beside the notebook
    assert (project / "data.csv").read_text() == "x,y\n"  # the user's file is untouched
    out = capsys.readouterr().out
    assert "(write_results) wrote data.csv, out/plot.txt, results.csv in its env's copy" in out
    assert "files_out" in out
    assert "noise.pyc" not in out

    again = jre.remote(nothing).options(runtime_env={"working_dir": str(project)}).remote()
    assert again.result(120) == 1
    assert not again.files  # nothing new since the last task
    assert "(nothing) wrote" not in capsys.readouterr().out


def test_files_out_copies_them_back_before_the_result(
    agent_executor: LocalExecutor, project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = jre.remote(write_results).options(
        runtime_env={"working_dir": str(project), "env_vars": {"RUN": "2"}},
        files_out=["*.csv", "out/"],
    )
    future = f.remote()
    future.result(120)
    # Already there when result() returned.
    assert Path("results.csv").read_text() == "x,y\n1,2\n"
    assert Path("out/plot.txt").read_text() == "a plot"
    assert Path("data.csv").read_text() == "x,y\n3,4\n"
    assert future.files.copied == ("data.csv", "out/plot.txt", "results.csv")
    assert "copied 3 to" in capsys.readouterr().out


def test_a_task_without_a_working_dir_reports_nothing(agent_executor: LocalExecutor) -> None:
    future = jre.remote(nothing).options(runtime_env={"env_vars": {"A": "1"}}).remote()
    assert future.result(120) == 1
    assert future.files is None


def test_bad_files_out_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="files_out"):
        jre.remote(nothing).options(files_out=[""])
    with pytest.raises(ValueError, match="files_out"):
        jre.remote(nothing).options(files_out=[3])  # type: ignore[list-item]


@pytest.mark.parametrize("events", [True, False], ids=["inotify", "walk"])
def test_tree_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events: bool) -> None:
    if not events:
        monkeypatch.setattr(_watch, "watch", lambda *_a, **_k: None)
    elif _watch.watch(str(tmp_path)) is None:
        pytest.skip("no inotify here")
    root = tmp_path / "tree"
    (root / "d").mkdir(parents=True)
    blob = tmp_path / "blob"
    blob.write_text("shared")
    os.link(blob, root / "d" / "linked.txt")  # as the store links them
    (root / "keep.txt").write_text("k")
    (root / "gone.txt").write_text("g")
    changes = files.TreeChanges(str(root))
    assert not changes.take()

    (root / "new.txt").write_text("n")
    (root / "gone.txt").unlink()
    # What the guard does before a write: a private copy renamed over the link.
    tmp = root / "d" / "linked.txt.jre-cow-1-2"
    tmp.write_text("shared")
    os.replace(tmp, root / "d" / "linked.txt")
    (root / "d" / "linked.txt").write_text("written")
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "sub" / "deep" / "x.bin").write_bytes(b"x")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "m.pyc").write_bytes(b"")
    got = changes.take()
    assert got.created == ("new.txt", "sub/deep/x.bin")
    assert got.changed == ("d/linked.txt",)
    assert got.deleted == ("gone.txt",)
    assert not changes.take()
    changes.close()


def test_tree_changes_after_the_kernel_dropped_events(tmp_path: Path) -> None:
    """Past inotify's queue (a task writing thousands of files) the events stop: what changed
    is then told from names and times, and nothing is missed."""
    root = tmp_path / "tree"
    root.mkdir()
    (root / "old.txt").write_text("o")
    (root / "untouched.txt").write_text("u")
    changes = files.TreeChanges(str(root))
    if changes._watch is None:
        pytest.skip("no inotify here")
    watcher = _watch._watcher()
    assert watcher is not None
    (root / "old.txt").write_text("rewritten")
    (root / "new.txt").write_text("n")
    watcher._dispatch(_watch._EVENT.pack(-1, _watch._IN_Q_OVERFLOW, 0, 0))
    got = changes.take()
    assert got.created == ("new.txt",)
    assert "old.txt" in got.changed
    changes.close()


def test_matching_is_gitignore_style() -> None:
    rels = ["a.csv", "deep/b.csv", "out/x/y.png", "top.txt", "sub/top.txt"]
    assert files.matching(rels, ["*.csv"]) == ["a.csv", "deep/b.csv"]
    assert files.matching(rels, ["out/"]) == ["out/x/y.png"]
    assert files.matching(rels, ["/top.txt"]) == ["top.txt"]
