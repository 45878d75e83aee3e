"""A well-behaved plugin, importable by path: the embedded agent (the user's own process)
may use it; a request to the server may not unless the operator allows it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jupyter_runtimeenv.context import ContextBuilder
from jupyter_runtimeenv.errors import SpecError
from jupyter_runtimeenv.plugins import RuntimeEnvPlugin
from tests.security.hostile import mark

mark("friendly")


class Friendly(RuntimeEnvPlugin):
    name = "friendly"

    def validate(self, value: Any) -> str:
        if not isinstance(value, str):
            raise SpecError("", "expected a string")
        return value

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        ctx.env_vars["FRIENDLY"] = value
