"""``env_vars``: variables set in every process started in the environment.

``${NAME}`` in a value is expanded in the process that starts each worker (see
``context.process_env``), against its own environment.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..context import ContextBuilder, compose_template
from ..errors import SpecError
from .base import RuntimeEnvPlugin

# Full matches only: with re.match, "$" also matches before a final newline ("A\n").
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class EnvVarsPlugin(RuntimeEnvPlugin):
    name = "env_vars"
    priority = 60
    description = "environment variables: a mapping of names to string values"

    def validate(self, value: Any) -> dict[str, str]:
        if not isinstance(value, dict):
            raise SpecError("", f"expected a mapping of names to strings, got {_kind(value)}")
        for key, item in value.items():
            if not isinstance(key, str) or not _NAME.fullmatch(key):
                raise SpecError(str(key) or "''", "expected a variable name like MY_VAR")
            if not isinstance(item, str):
                raise SpecError(key, f"expected a string, got {_kind(item)}")
            if "\0" in item:
                raise SpecError(key, "a value cannot contain a NUL character")
        return dict(sorted(value.items()))

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        # ${VAR} refers to the value the environment had before (Ray's convention), so
        # {"PATH": "/opt/bin:${PATH}"} prepends. Kept as a template: expanded where a worker
        # starts (context.process_env), never here, in the agent's environment.
        for key, item in value.items():
            ctx.env_vars[key] = compose_template(item, ctx.env_vars)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
