"""A cached build answered before the spec is parsed (``agent/answers.py``), through the CLI
run as real subprocesses: what it answers, and every case where it must parse again."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

#: A build of an env answered from the cache's answers imports none of these.
NOT_FOR_AN_ANSWER = (
    "argparse",
    "typing",
    "json",
    "re",
    "pathlib",
    "dataclasses",
    "hashlib",
    "jupyter_runtimeenv.spec",
    "jupyter_runtimeenv.plugins",
    "jupyter_runtimeenv.context",
    "jupyter_runtimeenv.errors",
)

CODE = f"""
import sys
from jupyter_runtimeenv import cli
code = cli.main(sys.argv[1:])
loaded = [n for n in {NOT_FOR_AN_ANSWER!r} if n in sys.modules]
print("LOADED", loaded, file=sys.stderr)
sys.exit(code)
"""


def build(
    cache: Path, *args: str, cwd: Path, pythonpath: Path | None = None
) -> tuple[subprocess.CompletedProcess[str], bool]:
    """``build ARGS`` in a fresh interpreter; whether it was answered (none of the parse's
    modules imported)."""
    env = {**os.environ, "JUPYTER_RUNTIMEENV_CACHE": str(cache)}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", CODE, "build", *args],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done, "LOADED []" in done.stderr


def answers(cache: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(cache / "index.sqlite")) as db:
        return [env_id for (env_id,) in db.execute("SELECT env_id FROM answers")]


def without_seconds(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if '"seconds"' not in line)


def test_a_cached_build_is_answered_as_it_was_printed(tmp_path: Path, cache_dir: Path) -> None:
    spec = json.dumps({"env_vars": {"MODE": "fast"}, "config": {"setup_timeout_seconds": 60}})
    first, _ = build(cache_dir, spec, "--json", cwd=tmp_path)  # the agent builds it
    parsed, answered = build(cache_dir, spec, "--json", cwd=tmp_path)  # found in the index
    assert not answered
    assert answers(cache_dir) == [json.loads(first.stdout)["env_id"]]
    for args in (["--json"], ["-q", "--json"], ["--retry", "--json"]):
        again, answered = build(cache_dir, spec, *args, cwd=tmp_path)
        assert answered, again.stderr
        assert without_seconds(again.stdout) == without_seconds(parsed.stdout)
        assert json.loads(again.stdout)["seconds"] >= 0
    human, answered = build(cache_dir, spec, cwd=tmp_path)  # both forms are remembered
    assert answered
    env_id = json.loads(first.stdout)["env_id"]
    assert human.stdout.startswith(f"env_id:  {env_id}\nstate:   READY (")
    assert human.stdout.endswith(" s)\npython:  " + sys.executable + "\nenv:     MODE=fast\n")
    listed = subprocess.run(
        [sys.executable, "-m", "jupyter_runtimeenv", "--cache-dir", str(cache_dir), "list"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    # Another spelling of the same spec is the same env, parsed (and then answered too).
    other = json.dumps({"config": {"setup_timeout_seconds": 60}, "env_vars": {"MODE": "fast"}})
    done, answered = build(cache_dir, other, "--json", cwd=tmp_path)
    assert not answered
    assert json.loads(done.stdout)["env_id"] == json.loads(first.stdout)["env_id"]


def test_an_answer_goes_with_its_env(tmp_path: Path, cache_dir: Path) -> None:
    spec = json.dumps({"env_vars": {"GONE": "soon"}})
    first, _ = build(cache_dir, spec, "--json", cwd=tmp_path)
    build(cache_dir, spec, "--json", cwd=tmp_path)
    env_id = json.loads(first.stdout)["env_id"]
    assert answers(cache_dir) == [env_id]
    removed = subprocess.run(
        [sys.executable, "-m", "jupyter_runtimeenv", "rm", env_id],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "JUPYTER_RUNTIMEENV_CACHE": str(cache_dir)},
    )  # fmt: skip
    assert removed.returncode == 0, removed.stderr
    assert answers(cache_dir) == []
    again, answered = build(cache_dir, spec, "--json", cwd=tmp_path)
    assert not answered  # built again by the agent
    assert json.loads(again.stdout)["env_id"] == env_id


def test_an_install_or_another_directory_is_parsed_again(tmp_path: Path, cache_dir: Path) -> None:
    """The answer holds while what the parse read stands: the directories of ``sys.path``
    (an install changes them) and the working directory (relative paths in options)."""
    site = tmp_path / "site"
    site.mkdir()
    spec = json.dumps({"env_vars": {"WHERE": "here"}})
    for _ in range(2):
        build(cache_dir, spec, "--json", cwd=tmp_path, pythonpath=site)
    assert build(cache_dir, spec, "--json", cwd=tmp_path, pythonpath=site)[1]
    (site / "newly_installed.py").write_text("")  # the directory changes, as by an install
    assert not build(cache_dir, spec, "--json", cwd=tmp_path, pythonpath=site)[1]
    assert build(cache_dir, spec, "--json", cwd=tmp_path, pythonpath=site)[1]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert not build(cache_dir, spec, "--json", cwd=elsewhere, pythonpath=site)[1]


def test_a_spec_that_reads_files_is_never_answered(tmp_path: Path, cache_dir: Path) -> None:
    """A requirements file (or a tree) may change under the same spec: always parsed."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "m.py").write_text("X = 1\n")
    spec_file = tmp_path / "env.json"
    spec_file.write_text(json.dumps({"working_dir": "code", "env_vars": {"A": "1"}}))
    for _ in range(3):
        assert not build(cache_dir, str(spec_file), "--json", cwd=tmp_path)[1]
    assert answers(cache_dir) == []
    # A spec file with closed fields only is answered, and parsed again once it changes.
    spec_file.write_text(json.dumps({"env_vars": {"A": "1"}}))
    for _ in range(2):
        first, _ = build(cache_dir, "env.json", "--json", cwd=tmp_path)
    assert build(cache_dir, str(spec_file), "--json", cwd=tmp_path.parent)[1]
    spec_file.write_text(json.dumps({"env_vars": {"A": "2"}}))
    changed, answered = build(cache_dir, "env.json", "--json", cwd=tmp_path)
    assert not answered
    assert json.loads(changed.stdout)["env_id"] != json.loads(first.stdout)["env_id"]
