"""``py_executable``: the interpreter workers start with (a path, or a command on PATH)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from typing import Any

from ..context import ContextBuilder
from ..errors import SpecError
from ..spec.paths import find_executable
from .base import RuntimeEnvPlugin


class PyExecutablePlugin(RuntimeEnvPlugin):
    name = "py_executable"
    # After the package plugins (which set their venv's python), so an explicit choice wins.
    priority = 40
    description = "the Python executable of workers: a path or a command on PATH"

    def validate(self, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise SpecError("", f"expected a path or a command name, got {value!r}")
        found = find_executable(value)
        if found is None:
            raise SpecError("", f"{value!r} is not an executable file or a command on PATH")
        # Keep the name the user gave when it is a command (PATH may differ per machine);
        # make paths absolute so that the env id does not depend on the caller's cwd.
        return found if os.sep in value else value

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        ctx.python = shutil.which(value) or value
