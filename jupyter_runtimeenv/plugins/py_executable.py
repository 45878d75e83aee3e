"""``py_executable``: the interpreter workers start with: a path, a command on PATH, or (as
Ray's uv integration writes it) a command with arguments, ``"uv run --python 3.11 python"``.

A value with arguments is split like a shell would; its first word must resolve to an
executable now. Workers then start as ``<first word> <arguments...> <worker argv>``: the
words before the last go into the context's ``command_prefix``, the last is its ``python``.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Sequence
from typing import Any

from ..context import ContextBuilder
from ..errors import SpecError
from ..spec.paths import find_executable
from ..spec.policy import current_policy
from .base import RuntimeEnvPlugin

__all__ = ["PyExecutablePlugin", "split_command"]


def split_command(value: str) -> list[str]:
    """``value`` split like a shell; ``SpecError`` if it does not split."""
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise SpecError("", f"{value!r} cannot be split like a shell command: {exc}") from None
    if not words:
        raise SpecError("", f"expected a path or a command name, got {value!r}")
    return words


class PyExecutablePlugin(RuntimeEnvPlugin):
    name = "py_executable"
    # After the package plugins (which set their venv's python), so an explicit choice wins.
    priority = 40
    description = "the Python executable of workers: a path, a command on PATH, or a command line"

    def validate(self, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise SpecError("", f"expected a path or a command name, got {value!r}")
        whole = find_executable(value)
        if whole is not None:  # a path with spaces in it is still one path
            current_policy().check_executable(whole)
            return whole if os.sep in value else value
        words = split_command(value)
        first = words[0]
        found = find_executable(first)
        if found is None:
            raise SpecError("", f"{first!r} is not an executable file or a command on PATH")
        policy = current_policy()
        if len(words) > 1 and not policy.any_executable:
            raise SpecError(
                "",
                f"{value!r}: a command line is not accepted here, only the path or name of a"
                " Python interpreter",
            )
        policy.check_executable(found)
        # Keep the name the user gave when it is a command (PATH may differ per machine);
        # make paths absolute so that the env id does not depend on the caller's cwd.
        words[0] = found if os.sep in first else first
        return words[0] if len(words) == 1 else shlex.join(words)

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        ctx.spawn_only = True  # the user named how their Python starts: never a fork of it
        whole = shutil.which(value) if os.sep not in value else None
        if whole or os.path.isfile(value):
            ctx.python = whole or value
            return
        words = shlex.split(value)
        words[0] = shutil.which(words[0]) or words[0]
        ctx.command_prefix = [*words[:-1], *ctx.command_prefix]
        ctx.python = words[-1]
