"""A pool's workers learn its imports (issue 19 item 5): a new worker imports what earlier
calls imported from installed packages and the standard library before it takes a call,
and never the user's own modules."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from jupyter_runtimeenv.context import EnvContext
from jupyter_runtimeenv.workers.pool import Pool
from tests.workers.helpers import submit

MakePool = Callable[..., Pool]
STDLIB = "xml.dom.minidom"  # not imported by the bootstrap


def import_modules(names: list[str], path: str) -> int:
    sys.path.insert(0, path)
    for name in names:
        importlib.import_module(name)
    return os.getpid()


def hold(trigger: str) -> int:
    while os.path.exists(trigger):
        time.sleep(0.01)
    return os.getpid()


def imported(names: list[str]) -> tuple[int, list[bool]]:
    return os.getpid(), [name in sys.modules for name in names]


@pytest.mark.parametrize("learn", [True, False], ids=["learning", "not-learning"])
def test_a_new_worker_imports_what_the_pool_learned(
    make_pool: MakePool, tmp_path: Path, learn: bool
) -> None:
    user = tmp_path / "mine"
    user.mkdir()
    (user / "users_own_module.py").write_text("VALUE = 1\n")
    pool = make_pool(max_workers=2, learn_imports=learn)
    names = [STDLIB, "users_own_module"]
    first = submit(pool, import_modules, names, str(user)).result(60)
    assert (STDLIB in pool.habits.imports) is learn
    assert "users_own_module" not in pool.habits.imports
    trigger = tmp_path / "trigger"
    trigger.write_text("hold")
    busy = submit(pool, hold, str(trigger))  # the first worker is busy: a second one starts
    second, found = submit(pool, imported, names).result(60)
    trigger.unlink()
    assert busy.result(60) == first
    assert second != first
    assert found == [learn, False]


def test_a_worker_that_dies_preloading_turns_learning_off(
    make_pool: MakePool, ctx: EnvContext, tmp_path: Path
) -> None:
    """A learned module that kills a new worker at import (here: once a marker exists) does
    not take the pool down: the pool forgets what it learned and the next worker starts
    without it."""
    packages = tmp_path / "lib" / "site-packages"  # learnable: an installed package's path
    packages.mkdir(parents=True)
    marker = tmp_path / "crash now"
    (packages / "crashy_on_import.py").write_text(
        f"import os\nif os.path.exists({str(marker)!r}):\n    os._exit(9)\n"
    )
    paths = (*ctx.driver_sys_path, str(packages))  # every worker can import it
    pool = make_pool(dataclasses.replace(ctx, driver_sys_path=paths), max_workers=2)
    first = submit(pool, import_modules, ["crashy_on_import"], str(packages)).result(60)
    assert "crashy_on_import" in pool.habits.imports
    marker.write_text("yes")
    trigger = tmp_path / "trigger"
    trigger.write_text("hold")
    busy = submit(pool, hold, str(trigger))
    second, found = submit(pool, imported, ["crashy_on_import"]).result(60)
    trigger.unlink()
    assert busy.result(60) == first
    assert second != first
    assert found == [False]
    assert not pool.habits.learn_imports


def test_closing_a_pool_while_a_worker_preloads_is_no_preload_failure(
    make_pool: MakePool, ctx: EnvContext, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A pool closed while its new worker still imports the learned list (the first worker
    finished the work meanwhile) stops that worker: not a failure to preload."""
    packages = tmp_path / "lib" / "site-packages"
    packages.mkdir(parents=True)
    slow = tmp_path / "slow now"
    importing = tmp_path / "importing"
    (packages / "slow_on_import.py").write_text(
        "import os, time\n"
        f"if os.path.exists({str(slow)!r}):\n"
        f"    open({str(importing)!r}, 'w').close()\n"
        "    time.sleep(60)\n"
    )
    paths = (*ctx.driver_sys_path, str(packages))
    pool = make_pool(dataclasses.replace(ctx, driver_sys_path=paths), max_workers=2)
    submit(pool, import_modules, ["slow_on_import"], str(packages)).result(60)
    slow.write_text("yes")
    trigger = tmp_path / "trigger"
    trigger.write_text("hold")
    busy = submit(pool, hold, str(trigger))
    waiting = submit(pool, imported, ["slow_on_import"])  # a second worker starts for it
    deadline = time.monotonic() + 60
    while not importing.exists():
        assert time.monotonic() < deadline, "the second worker never preloaded"
        time.sleep(0.01)
    with caplog.at_level(logging.WARNING, logger="jupyter_runtimeenv.workers.pool"):
        pool.close()
    assert busy.cancelled()
    assert waiting.cancelled()
    assert "failed to preload" not in caplog.text
    assert pool.habits.learn_imports
