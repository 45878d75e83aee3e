"""Two out-of-tree runtime env plugins, used by ``plugins.ipynb`` by import path.

A spec names them in its ``plugins`` field, with their config as the value::

    plugins:
      nb_plugins.LowPriority: {niceness: 10}
      nb_plugins.InjectVars: {STAGE: demo}

Neither builds anything (no ``uris``): they only change the context workers start in.
"""

from __future__ import annotations

import getpass
import platform
from collections.abc import Sequence
from typing import Any

from jupyter_runtimeenv import RuntimeEnvPlugin, SpecError
from jupyter_runtimeenv.context import ContextBuilder


class LowPriority(RuntimeEnvPlugin):
    """Workers run at a lower CPU priority: ``nice -n N`` goes before their interpreter."""

    name = "nb_plugins.LowPriority"
    # Last: whatever prefix other plugins set, nice runs it.
    priority = 90

    def validate(self, value: Any) -> dict[str, int]:
        if not isinstance(value, dict) or set(value) - {"niceness"}:
            raise SpecError("", "expected {niceness: N}")
        niceness = value.get("niceness", 10)
        if not isinstance(niceness, int) or not 1 <= niceness <= 19:
            raise SpecError("niceness", f"expected an integer from 1 to 19, got {niceness!r}")
        return {"niceness": niceness}

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        ctx.command_prefix[:0] = ["nice", "-n", str(value["niceness"])]


class InjectVars(RuntimeEnvPlugin):
    """Environment variables from the config, plus who built the env and where."""

    name = "nb_plugins.InjectVars"

    def validate(self, value: Any) -> dict[str, str]:
        if not isinstance(value, dict):
            raise SpecError("", f"expected a mapping of variables, got {type(value).__name__}")
        for key, item in value.items():
            if not isinstance(item, str):
                raise SpecError(str(key), f"expected a string, got {type(item).__name__}")
        return dict(value)

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        ctx.env_vars.update(value)
        ctx.env_vars["BUILT_BY"] = f"{getpass.getuser()}@{platform.node()}"
