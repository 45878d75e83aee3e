"""Ids and names outside the server: the agent, the cache, the command line, kernelspecs.

Threat: a path built from an unchecked id or name (``logs/<env_id>.log``,
``resources/<plugin>/``) reaches outside the cache. Every entrance checks the alphabet first,
with full matches (``$`` in ``re.match`` also matches before a final newline).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.agent.cache import Cache
from jupyter_runtimeenv.errors import EnvNotFound, InvalidName, SpecError
from jupyter_runtimeenv.kernels import install_kernelspec
from jupyter_runtimeenv.spec.ids import check_holder, is_env_id, is_env_id_prefix

BAD_IDS = ["../../etc/passwd", "..", "a\0b", "0" * 63 + "\n", "A" * 64, "x" * 5000, "", " "]


def test_the_alphabets_are_full_matches() -> None:
    assert is_env_id("0" * 64)
    assert is_env_id_prefix("0a")
    for bad in BAD_IDS:
        assert not is_env_id(bad)
        assert not is_env_id_prefix(bad)
    for holder in ("user", "cli", "kernel:3f2a-9/pool:12:1:0123abcd", "a@b+c=d"):
        assert check_holder(holder) == holder
    for bad in ("", "a\n", "a\0", "../x", ".", "-x", "a b", "x" * 513):
        with pytest.raises(InvalidName):
            check_holder(bad)


async def test_the_agent_refuses_bad_ids_and_holders_before_any_path(
    make_agent: Callable[..., Any], cache_dir: Path
) -> None:
    agent = await make_agent()
    outside = cache_dir.parent / "secret.log"
    outside.write_text("SECRET")
    for bad in [*BAD_IDS, "../secret"]:
        for call in (agent.log, agent.env_status, agent.remove, agent.wait, agent.resolve_id):
            with pytest.raises(EnvNotFound):
                await call(bad)
        with pytest.raises(EnvNotFound):
            await agent.release(bad, "user")
    spec = agent.parse({"env_vars": {"A": "1"}})
    await agent.get_or_create(spec, "user")
    for bad in ("a\n", "../x", "x" * 600):
        with pytest.raises(InvalidName):
            await agent.ensure(spec, bad)
        with pytest.raises(InvalidName):
            await agent.release(spec.env_id, bad)
    assert await agent.resolve_id(spec.env_id[:6]) == spec.env_id


def test_the_cache_builds_paths_from_checked_names_only(cache_dir: Path) -> None:
    cache = Cache(cache_dir)
    try:
        for bad in BAD_IDS:
            with pytest.raises(ValueError, match="not an env id"):
                cache.log_path(bad)
            assert cache.env_row(bad) is None
            assert cache.env_ids_with_prefix(bad) == []
        for plugin in ("../../outside", "/abs", "..", "a/../../b", "a\0b"):
            path = cache.resource_path(plugin, "uri")
            assert path.parent.parent == cache.root / "resources", plugin
        assert cache.resource_path("pip", "u").parent.name == "pip"
        assert cache.resource_path("pkg.mod.Plugin", "u").parent.name == "pkg.mod.Plugin"
    finally:
        cache.close()


def cli(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JUPYTER_RUNTIMEENV_CACHE": str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "jupyter_runtimeenv", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize("command", ["logs", "rm"])
@pytest.mark.parametrize("env_id", ["../../etc/passwd", "x" * 5000, "0" * 63 + "\n", "ABC"])
def test_the_cli_refuses_bad_ids_in_one_line(cache_dir: Path, command: str, env_id: str) -> None:
    result = cli(cache_dir, command, env_id)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("error: no environment"), result.stderr
    assert "lowercase hex" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("size", ["inf", "nan", "-1", "-5G", "1e400", "true"])
def test_the_cli_refuses_sizes_that_are_not_byte_counts(cache_dir: Path, size: str) -> None:
    result = cli(cache_dir, "gc", f"--max-bytes={size}")
    assert result.returncode == 2, result.stderr
    assert "expected a size" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("spec", ['{"config": {"setup_timeout_seconds": NaN}}', "[" * 100_000])
def test_the_cli_refuses_non_json_inline_specs(cache_dir: Path, spec: str) -> None:
    result = cli(cache_dir, "build", spec)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr


def test_a_kernelspec_name_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="kernelspec name"):
        install_kernelspec("good\n", {"env_vars": {"A": "1"}}, prefix=str(tmp_path))
