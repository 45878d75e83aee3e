"""``jupyter runtimeenv`` / ``python -m jupyter_runtimeenv``, run as real subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest


def run(
    cache: Path, *args: str, cwd: Path | None = None, jupyter: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JUPYTER_RUNTIMEENV_CACHE": str(cache)}
    if jupyter:
        argv = [str(Path(sys.executable).with_name("jupyter")), "runtimeenv", *args]
    else:
        argv = [sys.executable, "-m", "jupyter_runtimeenv", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "helper.py").write_text("VALUE = 42\n")
    (tmp_path / "env.yaml").write_text(
        "working_dir: code\nenv_vars:\n  MODE: fast\ndriver_sys_path: false\n"
    )
    return tmp_path


def test_build_json(project: Path, cache_dir: Path) -> None:
    result = run(cache_dir, "build", str(project / "env.yaml"), "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["state"] == "READY"
    assert len(out["env_id"]) == 64
    ctx = out["context"]
    # The env's own tree is named to its processes, which copy its shared files before
    # writing to them (workers/_cow.py).
    assert ctx["env_vars"] == {"MODE": "fast", "JUPYTER_RUNTIMEENV_TREES": ctx["cwd"]}
    assert Path(ctx["cwd"], "helper.py").read_text() == "VALUE = 42\n"
    assert ctx["cwd"].startswith(str(cache_dir))


def test_build_human_then_list_logs_rm_gc(project: Path, cache_dir: Path) -> None:
    built = run(cache_dir, "build", "env.yaml", cwd=project)
    assert built.returncode == 0, built.stderr
    assert "state:   READY" in built.stdout
    assert "env:     MODE=fast" in built.stdout
    assert "step working_dir" in built.stderr  # live progress goes to stderr
    env_id = built.stdout.split()[1]

    listed = run(cache_dir, "list")
    assert f"{env_id[:12]}  READY" in listed.stdout
    assert "working_dir" in listed.stdout
    listed_json = json.loads(run(cache_dir, "list", "--json").stdout)
    assert [e["env_id"] for e in listed_json] == [env_id]

    logs = run(cache_dir, "logs", env_id[:8])
    assert logs.returncode == 0, logs.stderr
    assert "[working_dir]" in logs.stdout

    removed = run(cache_dir, "rm", env_id[:10])
    assert removed.returncode == 0, removed.stderr
    assert "1 resource(s)" in removed.stdout
    assert "no environments" in run(cache_dir, "list").stdout

    rebuilt = run(cache_dir, "build", "env.yaml", cwd=project)
    assert rebuilt.returncode == 0
    gc = run(cache_dir, "gc", "--max-bytes", "0")
    assert gc.returncode == 0, gc.stderr
    assert "1 evicted; cache now 0 B" in gc.stdout


def test_jupyter_subcommand(project: Path, cache_dir: Path) -> None:
    result = run(cache_dir, "build", str(project / "env.yaml"), "--json", jupyter=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["state"] == "READY"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ('{"env_vars": {"A": 1}}', "error: invalid spec: env_vars.A: expected a string, got int"),
        ('{"env_var": {}}', "error: invalid spec: env_var: unknown field"),
        ('{"pip": ["ok"], "conda": "base"}', "cannot be combined with 'conda'"),
        ("{not json", "inline spec is not valid JSON"),
        ("missing.yaml", "no spec file 'missing.yaml'"),
    ],
)
def test_bad_input_is_one_line_without_traceback(
    cache_dir: Path, spec: str, message: str, tmp_path: Path
) -> None:
    result = run(cache_dir, "build", spec, cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_failed_build_exits_one_with_the_step(tmp_path: Path, cache_dir: Path) -> None:
    spec = json.dumps({"working_dir": "https://127.0.0.1:9/nothing.zip"})
    result = run(cache_dir, "build", spec, "--quiet", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("error: build failed: working_dir")
    assert "Traceback" not in result.stderr


def test_unknown_env_id(cache_dir: Path) -> None:
    result = run(cache_dir, "logs", "deadbeef")
    assert result.returncode == 1
    assert result.stderr.strip() == "error: no environment 'deadbeef'"


@pytest.mark.parametrize("existing", [False, True], ids=["new-cache", "existing-cache"])
@pytest.mark.parametrize("command", ["list", "build"])
def test_a_full_disk_at_start_is_one_line_naming_the_cache(
    tmp_path: Path, project: Path, existing: bool, command: str
) -> None:
    """A real full file system (a filled tmpfs) when we may mount, else a read-only
    directory; the test id does not change, the assertion on the cause does."""
    from fulldisk import full_disk

    def prepare(disk: Path) -> None:
        if existing:  # a cache made while there was room
            assert run(disk / "cache", "list").returncode == 0

    with full_disk(tmp_path, prepare) as (disk, kind):
        args = ["build", str(project / "env.yaml")] if command == "build" else ["list"]
        result = run(disk / "cache", *args)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith(f"error: cannot use the cache at {disk / 'cache'}: ")
    if kind == "tmpfs":
        assert "no space left on the device" in lines[0] or "No space left" in lines[0]
    else:
        assert "ermission denied" in lines[0] or "not writable" in lines[0] or "read" in lines[0]


def _agent_ran(cache: Path, *args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], bool]:
    """``build`` in a fresh interpreter; whether it started an agent (a cached env is
    answered from the index without one: ``agent/cache_hit.py``)."""
    code = (
        "import sys\n"
        "from jupyter_runtimeenv import cli\n"
        "code = cli.main(sys.argv[1:])\n"
        "print('AGENT', 'jupyter_runtimeenv.agent.agent' in sys.modules, file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    env = {**os.environ, "JUPYTER_RUNTIMEENV_CACHE": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", code, "build", *args],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=120,
    )  # fmt: skip
    return done, "AGENT True" in done.stderr


def _last_used(cache: Path, env_id: str) -> float:
    with contextlib.closing(sqlite3.connect(cache / "index.sqlite")) as db:
        (value,) = db.execute("SELECT last_used FROM envs WHERE env_id = ?", (env_id,)).fetchone()
    return float(value)


def test_a_cached_build_is_answered_from_the_index(project: Path, cache_dir: Path) -> None:
    first, agent = _agent_ran(cache_dir, "env.yaml", "--json", cwd=project)
    assert first.returncode == 0, first.stderr
    assert agent
    built = json.loads(first.stdout)
    used = _last_used(cache_dir, built["env_id"])
    # The same file by its relative path and from elsewhere by its absolute one: its
    # relative working_dir is the file's, so both are the same env, found in the index.
    for args, cwd in ((["env.yaml"], project), ([str(project / "env.yaml")], project.parent)):
        again, agent = _agent_ran(cache_dir, *args, "--json", cwd=cwd)
        assert again.returncode == 0, again.stderr
        assert not agent
        found = json.loads(again.stdout)
        assert {k: found[k] for k in ("env_id", "state", "context", "spec")} == {
            k: built[k] for k in ("env_id", "state", "context", "spec")
        }
    assert _last_used(cache_dir, built["env_id"]) > used  # a use, for LRU eviction
    human, agent = _agent_ran(cache_dir, "env.yaml", cwd=project)
    assert human.returncode == 0, human.stderr
    assert not agent
    assert human.stdout.startswith(f"env_id:  {built['env_id']}\nstate:   READY (")
    assert "env:     MODE=fast" in human.stdout
    assert not (cache_dir / "tmp").exists() or not list((cache_dir / "tmp").iterdir())


def test_a_cached_build_whose_tree_is_gone_builds_it_again(project: Path, cache_dir: Path) -> None:
    first, _ = _agent_ran(cache_dir, "env.yaml", "--json", cwd=project)
    assert first.returncode == 0, first.stderr
    cwd = Path(json.loads(first.stdout)["context"]["cwd"])
    with contextlib.closing(sqlite3.connect(cache_dir / "index.sqlite")) as db:
        paths = [Path(p) for (p,) in db.execute("SELECT path FROM resources")]
    tree = next(p for p in paths if cwd == p or p in cwd.parents)
    shutil.rmtree(tree)  # removed by hand: the index still records it
    again, agent = _agent_ran(cache_dir, "env.yaml", "--json", cwd=project)
    assert again.returncode == 0, again.stderr
    assert agent
    assert Path(json.loads(again.stdout)["context"]["cwd"], "helper.py").read_text() == (
        "VALUE = 42\n"
    )


def test_a_cache_others_may_read_is_left_to_the_agent(project: Path, cache_dir: Path) -> None:
    """The index holds env_vars' values: a root others may read is not read from as it is,
    the agent's start makes it owner-only (with a warning) and answers."""
    first, _ = _agent_ran(cache_dir, "env.yaml", "--json", cwd=project)
    assert first.returncode == 0, first.stderr
    cache_dir.chmod(0o755)
    again, agent = _agent_ran(cache_dir, "env.yaml", "--json", cwd=project)
    assert again.returncode == 0, again.stderr
    assert agent
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700
    assert json.loads(again.stdout)["env_id"] == json.loads(first.stdout)["env_id"]


