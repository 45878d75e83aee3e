"""The remote API end to end: a real embedded agent builds the env, real workers run tasks."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.client import EmbeddedClient
from jupyter_runtimeenv.errors import BuildError, RemoteTaskError
from jupyter_runtimeenv.workers.executor import LocalExecutor
from tests.workers.helpers import wait_gone


def env_var(name: str) -> str | None:
    return os.environ.get(name)


def square(x: int) -> int:
    return x * x


def test_remote_with_and_without_arguments(agent_executor: LocalExecutor) -> None:
    plain = jre.remote(square)
    configured = jre.remote(runtime_env={"env_vars": {"WHO": "decorator"}})(env_var)
    assert jre.get(plain.remote(7)) == 49
    assert jre.get(configured.remote("WHO")) == "decorator"
    with pytest.raises(TypeError, match=r"square.remote\(\.\.\.\)"):
        plain(3)


def test_session_default_and_options_merge_per_variable(agent_executor: LocalExecutor) -> None:
    jre.init(runtime_env={"env_vars": {"A": "session", "B": "session"}})
    f = jre.remote(runtime_env={"env_vars": {"B": "function"}})(env_var)
    assert jre.get([f.remote("A"), f.remote("B")]) == ["session", "function"]
    g = f.options(runtime_env={"env_vars": {"B": "options", "C": "options"}})
    assert jre.get([g.remote("A"), g.remote("B"), g.remote("C")]) == [
        "session",
        "options",
        "options",
    ]
    # Each distinct env has its own pool.
    assert len({p.ctx.env_id for p in agent_executor.pools if p.ctx is not None}) >= 2


def test_get_and_wait_like_ray(agent_executor: LocalExecutor) -> None:
    nap = jre.remote(time.sleep)
    fast = jre.remote(square)
    slow = nap.remote(30)
    quick = [fast.remote(i) for i in range(4)]
    ready, not_ready = jre.wait([slow, *quick], num_returns=4, timeout=30)
    assert ready == quick
    assert not_ready == [slow]
    ready, not_ready = jre.wait([slow], timeout=0.05)
    assert (ready, not_ready) == ([], [slow])
    with pytest.raises(TimeoutError):
        jre.get(slow, timeout=0.05)
    with pytest.raises(TimeoutError):
        jre.get([quick[0], slow], timeout=0.05)
    assert slow.cancel()
    with pytest.raises(ValueError, match="num_returns"):
        jre.wait(quick, num_returns=5)


async def test_futures_can_be_awaited(agent_executor: LocalExecutor) -> None:
    fast = jre.remote(square)
    assert await fast.remote(5) == 25
    results = await asyncio.gather(*(fast.remote(i) for i in range(5)))
    assert results == [0, 1, 4, 9, 16]


def test_remote_errors_reach_get(agent_executor: LocalExecutor) -> None:
    def divide(a: int, b: int) -> float:
        return a / b

    with pytest.raises(ZeroDivisionError) as info:
        jre.get(jre.remote(divide).remote(1, 0))
    assert isinstance(info.value, RemoteTaskError)
    assert "in divide" in info.value.remote_traceback
    rendered = "\n".join(info.value._render_traceback_())
    assert "ZeroDivisionError" in rendered


def test_a_failed_build_surfaces_from_result(agent_executor: LocalExecutor) -> None:
    f = jre.remote(runtime_env={"plugins": {"_failing_plugin:FailingPlugin": {}}})(square)
    future = f.remote(3)
    with pytest.raises(BuildError) as info:
        future.result(60)
    assert "failing step" in str(info.value)
    assert any("says no" in line for line in info.value.output_tail)


def _write_module(directory: Path, name: str, body: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.py").write_text(body)


def which_twin() -> tuple[str, str]:
    import twin

    return twin.WHO, twin.__file__


def late_import() -> str:
    import latecomer

    return str(latecomer.VALUE)


def test_driver_sys_path_order_and_later_additions(
    agent_executor: LocalExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    _write_module(first, "twin", "WHO = 'first'\n")
    _write_module(second, "twin", "WHO = 'second'\n")
    monkeypatch.syspath_prepend(str(second))
    monkeypatch.syspath_prepend(str(first))
    sys.modules.pop("twin", None)
    import twin  # the driver's view: the first entry wins

    assert twin.WHO == "first"
    remote_twin = jre.remote(which_twin)
    assert jre.get(remote_twin.remote()) == ("first", str(first / "twin.py"))
    old_pools = agent_executor.pools
    old_pids = [pid for pool in old_pools for pid in pool.pids]

    # A directory added after the pool started is seen by the next task.
    later = tmp_path / "later"
    _write_module(later, "latecomer", "VALUE = 42\n")
    monkeypatch.syspath_prepend(str(later))
    assert jre.get(jre.remote(late_import).remote()) == "42"
    # The old pool (stale path) drained and closed; its workers are gone.
    deadline = time.monotonic() + 10
    while not all(pool.closed for pool in old_pools) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert all(pool.closed for pool in old_pools)
    wait_gone(old_pids)
    sys.modules.pop("twin", None)


def test_driver_sys_path_false_keeps_the_driver_path_out(
    agent_executor: LocalExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_module(tmp_path / "hidden", "latecomer", "VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "hidden"))
    sys.modules.pop("latecomer", None)

    def probe() -> bool:
        import importlib.util

        return importlib.util.find_spec("latecomer") is not None

    assert jre.get(jre.remote(probe).remote()) is True
    off = jre.remote(runtime_env={"driver_sys_path": False})(probe)
    assert jre.get(off.remote()) is False


def shout(word: str) -> int:
    print(f"hello {word}")
    print("partial line", end="")
    print("oops", file=sys.stderr)
    return os.getpid()


def test_output_is_forwarded_line_by_line_with_a_prefix(
    agent_executor: LocalExecutor, capsys: pytest.CaptureFixture[str]
) -> None:
    pid = jre.get(jre.remote(shout).remote("world"))
    captured = capsys.readouterr()
    assert f"(shout pid={pid}) hello world\n" in captured.out
    assert f"(shout pid={pid}) partial line\n" in captured.out
    assert f"(shout pid={pid}) oops\n" in captured.err
    assert "hello world" not in captured.err


def test_shutdown_stops_workers_and_releases_the_env(
    agent_executor: LocalExecutor, client: EmbeddedClient
) -> None:
    pid = jre.get(jre.remote(os.getpid).remote())
    holders = _holders(client)
    assert any(h.startswith(f"pool:{os.getpid()}:") for h in holders)
    agent_executor.shutdown()
    wait_gone([pid])
    assert not any(h.startswith(f"pool:{os.getpid()}:") for h in _holders(client))


def _holders(client: EmbeddedClient) -> list[str]:
    status = asyncio.run(client.status())
    return [h for env in status for h in env.get("holders", [])]


def test_remote_traceback_of_a_notebook_function_shows_its_cell(
    agent_executor: LocalExecutor,
) -> None:
    """A function defined in a notebook cell is pickled by value (cloudpickle renames its
    file ``<dynamic-code>``); the driver maps the frame back to the cell and its source."""
    import linecache

    cell = "/tmp/ipykernel_0/cell-42.py"
    source = "def explode(x):\n    y = x + 1\n    raise KeyError(f'no {y}')\n"
    # What IPython does for every cell: the source lives in linecache, not on disk.
    linecache.cache[cell] = (len(source), None, source.splitlines(True), cell)
    namespace: dict[str, object] = {"__name__": "__main__"}
    exec(compile(source, cell, "exec"), namespace)
    try:
        explode = jre.remote(namespace["explode"])  # type: ignore[arg-type]
        with pytest.raises(RemoteTaskError) as info:
            jre.get(explode.remote(1))
    finally:
        del linecache.cache[cell]
    text = info.value.remote_traceback
    assert f'File "{cell}", line 3, in explode' in text
    assert "    raise KeyError(f'no {y}')" in text
    assert "<dynamic-code>" not in text
    assert isinstance(info.value, KeyError)


def test_a_call_after_its_pool_closed_gets_a_new_pool(agent_executor: LocalExecutor) -> None:
    """The executor remembers the last call's pool (same spec and path objects: no lookup);
    a pool closed meanwhile is not taken from that memory."""
    f = jre.remote(os.getpid).options(runtime_env={"env_vars": {"WHO": "memo"}})
    first = jre.get(f.remote())
    assert jre.get(f.remote()) == first  # the same spec object: the remembered pool
    (pool,) = [p for p in agent_executor.pools if not p.closed]
    pool.close()
    second = jre.get(f.remote(), timeout=60)
    assert second != first
    assert [p for p in agent_executor.pools if not p.closed] != [pool]
