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
#: Linux refuses to start a process with one "NAME=value" longer than this (MAX_ARG_STRLEN,
#: E2BIG), so a longer variable would make every worker start fail.
MAX_VARIABLE_BYTES = 128 * 1024 - 1
#: All variables together: they share the kernel's limit (ARG_MAX) with the inherited
#: environment and the command line.
MAX_TOTAL_BYTES = 1024 * 1024
MAX_NAME_CHARS = 1024


class EnvVarsPlugin(RuntimeEnvPlugin):
    name = "env_vars"
    priority = 60
    pure_context = True
    description = "environment variables: a mapping of names to string values"

    def validate(self, value: Any) -> dict[str, str]:
        if not isinstance(value, dict):
            raise SpecError("", f"expected a mapping of names to strings, got {_kind(value)}")
        total = 0
        for key, item in value.items():
            shown = str(key)[:80] or "''"
            if not isinstance(key, str) or len(key) > MAX_NAME_CHARS or not _NAME.fullmatch(key):
                raise SpecError(shown, "expected a variable name like MY_VAR")
            if not isinstance(item, str):
                raise SpecError(key, f"expected a string, got {_kind(item)}")
            if "\0" in item:
                raise SpecError(key, "a value cannot contain a NUL character")
            size = len(key.encode()) + 1 + len(item.encode("utf-8", "surrogatepass"))
            if size > MAX_VARIABLE_BYTES:
                raise SpecError(
                    key,
                    f"{key}=value is {size} bytes; a process cannot be started with a variable"
                    f" over {MAX_VARIABLE_BYTES} bytes (the kernel's limit, E2BIG)",
                )
            total += size + 1
        if total > MAX_TOTAL_BYTES:
            raise SpecError(
                "",
                f"the variables hold {total} bytes in all; at most {MAX_TOTAL_BYTES} are"
                " accepted (workers inherit them with the rest of the environment, within"
                " the kernel's limit for a new process)",
            )
        return dict(sorted(value.items()))

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        # ${VAR} refers to the value the environment had before (Ray's convention), so
        # {"PATH": "/opt/bin:${PATH}"} prepends. Kept as a template: expanded where a worker
        # starts (context.process_env), never here, in the agent's environment.
        for key, item in value.items():
            ctx.env_vars[key] = compose_template(item, ctx.env_vars)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
