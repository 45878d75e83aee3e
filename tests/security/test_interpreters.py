"""``driver_python`` and ``py_executable`` sent to the server must be Python interpreters.

Threat: the agent runs ``driver_python`` (it asks it for its version and site-packages), so a
request naming ``/bin/sh``, or a script called ``python3``, would run an arbitrary program in
the server. The check (``spec.policy.interpreter_problem``) never runs the file: it resolves
symlinks, wants interpreter names, a native binary (no ``#!`` script) and a Python
installation around it. The embedded agent (the user's own process) is not restricted.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import venv
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from jupyter_runtimeenv.errors import SpecError
from jupyter_runtimeenv.spec import SpecPolicy, parse
from jupyter_runtimeenv.spec.policy import interpreter_problem
from tests.security.conftest import Raw

SH = shutil.which("sh") or "/bin/sh"
STDLIB = f"python{sys.version_info[0]}.{sys.version_info[1]}"


def executable(path: Path, text: str | bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, str):
        path.write_text(text)
    else:
        path.write_bytes(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def fake_installation(root: Path) -> Path:
    """``root/bin`` next to a ``lib/pythonX.Y/os.py``: the layout, without an interpreter."""
    (root / "lib" / STDLIB).mkdir(parents=True)
    (root / "lib" / STDLIB / "os.py").write_text("")
    (root / "bin").mkdir()
    return root / "bin"


@pytest.fixture
def hostile(tmp_path: Path) -> dict[str, str]:
    """Executables that are not Python interpreters, each in the most convincing disguise."""
    marker = tmp_path / "ran"
    bindir = fake_installation(tmp_path / "fake")
    link = bindir / "python3"
    link.symlink_to(SH)
    copy = tmp_path / "bare" / "bin" / "python3"
    copy.parent.mkdir(parents=True)
    shutil.copy(os.path.realpath(SH), copy)
    return {
        "sh": SH,
        "a symlink named python3 to sh": str(link),
        "a copy of sh named python3, no installation": str(copy),
        "a script named python3": executable(
            fake_installation(tmp_path / "script") / "python3", f"#!/bin/sh\ntouch {marker}\n"
        ),
        "an ELF header named python3, not executable": str(tmp_path / "noexec" / "python3"),
        "a directory named python3": str(tmp_path / "dir" / "python3"),
    }


@pytest.fixture
def real_venvs(tmp_path: Path) -> dict[str, str]:
    made = {}
    for kind, symlinks in (("symlinks", True), ("copies", False)):
        where = tmp_path / f"venv-{kind}"
        venv.create(where, symlinks=symlinks, with_pip=False)
        made[kind] = str(where / "bin" / "python")
    return made


def test_interpreters_pass_without_being_run(real_venvs: dict[str, str]) -> None:
    for path in [sys.executable, os.path.realpath(sys.executable), *real_venvs.values()]:
        assert interpreter_problem(path) is None, path


def test_other_programs_do_not(hostile: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "noexec").mkdir()
    (tmp_path / "noexec" / "python3").write_bytes(b"\x7fELF" + b"\0" * 60)
    (tmp_path / "dir" / "python3").mkdir(parents=True)
    for what, path in hostile.items():
        assert interpreter_problem(path) is not None, what
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("field", ["driver_python", "py_executable"])
async def test_the_server_refuses_programs_that_are_not_interpreters(
    raw: Raw,
    alive: Callable[[], Awaitable[None]],
    hostile: dict[str, str],
    tmp_path: Path,
    field: str,
) -> None:
    command_line = ("a command line", f"{sys.executable} -c pass")
    for what, path in [*hostile.items(), ("sh by name", "sh"), command_line]:
        if field == "driver_python" and os.sep not in path:
            continue  # driver_python is a path; a bare name is looked up like one
        code, error = await raw("POST", "envs?wait=1", body={field: path})
        assert code == 400, (what, error)
        assert error["field"] == field, (what, error)
    assert not (tmp_path / "ran").exists()
    await alive()


async def test_the_server_takes_a_real_interpreter(raw: Raw, real_venvs: dict[str, str]) -> None:
    for python in [sys.executable, real_venvs["symlinks"], real_venvs["copies"]]:
        code, env = await raw("POST", "envs?wait=1", body={"driver_python": python})
        assert code == 201, env
        assert env["state"] == "READY", env
        assert env["context"]["python"] == python
    code, env = await raw("POST", "envs?wait=1", body={"py_executable": sys.executable})
    assert code == 201, env


def test_the_users_own_process_may_name_any_executable(hostile: dict[str, str]) -> None:
    spec = parse({"py_executable": hostile["a script named python3"]})
    assert spec.get("py_executable") == hostile["a script named python3"]
    with pytest.raises(SpecError) as info:
        parse({"py_executable": hostile["a script named python3"]}, policy=SpecPolicy.untrusted())
    assert info.value.field == "py_executable"
    assert "not a native executable" in info.value.reason
