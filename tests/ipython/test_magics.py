"""``%runtime_env`` in a real IPython shell, with a real embedded agent on a fresh cache.

The shell is IPython's ``InteractiveShell`` singleton (no kernel needed: the magic prints to
``sys.stdout`` and IPython reports a ``UsageError`` on ``sys.stderr``); the quickstart test
runs the magic in a real kernel. Eager builds install from the tests' wheelhouse, offline.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from wheelhouse import offline_installers

from jupyter_runtimeenv import api
from jupyter_runtimeenv.client import EmbeddedClient


def magic(shell: InteractiveShell, line: str) -> None:
    shell.run_line_magic("runtime_env", line)


def test_load_ext_puts_the_remote_api_in_the_user_namespace(shell: InteractiveShell) -> None:
    for name in ("remote", "get", "wait"):
        assert shell.user_ns[name] is getattr(api, name)


def test_set_merge_show_and_clear(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    magic(shell, "--env-var A=1 --env-var MODE=slow --no-eager-install")
    magic(shell, "--env-var MODE=fast --installer pip --no-eager-install")
    spec = api.default_runtime_env()
    assert spec is not None
    assert spec.env_vars == {"A": "1", "MODE": "fast"}  # merged per variable
    assert spec.config.installer == "pip"
    assert not spec.config.eager_install
    capsys.readouterr()

    magic(shell, "")
    shown = capsys.readouterr().out
    assert "# default runtime env" in shown
    assert "MODE: fast" in shown
    assert "installer: pip" in shown

    magic(shell, "--clear")
    assert api.default_runtime_env() is None
    magic(shell, "")
    assert "no default runtime env" in capsys.readouterr().out


def test_file_then_flags(
    shell: InteractiveShell, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "code").mkdir()
    spec_file = tmp_path / "env.yaml"
    spec_file.write_text(
        textwrap.dedent(
            """\
            working_dir: code
            env_vars: {A: from-file, B: from-file}
            """
        )
    )
    magic(shell, f"--file {spec_file} --env-var B=flag --no-eager-install")
    spec = api.default_runtime_env()
    assert spec is not None
    assert spec.get("working_dir") == str(tmp_path / "code")  # relative to the file
    assert spec.env_vars == {"A": "from-file", "B": "flag"}


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("--env-var NOVALUE", "env_vars"),
        ("--py-module /no/such/module.py", "py_modules.0"),
        ("--pip 'not a requirement!!'", "pip.packages.0"),
        # A lock pins pip/uv packages: none here, or no such file, or not a lock.
        ("--lock pylock.toml", "--lock"),
        ("--pip alpha --lock /no/such/pylock.toml", "--lock"),
        (f"--pip alpha --lock {__file__}", "--lock"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], line: str, field: str
) -> None:
    magic(shell, "--env-var KEEP=1 --no-eager-install")
    before = api.default_runtime_env()
    capsys.readouterr()

    result = shell.run_cell(f"%runtime_env {line}")

    assert not result.success
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("UsageError: runtime_env: invalid spec:")
    assert f" {field}: " in lines[0]
    assert "Traceback" not in captured.out + captured.err
    assert api.default_runtime_env() == before  # unchanged


def test_lock_and_upgrade_exclude_each_other(shell: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="--upgrade resolves without a lock: drop --lock"):
        shell.run_line_magic("runtime_env", "--pip alpha --lock x.toml --upgrade")


def test_eager_build_prints_steps_and_a_summary(
    shell: InteractiveShell,
    wheelhouse: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    offline_installers(monkeypatch, wheelhouse)
    monkeypatch.chdir(tmp_path)
    magic(shell, f"--pip alpha==1.0 --no-index --find-links {wheelhouse} --env-var MODE=fast")
    out = capsys.readouterr().out

    assert "building runtime env" in out
    assert "  > pip: alpha==1.0" in out  # a step starting, named by what it installs
    assert "installing alpha==1.0 with uv" in out  # an installer line, live
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("runtime env ")
    assert " ready: python " in summary

    spec = api.default_runtime_env()
    assert spec is not None
    assert spec.get("pip")["install_options"] == ["--no-index", "--find-links", str(wheelhouse)]

    # The first task finds the environment the magic built.
    shell.run_cell(
        "@remote\n"
        "def probe():\n"
        "    import os, alpha\n"
        "    return alpha.__version__, os.environ['MODE']\n"
        "probe_result = get(probe.remote(), timeout=120)"
    )
    assert shell.user_ns["probe_result"] == ("1.0", "fast")
    built = summary.split()[2]
    assert any(e["env_id"].startswith(built) for e in _status(shell))

    # Building the same default again is a cache hit.
    magic(shell, "--env-var MODE=fast")
    assert "(cached, " in capsys.readouterr().out


def test_failed_build_leaves_the_default_unchanged(
    shell: InteractiveShell,
    wheelhouse: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    offline_installers(monkeypatch, wheelhouse)
    magic(shell, "--clear")
    magic(shell, "--env-var KEEP=1")  # eager (config.eager_install defaults to true)
    before = api.default_runtime_env()
    capsys.readouterr()

    result = shell.run_cell("%runtime_env --pip no-such-package-anywhere")

    assert not result.success
    captured = capsys.readouterr()
    err = captured.err
    # The installer's lines streamed into the cell; the error is one line naming the step.
    # Named by its label, as the widget names it, and in the words of a notebook's user.
    assert err.startswith(
        "UsageError: runtime_env: build failed at pip: no-such-package-anywhere:"
        " this notebook keeps the environment it had; the whole log: "
    )
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert "no-such-package-anywhere" in captured.out
    assert api.default_runtime_env() == before


def _status(shell: InteractiveShell) -> list[dict[str, Any]]:
    from jupyter_runtimeenv.client import get_client

    client = get_client()
    assert isinstance(client, EmbeddedClient)
    return list(client._thread.run(client.agent.status()))
