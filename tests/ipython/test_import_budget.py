"""What ``%load_ext jupyter_runtimeenv`` and the first ``%runtime_env`` import (issue 19 item 5).

A real IPython shell in a fresh interpreter, run under ``python -X importtime``: its report of
every module imported is split at markers the script writes between the phases. A kernel
must not pay for the server's side (jupyter_server, jupyter_events, jsonschema's grammars,
tornado): not to load the extension, not for ``%runtime_env`` without a server (the agent
embedded), and not in a kernel of a server, where the agent is the server's and the kernel
needs only the REST client (so not the agent's build machinery either). Each case runs
twice, the second time with the env cached. No timing is asserted: the modules are the
budget; ``benchmarks/bench_kernel_env.py`` measures the time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from jupyter_process import API, JupyterProcess
from wheelhouse import make_wheelhouse

#: Never in a kernel's process because of this extension.
SERVER_SIDE = ("jupyter_server", "jupyter_events", "jsonschema", "tornado", "referencing")
#: The agent's build machinery: only where the agent is embedded.
AGENT = ("jupyter_runtimeenv.agent.agent", "jupyter_runtimeenv.agent.build")
#: What only the plugins of fields ``--env-var`` does not use import (pip's requirement
#: parsing, conda's rattler): a plugin is imported when a spec first names its field. (The
#: plugin modules themselves load through importlib.import_module, which -X importtime
#: does not log; what they import with ``import`` it does.)
UNUSED_PLUGINS = (
    "yaml",  # a spec written as YAML (a file, a %%runtime_env body) or shown as YAML needs it
    "jupyter_runtimeenv.plugins._requirements",
    "jupyter_runtimeenv.plugins._rattler",
    "jupyter_runtimeenv.plugins._constraints",
    "packaging.requirements",
)

SCRIPT = textwrap.dedent(
    """
    import faulthandler
    import sys

    faulthandler.dump_traceback_later(TIMEOUT, exit=True)  # a hang shows where it is

    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()

    def phase(name):
        sys.stderr.write(f"PHASE {name}\\n")
        sys.stderr.flush()

    phase("load_ext")
    shell.run_line_magic("load_ext", "jupyter_runtimeenv")
    phase("runtime_env")
    shell.run_line_magic("runtime_env", "--env-var BUDGET=1 --no-widget")
    phase("end")
    import jupyter_runtimeenv

    jupyter_runtimeenv.shutdown()
    """
)
#: Seconds the shell may take (the machine may be loaded); it prints its stacks past them.
TIMEOUT = 240


def imports_by_phase(stderr: str) -> dict[str, set[str]]:
    """``-X importtime``'s lines (``import time: self | cumulative | name``) by phase."""
    phases: dict[str, set[str]] = {}
    current = "start"
    for line in stderr.splitlines():
        if line.startswith("PHASE "):
            current = line.split()[1]
        elif line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "package":  # the header line
                phases.setdefault(current, set()).add(name)
    return phases


def top(names: set[str], roots: tuple[str, ...]) -> set[str]:
    return {n for n in names if any(n == r or n.startswith(r + ".") for r in roots)}