def test_a_cached_build_as_a_program_prints_everything(tmp_path: Path, cache_dir: Path) -> None:
    """``python -m jupyter_runtimeenv build`` of a cached env with no tree (so no thread):
    the program ends without the interpreter's finalisation once its output is flushed
    (``cli._exit_at_once``); the output is whole, the exit code 0, the index usable."""
    values = {f"V{i}": "x" * 200 for i in range(200)}  # ~50 KB of JSON: more than a buffer
    spec = json.dumps({"env_vars": values})
    first = run(cache_dir, "build", spec, "--json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    for _ in range(2):
        again = run(cache_dir, "build", spec, "--json", cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert again.stderr == ""
        out = json.loads(again.stdout)
        assert out["context"]["env_vars"] == json.loads(first.stdout)["context"]["env_vars"]
        assert out["env_id"] == json.loads(first.stdout)["env_id"]
    listed = run(cache_dir, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [e["env_id"] for e in json.loads(listed.stdout)] == [out["env_id"]]


GATE = '''
import os, time
from jupyter_runtimeenv.plugins import RuntimeEnvPlugin

class Gate(RuntimeEnvPlugin):
    """Builds once the file named by its value exists (up to 60 s)."""
    name = "gate"

    def uris(self, value, spec):
        return ["gate://" + value]

    async def create(self, uri, value, build):
        import asyncio
        for _ in range(600):
            if os.path.exists(value):
                return 1
            await asyncio.sleep(0.1)
        raise RuntimeError("the gate never opened")
'''


def _holders(cache: Path) -> set[str]:
    if not (cache / "index.sqlite").exists():
        return set()
    with contextlib.closing(sqlite3.connect(f"file:{cache}/index.sqlite?mode=ro", uri=True)) as db:
        try:
            return {holder for (holder,) in db.execute("SELECT holder FROM refs")}
        except sqlite3.OperationalError:  # the first agent is still making the index
            return set()


def test_two_builds_of_one_env_at_once_each_hold_it(tmp_path: Path, cache_dir: Path) -> None:
    """Each ``build`` holds the env under its own name (``cli:<pid>``): with one name for
    every CLI process they shared one reference (references are kept by env and holder), so
    the first build to end dropped the hold of the other, still running."""
    (tmp_path / "gate_plugin.py").write_text(GATE)
    gate = tmp_path / "open"
    spec = json.dumps({"plugins": {"gate_plugin.Gate": str(gate)}})
    env = {
        **os.environ,
        "JUPYTER_RUNTIMEENV_CACHE": str(cache_dir),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    argv = [sys.executable, "-m", "jupyter_runtimeenv", "build", spec, "--json", "--quiet"]
    procs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(2):
            procs.append(
                subprocess.Popen(
                    argv,
                    env=env,
                    cwd=tmp_path,
                    text=True,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
            )
        wanted = {f"cli:{p.pid}" for p in procs}
        deadline = time.monotonic() + 60
        while _holders(cache_dir) != wanted:  # both builds wait at the gate, each holding
            assert time.monotonic() < deadline, (_holders(cache_dir), wanted)
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.05)
        gate.write_text("open")
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    assert len({json.loads(out)["env_id"] for out, _ in outs}) == 1
    assert _holders(cache_dir) == set()  # each released its own hold


AT_EXIT = '''
import atexit, os
from jupyter_runtimeenv.plugins import RuntimeEnvPlugin

class AtExit(RuntimeEnvPlugin):
    """Registers an atexit handler that writes the file named by its value."""
    name = "at_exit"

    def uris(self, value, spec):
        return ["at-exit://" + value]

    def create(self, uri, value, build):
        def write():
            with open(value, "w") as f:
                f.write("ran")
        atexit.register(write)
        return 1
'''


def test_a_build_by_the_agent_as_a_program_ends_with_its_atexit_handlers(
    tmp_path: Path, cache_dir: Path
) -> None:
    """``python -m jupyter_runtimeenv build`` of a new env ends without the interpreter's
    finalisation once the agent has stopped (``cli._exit_at_once``), as a cached build
    does: its ``atexit`` handlers still run (here one a plugin registered), its output is
    whole, and the env is then answered from the index."""
    (tmp_path / "at_exit_plugin.py").write_text(AT_EXIT)
    mark = tmp_path / "handler-ran"
    values = {f"V{i}": "x" * 200 for i in range(200)}  # ~50 KB of JSON: more than a buffer
    spec = json.dumps({"plugins": {"at_exit_plugin.AtExit": str(mark)}, "env_vars": values})
    env = {
        **os.environ,
        "JUPYTER_RUNTIMEENV_CACHE": str(cache_dir),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    argv = [sys.executable, "-m", "jupyter_runtimeenv", "build", spec, "--json", "--quiet"]
    built = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    assert mark.read_text() == "ran"
    out = json.loads(built.stdout)
    assert out["context"]["env_vars"] == values
    mark.unlink()
    again = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["env_id"] == out["env_id"]
    assert not mark.exists()  # answered from the index: the plugin did not build again
