"""``driver_python``: envs layer over the driver's interpreter, not the agent's.

The agent of a Jupyter server may run on another interpreter than a kernel; here a second
real venv (made with uv from this interpreter, with a module only it has) plays the
kernel's environment.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.errors import SpecError
from jupyter_runtimeenv.plugins._uv import uv_bin
from jupyter_runtimeenv.plugins.pip import venv_python, venv_site_packages
from jupyter_runtimeenv.spec import parse
from jupyter_runtimeenv.workers.executor import resolve_for_driver

Agent = Callable[..., Any]

PROBE = (
    "import importlib.util as u; "
    "has = lambda m: u.find_spec(m) is not None; "
    "alpha = __import__('alpha') if has('alpha') else None; "
    "print(json.dumps({'kernel_only': has('kernel_only'), 'yaml': has('yaml'),"
    " 'alpha': alpha and alpha.__version__, 'python': sys.executable}))"
)


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A driver's environment the agent does not run in: a module only it has, no yaml."""
    venv = tmp_path_factory.mktemp("kernel") / "venv"
    subprocess.run(
        [uv_bin(), "venv", "-q", str(venv), "--python", sys.executable, "--no-config"],
        check=True,
    )
    (venv_site_packages(venv) / "kernel_only.py").write_text("WHERE = 'kernel env'\n")
    return venv


async def test_pip_env_layers_over_the_driver_python(
    make_agent: Agent, run_in: Callable[..., Any], kernel_env: Path
) -> None:
    agent = await make_agent()
    ctx = await agent.get_or_create(
        {"pip": ["alpha==2.0"], "driver_python": venv_python(kernel_env)}, "t"
    )
    out = run_in(ctx, PROBE)
    assert out == {
        "kernel_only": True,  # the driver's packages show through
        "yaml": False,  # the agent's do not
        "alpha": "2.0",
        "python": ctx.python,
    }


async def test_without_driver_python_the_agent_env_is_the_parent(
    make_agent: Agent, run_in: Callable[..., Any]
) -> None:
    agent = await make_agent()
    ctx = await agent.get_or_create({"pip": ["alpha==2.0"]}, "t")
    out = run_in(ctx, PROBE)
    assert out["kernel_only"] is False
    assert out["yaml"] is True


async def test_an_env_without_packages_runs_on_the_driver_python(
    make_agent: Agent, kernel_env: Path
) -> None:
    agent = await make_agent()
    python = venv_python(kernel_env)
    ctx = await agent.get_or_create({"env_vars": {"A": "1"}, "driver_python": python}, "t")
    assert ctx.python == python
    explicit = await agent.get_or_create(
        {"driver_python": python, "py_executable": sys.executable}, "t"
    )
    assert explicit.python == sys.executable  # py_executable says it outright


def test_the_venv_depends_on_the_driver_python(kernel_env: Path) -> None:
    from jupyter_runtimeenv.plugins.pip import PipPlugin

    plugin = PipPlugin()
    ours = parse({"pip": ["alpha"]})
    theirs = parse({"pip": ["alpha"], "driver_python": venv_python(kernel_env)})
    assert plugin.uris(ours.get("pip"), ours) != plugin.uris(theirs.get("pip"), theirs)
    assert ours.env_id != theirs.env_id


def test_the_driver_fills_in_its_interpreter() -> None:
    spec = resolve_for_driver(parse({"env_vars": {"A": "1"}}), paths=["/x"])
    assert spec.get("driver_python") == sys.executable
    assert spec.driver_sys_path == ["/x"]
    given = resolve_for_driver(parse({"driver_python": "python3", "driver_sys_path": False}))
    assert given.get("driver_python").endswith("python3")
    assert given.driver_sys_path is False
    conda = resolve_for_driver(parse({"conda": sys.prefix, "driver_sys_path": False}))
    assert "driver_python" not in conda


@pytest.mark.parametrize("value", ["/no/such/python", "", 3, "no-such-python-xyz"])
def test_bad_driver_python_names_the_field(value: Any) -> None:
    with pytest.raises(SpecError) as info:
        parse({"driver_python": value})
    assert info.value.field == "driver_python"
