"""Real out-of-tree plugins for the cluster tests, imported by the node agents (by import path,
``tests.dask._node_plugins.<Class>``: the Dask workers inherit the test process's ``sys.path``).
"""

from __future__ import annotations

import sys
from typing import Any

from jupyter_runtimeenv.plugins import BuildContext, RuntimeEnvPlugin
from jupyter_runtimeenv.spec import RuntimeEnvSpec


class FailOnNode(RuntimeEnvPlugin):
    """Its step runs a process that prints a few lines; on the node whose cache root is
    named ``config["node"]`` the process then fails (exit code 3)."""

    name = "fail_on_node"

    def uris(self, value: Any, spec: RuntimeEnvSpec) -> list[str]:
        return [f"fail-on-node://{value.get('node')}/{value.get('salt', '')}"]

    async def create(self, uri: str, value: Any, build: BuildContext) -> int:
        fail = build.cache_root.name == value.get("node")
        code = (
            "import sys\n"
            "print('checking the node', flush=True)\n"
            f"print('this node says no', flush=True) if {fail} else None\n"
            f"sys.exit(3 if {fail} else 0)\n"
        )
        await build.run([sys.executable, "-c", code], what="node check")
        return 0
