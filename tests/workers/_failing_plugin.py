"""A real out-of-tree plugin whose build step runs a process that fails (exit code 3)."""

from __future__ import annotations

import sys
from typing import Any

from jupyter_runtimeenv.plugins import BuildContext, RuntimeEnvPlugin
from jupyter_runtimeenv.spec import RuntimeEnvSpec


class FailingPlugin(RuntimeEnvPlugin):
    name = "failing"

    def uris(self, value: Any, spec: RuntimeEnvSpec) -> list[str]:
        return ["failing://always"]

    async def create(self, uri: str, value: Any, build: BuildContext) -> int:
        code = "import sys; print('the failing step says no'); sys.exit(3)"
        await build.run([sys.executable, "-c", code], what="failing step")
        return 0
