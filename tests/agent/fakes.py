"""Plugins for agent tests, injected through ``PluginRegistry(plugins=[...])``.

They are real plugins (real files, real subprocesses); "fake" only in that they build
nothing useful. Some are also loaded by import path (``fakes.CountingPlugin``) from
subprocesses, with this directory on PYTHONPATH.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jupyter_runtimeenv.context import ContextBuilder
from jupyter_runtimeenv.errors import SpecError
from jupyter_runtimeenv.plugins import BuildContext, RuntimeEnvPlugin


class CountingPlugin(RuntimeEnvPlugin):
    """``{"name": str, "bytes": int, "sleep": float}``: one resource per name.

    Every create appends a line to ``$FAKE_CREATES`` (a file), so tests (and tests across
    processes) can count creates.
    """

    name = "counting"
    priority = 20

    def validate(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            raise SpecError("name", "expected a mapping with a string 'name'")
        return {
            "name": value["name"],
            "bytes": int(value.get("bytes", 10)),
            "sleep": float(value.get("sleep", 0)),
            "explode": bool(value.get("explode", False)),
        }

    def uris(self, value: Any, spec: Any) -> list[str]:
        return [f"counting://{value['name']}"]

    async def create(self, uri: str, value: Any, build: BuildContext) -> int:
        build.log(f"creating {uri}")
        record = os.environ.get("FAKE_CREATES")
        if record:
            with open(record, "a") as f:
                f.write(f"{os.getpid()} {uri} start {time.time()}\n")
        async with build.limit("install"):
            build.log(f"installing {uri}")
            await asyncio.sleep(value["sleep"])
        if value["explode"]:
            raise ValueError("a bug in the plugin")
        (build.target / "payload").write_bytes(b"x" * value["bytes"])
        build.log(f"created {uri}")
        return int(value["bytes"])

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        ctx.env_vars[f"COUNTING_{value['name'].upper()}"] = ctx.resource_path(uris[0])


class OtherPlugin(CountingPlugin):
    """Like ``counting`` but another field, to see independent plugins overlap."""

    name = "other"
    priority = 30

    def uris(self, value: Any, spec: Any) -> list[str]:
        return [f"other://{value['name']}"]


class SlowSyncPlugin(RuntimeEnvPlugin):
    """A plugin written with plain functions: ``create`` sleeps (blocking) in a thread."""

    name = "slow_sync"

    def uris(self, value: Any, spec: Any) -> list[str]:
        return [f"slow://{value}"]

    def create(self, uri: str, value: Any, build: BuildContext) -> int:  # type: ignore[override]
        build.log("sleeping in a thread")
        time.sleep(float(value))
        (build.target / "done").write_text("ok")
        return 2

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        ctx.env_vars["SLOW_SYNC"] = "1"


class HangingPlugin(RuntimeEnvPlugin):
    """Starts a child that prints its pid and then hangs, as a stuck installer would."""

    name = "hanging"

    def uris(self, value: Any, spec: Any) -> list[str]:
        return [f"hang://{value}"]

    async def create(self, uri: str, value: Any, build: BuildContext) -> int:
        # The child starts a grandchild too: the whole process group must die.
        code = (
            "import os, subprocess, sys, time\n"
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            "print('pid', os.getpid(), 'grandchild', g.pid, flush=True)\n"
            "time.sleep(120)\n"
        )
        await build.run([sys.executable, "-c", code], what="hanging installer")
        return 0


class FailingPlugin(RuntimeEnvPlugin):
    """Fails while the file named by its value exists; output mimics an installer."""

    name = "failing"

    def uris(self, value: Any, spec: Any) -> list[str]:
        return [f"failing://{value}"]

    async def create(self, uri: str, value: Any, build: BuildContext) -> int:
        (build.target / "partial").write_text("half-built")
        code = (
            "import os, sys\n"
            f"print('Collecting thing')\n"
            f"if os.path.exists({value!r}):\n"
            "    print('ERROR: No matching distribution found for thing', flush=True)\n"
            "    sys.exit(1)\n"
        )
        await build.run([sys.executable, "-c", code], what="fake installer")
        return 1


class PrefixPlugin(RuntimeEnvPlugin):
    """Changes the command prefix: workers run under ``nice``, as a CPU-priority plugin would."""

    name = "nice"
    priority = 70

    def validate(self, value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise SpecError("", "expected an integer niceness")
        return value

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        ctx.command_prefix[:0] = ["nice", "-n", str(value)]


def pid_file(path: str | os.PathLike[str]) -> list[str]:
    return Path(path).read_text().splitlines() if Path(path).exists() else []
