"""Starting the first worker early: ``prestart`` on the pool, the executor and the API.

Real agent, real worker processes; no timing is asserted (that is benchmarks/run.py's W2b and
W6): the worker must exist before the first call, serve it, stay within ``max_workers``, be
reaped by the idle timeout, and never be started once the executor or pool is closed.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import psutil

import jupyter_runtimeenv as jre
from jupyter_runtimeenv import parse
from jupyter_runtimeenv.client import EmbeddedClient
from jupyter_runtimeenv.workers.executor import LocalExecutor
from jupyter_runtimeenv.workers.pool import Pool
from tests.workers.helpers import submit, wait_gone, worker_children


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


def pool_holders(client: EmbeddedClient) -> list[str]:
    status = asyncio.run(client.status())
    return [h for env in status for h in env.get("holders", []) if h.startswith("pool:")]


def test_prestart_starts_the_worker_the_first_call_runs_on(client: EmbeddedClient) -> None:
    executor = LocalExecutor(acquire=client.acquire_sync, release=client.release_sync)
    try:
        jre.init(runtime_env={"env_vars": {"EARLY": "1"}}, executor=executor)
        jre.prestart()
        [pool] = executor.pools
        [pid] = wait_for(lambda: pool.pids)
        assert psutil.Process(pid).is_running()
        assert [p.pid for p in worker_children()] == [pid]  # before any call
        jre.prestart()  # a second ask while one is there starts nothing more
        assert executor.pools == [pool]
        assert pool.pids == [pid]
        assert jre.get(jre.remote(os.getpid).remote()) == pid
        # It had time to import what a notebook's function (pickled by value) needs.
        assert jre.get(jre.remote(eval).remote("'cloudpickle' in __import__('sys').modules"))
        assert jre.get(jre.remote(os.getenv).remote("JUPYTER_RUNTIMEENV_WARM")) is None
        assert jre.get(jre.remote(os.getenv).remote("EARLY")) == "1"
        assert pool.pids == [pid]
    finally:
        executor.shutdown()
    wait_gone([pid])


def test_a_prestarted_worker_no_call_uses_is_reaped_and_the_env_released(
    client: EmbeddedClient,
) -> None:
    executor = LocalExecutor(
        idle_timeout=0.3, acquire=client.acquire_sync, release=client.release_sync
    )
    try:
        executor.prestart(parse({"env_vars": {"EARLY": "reaped"}}))
        [pool] = executor.pools
        [pid] = wait_for(lambda: pool.pids)
        assert pool_holders(client)
        wait_gone([pid])  # the idle timeout stops it ...
        wait_for(lambda: pool.closed)  # ... and the pool, empty, closes
        wait_for(lambda: not pool_holders(client))  # releasing its reference
    finally:
        executor.shutdown()


def test_no_worker_is_prestarted_after_close(client: EmbeddedClient, make_pool: Any) -> None:
    executor = LocalExecutor(acquire=client.acquire_sync, release=client.release_sync)
    executor.shutdown()
    executor.prestart(parse({"env_vars": {"EARLY": "late"}}))
    assert executor.pools == []

    pool: Pool = make_pool()
    pool.close()
    pool.prestart()
    assert pool.pids == []
    assert worker_children() == []


def test_prestart_before_the_env_is_known_starts_one_worker_when_it_is(make_pool: Any) -> None:
    pool: Pool = make_pool(max_workers=1)
    pool.prestart()  # likely still acquiring: the worker starts once the context arrives
    [pid] = wait_for(lambda: pool.pids)
    assert submit(pool, os.getpid).result(timeout=30) == pid
    assert pool.pids == [pid]
