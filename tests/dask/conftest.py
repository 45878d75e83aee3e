"""Fixtures of the Dask tests: a real ``LocalCluster`` (two worker processes on 127.0.0.1),
each worker with its own cache root, installing only from the tests' wheelhouse.

The cluster is shared by the tests of a module (starting one takes seconds); the node agent
plugin is registered once per cluster, so every executor on it uses the node cache roots
given first (``node_roots``). After each test no environment worker of the test's
executors may be left on the nodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv import api
from tests.dask.helpers import assert_no_env_workers
from tests.wheelhouse import make_wheelhouse

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))


@pytest.fixture(scope="module")
def node_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nodes")


@pytest.fixture(scope="module")
def cluster(wheelhouse: Path) -> Iterator[Any]:
    # The workers inherit this environment: their installers never reach an index.
    offline = {
        "UV_NO_INDEX": "1",
        "UV_FIND_LINKS": str(wheelhouse),
        "UV_OFFLINE": "1",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheelhouse),
    }
    with pytest.MonkeyPatch.context() as mp:
        for var, value in offline.items():
            mp.setenv(var, value)
        cluster = distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        )
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def client(cluster: Any) -> Iterator[Any]:
    with distributed.Client(cluster, set_as_default=False) as client:
        yield client


@pytest.fixture
def make_executor(client: Any, node_root: Path, tmp_path: Path) -> Iterator[Any]:
    from jupyter_runtimeenv.dask import DaskExecutor

    made: list[Any] = []

    def make(target: Any = None) -> Any:
        executor = DaskExecutor(
            client if target is None else target,
            node_cache_dir=str(node_root / "node-{name}"),
            driver_cache_dir=tmp_path / "driver-cache",
        )
        made.append(executor)
        return executor

    yield make
    api.shutdown()
    for executor in made:
        executor.shutdown()
    assert_no_env_workers(client)
