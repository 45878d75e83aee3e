"""``driver_python``: the driver's interpreter, which environments are built on.

The driver (a kernel, a script) fills it in with its own ``sys.executable`` before the spec
leaves it, as it does for ``driver_sys_path``: an agent hosted by the Jupyter server may run
on another interpreter than a kernel, and a ``pip`` venv must layer over the kernel's
packages, not the server's. Workers of an env that installs nothing run on it. ``pip`` reads
it as the base of its venv; ``conda`` and ``py_executable`` override it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..context import ContextBuilder
from ..errors import SpecError
from ..spec.paths import find_executable
from ..spec.policy import current_policy
from .base import RuntimeEnvPlugin


class DriverPythonPlugin(RuntimeEnvPlugin):
    name = "driver_python"
    # First: every plugin that brings its own interpreter (pip 10, conda, py_executable 40)
    # overrides it.
    priority = 5
    pure_context = True
    description = "the driver's Python executable, which environments are layered over"

    def validate(self, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise SpecError("", f"expected the path of a Python executable, got {value!r}")
        path = find_executable(value)
        if path is None:
            raise SpecError("", f"{value!r} is not an executable file")
        current_policy().check_executable(
            path
        )  # the probe runs it: interpreters only, if untrusted
        return path

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        ctx.python = value
