"""Plugins the server tests name by import path in a spec's ``plugins`` field.

Real plugins: ``create`` runs a real subprocess through ``build.run`` (output streamed into the
log, killed on cancel). They build nothing useful, which keeps the API tests fast.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from jupyter_runtimeenv.context import ContextBuilder
from jupyter_runtimeenv.errors import SpecError
from jupyter_runtimeenv.plugins import BuildContext, RuntimeEnvPlugin

SCRIPT = "tests.server.plugins.ScriptPlugin"


class ScriptPlugin(RuntimeEnvPlugin):
    """``{"name": str, "lines": int, "sleep": float, "fail": bool}``: a child process prints
    ``lines`` lines, sleeping ``sleep`` seconds after each, and exits 1 if ``fail``."""

    name = "script"

    def validate(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            raise SpecError("name", "expected a mapping with a string 'name'")
        lines = value.get("lines", 3)
        if type(lines) is not int:  # bool is an int in Python, not in JSON
            raise SpecError("lines", "expected an integer")
        return {
            "name": value["name"],
            "lines": lines,
            "sleep": float(value.get("sleep", 0)),
            "fail": bool(value.get("fail", False)),
        }

    def uris(self, value: Any, spec: Any) -> list[str]:
        return [f"script://{value['name']}"]

    async def create(self, uri: str, value: Any, build: BuildContext) -> int:
        code = (
            "import sys, time\n"
            f"for i in range({value['lines']}):\n"
            "    print('script line', i, flush=True)\n"
            f"    time.sleep({value['sleep']})\n"
            f"sys.exit({1 if value['fail'] else 0})\n"
        )
        # The name as an argument: a test finds the build's process by its command line.
        await build.run([sys.executable, "-c", code, value["name"]], what="script")
        (build.target / "done").write_text("ok")
        return 2

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        ctx.env_vars[f"SCRIPT_{value['name'].upper()}"] = ctx.resource_path(uris[0])


def script(name: str, **options: Any) -> dict[str, Any]:
    """A spec using ``ScriptPlugin``."""
    return {"plugins": {SCRIPT: {"name": name, **options}}}
