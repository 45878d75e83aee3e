"""``jupyter runtimeenv kernelspec install NAME env.yaml`` resolves every relative path of the
spec against the spec file at install time: the kernel then starts from any cwd.

Real parts: the CLI installs the kernelspec (run from the spec's directory, naming the file
relatively); a real Jupyter server, its cwd elsewhere, starts a real kernel through the
provisioner; the packages come only from the spec's own relative ``--find-links``
directories (no index, no wheelhouse in the installers' environment).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.kernels.test_kernels import run, start_kernel
from tests.wheelhouse import build_wheel


@pytest.fixture
def extension_config() -> dict[str, Any]:
    return {"kernel_sweep_interval": 0.2}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    for sub in ("wheels-a", "wheels-b", "code", "mods", "reqs"):
        (proj / sub).mkdir(parents=True)
    build_wheel(proj / "wheels-a", "alpha", "2.0", [])
    build_wheel(proj / "wheels-b", "beta", "1.0", ["alpha>=2"])
    (proj / "code" / "helper_here.py").write_text("WHERE = 'working_dir'\n")
    (proj / "mods" / "extra_mod.py").write_text("WHAT = 'py_module'\n")
    (proj / "reqs" / "requirements.txt").write_text("--find-links ../wheels-a\nalpha==2.0\n")
    (proj / "env.yaml").write_text(
        "pip:\n"
        "  packages: reqs/requirements.txt\n"
        "  install_options: ['--no-index', '--find-links', 'wheels-b']\n"
        "working_dir: code\n"
        "py_modules: [mods/extra_mod.py]\n"
        "env_vars: {RTE_FLAG: 'on'}\n"
    )
    return proj


@pytest.mark.slow
async def test_a_kernelspec_from_a_relative_spec_starts_from_another_cwd(
    jp_fetch: Any,
    jp_serverapp: Any,
    project: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only the spec's own directories may provide packages.
    for var in ("UV_FIND_LINKS", "PIP_FIND_LINKS"):
        monkeypatch.delenv(var, raising=False)
    for var in ("UV_NO_INDEX", "UV_OFFLINE", "PIP_NO_INDEX"):
        monkeypatch.setenv(var, "1")
    argv = ["kernelspec", "install", "rte-rel", "env.yaml"]  # relative, from the spec's dir
    installed = subprocess.run(
        [sys.executable, "-m", "jupyter_runtimeenv", *argv],
        cwd=project,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert installed.returncode == 0, installed.stderr
    kernel_dir = Path(installed.stdout.strip().rsplit(" in ", 1)[1])
    stored = json.loads((kernel_dir / "kernel.json").read_text())
    spec = stored["metadata"]["kernel_provisioner"]["config"]["runtime_env"]
    assert spec["pip"]["packages"][0] == f"--find-links {project / 'wheels-a'}"
    options = spec["pip"]["install_options"]
    assert options == ["--no-index", "--find-links", str(project / "wheels-b")]
    assert spec["working_dir"] == str(project / "code")
    assert spec["py_modules"] == [str(project / "mods" / "extra_mod.py")]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    kernel_id = await start_kernel(jp_fetch, "rte-rel")
    code = (
        "import os, alpha, helper_here, extra_mod\n"
        "print(alpha.__version__, os.environ['RTE_FLAG'], helper_here.WHERE, extra_mod.WHAT,"
        " os.path.isfile('helper_here.py'))"
    )
    out = (await run(jp_serverapp, kernel_id, code)).split()
    assert out == ["2.0", "on", "working_dir", "py_module", "True"]
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
