"""Named environments (``%runtime_env --name``, ``%%runtime_env``, ``--list``), the registry
that reports them (``workers.envs.declared_envs``), ``%driver_sys_path`` and ``--help``, in
IPython's real shell with a real embedded agent and real workers."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell
from wheelhouse import offline_installers

from jupyter_runtimeenv import api, session
from jupyter_runtimeenv.workers import envs
from jupyter_runtimeenv.workers.executor import resolve_for_driver


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.out + captured.err
    return lines[0]


def test_a_named_env_is_used_by_remote_options_and_remote_cells(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_cell("%runtime_env --env-var WHO=default --no-eager-install")
    shell.run_cell("%runtime_env --name blue --env-var WHO=blue")
    out = capsys.readouterr().out
    assert " ready: python " in out  # built eagerly, like the default
    shell.run_cell("%runtime_env --name blue --env-var EXTRA=1 --no-eager-install")  # merged
    assert session.lookup("blue").env_vars == {"WHO": "blue", "EXTRA": "1"}
    assert "EXTRA" not in (api.default_runtime_env() or {}).env_vars  # type: ignore[union-attr]

    shell.run_cell(
        "import os\n"
        "@remote\n"
        "def who():\n"
        "    return os.environ['WHO']\n"
        "@remote(runtime_env='blue')\n"
        "def who_blue():\n"
        "    return os.environ['WHO'], os.environ.get('EXTRA')\n"
        "got = get([who.remote(), who.options(runtime_env='blue').remote(), who_blue.remote(),"
        " who_blue.options(runtime_env={'env_vars': {'WHO': 'dict'}}).remote()], timeout=60)"
    )
    assert shell.user_ns["got"] == ["default", "blue", ("blue", "1"), ("dict", "1")]

    # A redeclared env takes effect at the next call of a function already decorated.
    shell.run_cell("%runtime_env --name blue --env-var WHO=navy --no-eager-install")
    shell.run_cell("again = get(who_blue.remote(), timeout=60)")
    assert shell.user_ns["again"] == ("navy", "1")


def test_the_cell_form_is_the_env_and_bad_bodies_change_nothing(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    shell.run_cell("%%runtime_env --name green --no-eager-install\nenv_vars:\n  A: '1'\n  B: '2'")
    assert session.lookup("green").env_vars == {"A": "1", "B": "2"}
    # Re-running an edited cell gives exactly the body (B is gone), flags merged over it.
    shell.run_cell(
        '%%runtime_env --name green --env-var C=3 --no-eager-install\n{"env_vars": {"A": "one"}}'
    )
    assert session.lookup("green").env_vars == {"A": "one", "C": "3"}
    before = session.lookup("green")
    capsys.readouterr()

    for body, message in [
        ("env_vars:\n  A: 1", "UsageError: runtime_env: invalid spec: env_vars.A: expected"),
        ("env_vars: [", "UsageError: runtime_env: invalid spec: the cell body is not YAML"),
        ("- a list", "the cell body must be a mapping of fields, got list"),
        ("no_such_field: 1", "no_such_field"),
    ]:
        shell.run_cell(f"%%runtime_env --name green\n{body}")
        line = one_error_line(capsys)
        assert message in line, line
        assert session.lookup("green") == before  # unchanged

    shell.run_cell("%runtime_env --name 'bad name' --env-var A=1")
    assert "is not a valid env name" in one_error_line(capsys)


def test_list_and_the_registry_report_ids_and_states(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_cell("%runtime_env --list")
    assert "no runtime envs declared" in capsys.readouterr().out

    shell.run_cell("%runtime_env --env-var WHO=default")
    shell.run_cell("%runtime_env --name later --env-var WHO=later --no-eager-install")
    capsys.readouterr()
    shell.run_cell("%runtime_env --list")
    rows = [line.split() for line in capsys.readouterr().out.strip().splitlines()]
    declared = envs.declared_envs()
    json.dumps(declared)  # JSON-compatible
    assert [d["name"] for d in declared] == [None, "later"]
    default_id = resolve_for_driver(api.default_runtime_env()).env_id  # type: ignore[arg-type]
    assert declared[0]["env_id"] == default_id
    assert declared[1]["spec"]["env_vars"] == {"WHO": "later"}
    assert rows == [
        ["NAME", "ENV", "ID", "STATE"],
        ["(default)", default_id[:12], "READY"],
        ["later", declared[1]["env_id"][:12], "not", "built"],
    ]

    shell.run_cell("%runtime_env --name later")  # shows it
    assert "# runtime env 'later'" in capsys.readouterr().out
    shell.run_cell("%runtime_env --name later --clear")
    assert [d["name"] for d in envs.declared_envs()] == [None]
    shell.run_cell("%runtime_env --name later")
    assert "no environment named 'later'" in one_error_line(capsys)


def test_help_prints_the_usage(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    result = shell.run_cell("%runtime_env --help")
    assert result.success
    out = capsys.readouterr().out
    assert "%runtime_env [--name NAME]" in out
    assert "--background" in out
    shell.run_cell("%driver_sys_path -h")
    assert "--remove PATH" in capsys.readouterr().out


def test_driver_sys_path_shows_adds_removes_and_turns_off(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "nb_helper_mod.py").write_text("WHERE = 'added'\n")
    saved = list(sys.path)
    try:
        shell.run_cell(f"%driver_sys_path --add {code}")
        out = capsys.readouterr().out
        assert out.startswith("driver_sys_path: the kernel's sys.path, ")
        assert f"  1. {code}\n" in out  # first, in order
        shell.run_cell(
            "@remote\ndef where():\n    import nb_helper_mod\n    return nb_helper_mod.WHERE\n"
            "found = get(where.remote(), timeout=60)"
        )
        assert shell.user_ns["found"] == "added"

        shell.run_cell(f"%driver_sys_path --remove {code}")
        assert str(code) not in capsys.readouterr().out
        assert str(code) not in sys.path

        shell.run_cell("%driver_sys_path --off")
        assert "off" in capsys.readouterr().out
        assert api.default_runtime_env().driver_sys_path is False  # type: ignore[union-attr]
        shell.run_cell(f"%driver_sys_path --add {code}")  # off + add: a list of its own
        out = capsys.readouterr().out
        assert out.startswith("driver_sys_path: a list of 1 entries")
        assert api.default_runtime_env().driver_sys_path == [str(code)]  # type: ignore[union-attr]
        shell.run_cell("%driver_sys_path --on")
        assert api.default_runtime_env().driver_sys_path is True  # type: ignore[union-attr]

        shell.run_cell(f"%driver_sys_path --remove {tmp_path / 'never'}")
        assert "is not on the kernel's sys.path" in one_error_line(capsys)
    finally:
        sys.path[:] = saved


def test_background_returns_at_once_and_the_first_task_waits(
    shell: InteractiveShell,
    capsys: pytest.CaptureFixture[str],
    wheelhouse: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    offline_installers(monkeypatch, wheelhouse)
    shell.run_cell(
        f"%runtime_env --background --pip alpha==1.0 --no-index --find-links {wheelhouse}"
    )
    out = capsys.readouterr().out
    assert "in the background; the first task in it waits for it" in out
    assert " ready: python " not in out  # the cell did not wait for the build
    assert api.default_runtime_env() is not None  # set at once
    shell.run_cell(
        "@remote\ndef version():\n    import alpha\n    return alpha.__version__\n"
        "v = get(version.remote(), timeout=120)"
    )
    assert shell.user_ns["v"] == "1.0"
    # The background build ends by taking the magic's reference on the env.
    magics = shell.magics_manager.registry["RuntimeEnvMagics"]
    built = resolve_for_driver(api.default_runtime_env()).env_id  # type: ignore[arg-type]
    deadline = time.monotonic() + 30
    while magics._held.get(None, ("",))[0] != built:
        assert time.monotonic() < deadline, magics._held
        time.sleep(0.05)