def run_shell(tmp: Path, env: dict[str, str]) -> tuple[dict[str, set[str]], str]:
    script = tmp / "shell.py"
    script.write_text(SCRIPT.replace("TIMEOUT", str(TIMEOUT)))
    done = subprocess.run(
        [sys.executable, "-X", "importtime", str(script)], capture_output=True, text=True,
        cwd=tmp, env={**env, "IPYTHONDIR": str(tmp / "ipython")}, timeout=TIMEOUT + 60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    phases = imports_by_phase(done.stderr)
    assert {"load_ext", "runtime_env"} <= phases.keys(), done.stderr[-3000:]
    return phases, done.stdout


def base_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in [n for n in env if n.startswith("JUPYTER_RUNTIMEENV_")]:
        env.pop(name)
    return env


@pytest.mark.timeout(4 * TIMEOUT + 120)
def test_no_server_side_imports_with_the_agent_embedded(tmp_path: Path) -> None:
    env = {**base_env(), "JUPYTER_RUNTIMEENV_CACHE": str(tmp_path / "cache")}
    for run in ("built", "cached"):
        phases, out = run_shell(tmp_path, env)
        assert "ready" in out, out
        assert ("cached" in out) == (run == "cached"), out
        assert not top(phases["load_ext"], SERVER_SIDE + AGENT + UNUSED_PLUGINS), run
        assert not top(phases["runtime_env"], SERVER_SIDE + UNUSED_PLUGINS), run
        # The embedded agent is what this case needs: the check sees imports at all.
        assert top(phases["runtime_env"], AGENT), run


@pytest.mark.timeout(4 * TIMEOUT + 120)
def test_a_kernel_of_a_server_imports_only_the_rest_client(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    server = JupyterProcess(
        "jupyter_server", root, tmp_path / "server.log",
        env={
            **base_env(),
            "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
            "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        },
        args=[
            "--ServerApp.jpserver_extensions={'jupyter_runtimeenv': True}",
            f"--RuntimeEnvExtension.cache_dir={tmp_path / 'server-cache'}",
        ],
    )  # fmt: skip
    try:
        env = {
            **base_env(),
            "JUPYTER_RUNTIMEENV_URL": server.url + API,
            "JUPYTER_RUNTIMEENV_TOKEN": server.token,
            "JUPYTER_RUNTIMEENV_KERNEL_ID": "budget-kernel",
            # A cache the server does not use: the kernel must not make one.
            "JUPYTER_RUNTIMEENV_CACHE": str(tmp_path / "unused-cache"),
        }
        for run in ("built", "cached"):
            phases, out = run_shell(tmp_path, env)
            assert "ready" in out, out  # (through REST the shell cannot tell it was cached)
            assert not top(phases["load_ext"], SERVER_SIDE + AGENT + UNUSED_PLUGINS), run
            assert not top(phases["runtime_env"], SERVER_SIDE + AGENT + UNUSED_PLUGINS), run
            assert "jupyter_runtimeenv.server.client" in phases["runtime_env"], run
        envs = server.api("GET", "envs")["envs"]
        assert [e["state"] for e in envs] == ["READY"], envs  # one env, built by the server
    finally:
        server.stop()
    assert not (tmp_path / "unused-cache").exists()


@pytest.mark.parametrize("argv", [["--help"], ["list", "--help"]])
def test_the_cli_parses_without_the_agent(argv: list[str]) -> None:
    """``jupyter runtimeenv --help`` (and a usage error) come before any heavy import."""
    code = (
        "import sys\n"
        "from jupyter_runtimeenv import cli\n"
        f"try:\n    cli.main({argv!r})\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('jupyter_runtimeenv.agent.agent', 'yaml', 'psutil', 'filelock',"
        " 'asyncio', 'jupyter_runtimeenv.spec.parse', 'sqlite3', 'json', 'pathlib')"
        " if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert "usage: jupyter runtimeenv" in done.stdout
    assert "HEAVY []" in done.stdout, done.stdout


def test_a_cli_build_of_an_inline_spec_imports_neither_yaml_nor_cloudpickle(
    tmp_path: Path,
) -> None:
    """``jupyter runtimeenv build`` of inline JSON, in a fresh interpreter: yaml is imported
    only for a YAML file, cloudpickle only to pickle a worker's error (both were imported by
    every command: ~20-30 ms of each start). A YAML file still builds, through yaml."""
    code = (
        "import sys\n"
        "from jupyter_runtimeenv import cli\n"
        "code = cli.main(sys.argv[1:])\n"
        "print('LOADED', sorted(m for m in ('yaml', 'cloudpickle') if m in sys.modules))\n"
        "sys.exit(code)\n"
    )
    env = {**os.environ, "JUPYTER_RUNTIMEENV_CACHE": str(tmp_path / "cache")}
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("env_vars:\n  BUDGET: yaml\n")
    for spec, loaded in (('{"env_vars": {"BUDGET": "1"}}', "[]"), (str(spec_file), "['yaml']")):
        done = subprocess.run(
            [sys.executable, "-c", code, "build", "--json", spec],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        assert f"LOADED {loaded}" in done.stdout, done.stdout


#: What a build of a cached env must not import: it is answered from the index, without an
#: agent (its start and stop, asyncio, the build machinery) or what only builds need.
NOT_FOR_A_CACHED_BUILD = (
    "asyncio",
    "psutil",
    "filelock",
    "ssl",
    "urllib.request",
    "yaml",
    "cloudpickle",
    "jupyter_runtimeenv.agent.agent",
    "jupyter_runtimeenv.agent.core",
    "jupyter_runtimeenv.agent.cache",
    "jupyter_runtimeenv.agent.build",
    # A pip spec of simple requirement lines is parsed without packaging (its markers, tags,
    # logging, platform, subprocess: ~16 ms), the plugins found without importlib.metadata,
    # the interpreter without subprocess (plugins/_interpreter.py: the agent's own).
    "packaging.requirements",
    "packaging.tags",
    "importlib.metadata",
    "subprocess",  # nor ctypes.util's (plugins/_watch.py looks libc up without it first)
)


def test_a_cli_build_of_a_cached_env_starts_no_agent(tmp_path: Path) -> None:
    """``jupyter runtimeenv build`` of an env the cache holds (issue 19 item 4, the CLI ready
    in ≤ 100 ms): the first build goes through the agent, which the check sees (so it can
    fail); the second, the same spec, is answered from the index with none of the agent's
    modules, and prints what the first printed."""
    code = (
        "import sys\n"
        "from jupyter_runtimeenv import cli\n"
        "code = cli.main(sys.argv[1:])\n"
        f"names = {NOT_FOR_A_CACHED_BUILD!r}\n"
        "loaded = [n for n in names if n in sys.modules]\n"
        "print('LOADED', loaded, file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    for i in range(40):  # enough files for the parse to lay a spare tree out (plugins/_spares)
        (code_dir / f"m{i}.py").write_text(f"VALUE = {i}\n")
    wheels = make_wheelhouse(tmp_path / "wheels")
    pip = {"packages": ["beta>=1.0"], "install_options": ["--no-index", "-f", str(wheels)]}
    spec = json.dumps({"env_vars": {"BUDGET": "1"}, "working_dir": str(code_dir), "pip": pip})
    env = {**base_env(), "JUPYTER_RUNTIMEENV_CACHE": str(tmp_path / "cache")}
    outputs, loaded = [], []
    for _run in ("built", "cached"):
        done = subprocess.run(
            [sys.executable, "-c", code, "build", "--json", spec],
            capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout))
        loaded.append(done.stderr.rsplit("LOADED ", 1)[1].strip())
    assert "'asyncio'" in loaded[0]
    assert "'jupyter_runtimeenv.agent.agent'" in loaded[0]
    assert "'packaging.requirements'" in loaded[0]  # the first build installs
    assert loaded[1] == "[]", loaded[1]
    for key in ("env_id", "state", "context", "spec"):
        assert outputs[1][key] == outputs[0][key], key
    assert Path(outputs[1]["context"]["cwd"], "m7.py").read_text() == "VALUE = 7\n"
    # The parse laid a spare tree out in the cache's tmp (a build would have taken it); the
    # command removed it when it ended, as an agent's stop does.
    assert not list((tmp_path / "cache" / "tmp").iterdir())
