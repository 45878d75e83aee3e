"""Fixtures of the package plugin tests: the wheelhouse, offline installers, and running
Python inside a built environment the way a worker starts (``compose`` + ``process_env``,
then the ``sys.path`` entries the worker bootstrap would put first)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from wheelhouse import make_wheelhouse, offline_installers

from jupyter_runtimeenv.context import EnvContext, compose, process_env
from jupyter_runtimeenv.plugins import _layout, _spares, _store

# What the worker bootstrap does first (stdlib only): put the env's entries first.
_PRELUDE = (
    "import json, os, sys; "
    "sys.path[0:0] = json.loads(os.environ.get('JUPYTER_RUNTIMEENV_SYS_PATH', '[]')); "
)


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, wheelhouse: Path) -> None:
    offline_installers(monkeypatch, wheelhouse)


@pytest.fixture
def cache(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A cache root with its ``tmp`` directory, for trees hashed, stored and laid out. After
    the test its store's spares are dropped and every tree built is stored; in a module
    that sets ``SPARES_LEFT = False``, nothing may be left in ``tmp`` either."""
    root = tmp_path / "cache"
    (root / "tmp").mkdir(parents=True)
    yield root
    store = str(_store.blob_dir(root))
    _spares.drop(store)
    assert _layout.pending(store) == 0
    if not getattr(request.module, "SPARES_LEFT", True):
        assert list((root / "tmp").iterdir()) == []  # no spare left behind


@pytest.fixture
def run_in() -> Callable[..., Any]:
    """``run_in(ctx, code)``: run ``code`` in a process started inside ``ctx``; returns the
    JSON it prints on its last line."""

    def run(ctx: EnvContext, code: str) -> Any:
        proc = subprocess.run(
            compose(ctx, ["-c", _PRELUDE + code]),
            env=process_env(ctx),
            cwd=ctx.cwd,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    return run
