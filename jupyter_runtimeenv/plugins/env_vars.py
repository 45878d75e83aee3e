"""``env_vars``: variables set in every process started in the environment."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..context import ContextBuilder
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
        # {"PATH": "/opt/bin:${PATH}"} prepends.
        for key, item in value.items():
            ctx.env_vars[key] = _expand(item, ctx.env_vars)


def _expand(value: str, current: dict[str, str]) -> str:
    import os

    def repl(match: re.Match[str]) -> str:
        name = match.group(1)
        return current.get(name, os.environ.get(name, ""))

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", repl, value)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
