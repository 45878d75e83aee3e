"""Zygote workers of an env's own interpreter (a pip/uv/conda env's venv): its first worker
is spawned alone, its second waits for the template it starts and is forked from it, and
one whose template does not come in time is spawned. Real venvs (uv), real templates."""

from __future__ import annotations

import os
import signal
import site
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from jupyter_runtimeenv.context import EnvContext
from jupyter_runtimeenv.plugins._uv import uv_bin
from jupyter_runtimeenv.workers import zygote
from jupyter_runtimeenv.workers.pool import Pool
from tests.workers.test_zygote import pools, run_snapshot, same_but_spawned

__all__ = ["pools"]  # the fixture, from test_zygote


def venv_of(ctx: EnvContext, where: Path) -> EnvContext:
    """``ctx`` with a venv's python of its own, as a pip env has (uv venv: the driver's
    interpreter, another prefix); the test's modules import what the driver has (psutil),
    so its site-packages go along."""
    subprocess.run([uv_bin(), "venv", "-q", str(where), "--python", sys.executable], check=True)
    paths = (*ctx.driver_sys_path, *site.getsitepackages())
    return ctx.replace(python=str(where / "bin" / "python"), driver_sys_path=paths)


def of_python(python: str) -> list[zygote.Template]:
    return [t for t in zygote.templates() if t.python == python]


def test_an_envs_own_interpreter_starts_its_template_at_its_second_worker(
    ctx: EnvContext, pools: Callable[..., Pool], tmp_path: Path
) -> None:
    own = venv_of(ctx, tmp_path / "venv")
    first = run_snapshot(own, pools, spawn=False)
    assert not first["forked"]
    assert first["executable"][1] == str(tmp_path / "venv")
    assert of_python(own.python) == [], "one worker of an env's own interpreter started a template"
    # The second waits for the template it starts and is forked from it: one interpreter
    # start, not a spawn beside the template's.
    second = run_snapshot(own, pools, spawn=False)
    assert second["forked"]
    (template,) = of_python(own.python)
    assert template.state == "ready"
    assert same_but_spawned(second) == same_but_spawned(first)
    third = run_snapshot(own, pools, spawn=False)
    assert third["forked"]
    assert of_python(own.python) == [template]
    # The driver's own interpreter still starts its template with its first worker.
    run_snapshot(ctx, pools, spawn=False)
    assert of_python(ctx.python)


def test_a_second_worker_whose_template_does_not_come_is_spawned(
    ctx: EnvContext, pools: Callable[..., Pool], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The venv's templates hang as they start (a .pth that sleeps in a process started with
    # --zygote, as only a template is): its second worker is spawned after STARTING_WAIT
    # (made short here).
    own = venv_of(ctx, tmp_path / "venv")
    (purelib,) = (tmp_path / "venv" / "lib").glob("python*/site-packages")
    (purelib / "hang_template.pth").write_text(
        "import sys, time; '--zygote' in sys.argv and time.sleep(600)\n"
    )
    monkeypatch.setattr(zygote, "STARTING_WAIT", 1.0)
    first = run_snapshot(own, pools, spawn=False)
    second = run_snapshot(own, pools, spawn=False)
    assert not first["forked"]
    assert not second["forked"]
    assert same_but_spawned(second) == same_but_spawned(first)
    (template,) = of_python(own.python)
    assert template.state == "starting"
    # Killed as it starts: its start ends, the interpreter's template is given up on and its
    # next workers are spawned (at once: no wait for a template).
    assert template.pid is not None
    os.kill(template.pid, signal.SIGKILL)
    assert template.ready.wait(60)
    assert template.state == "unusable"
    assert not run_snapshot(own, pools, spawn=False)["forked"]
