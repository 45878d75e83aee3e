"""``driver_sys_path``: the notebook's ``sys.path`` entries, first on every worker's.

``true`` (the default on the kernel side) is resolved by the client to the driver's
``sys.path`` before the spec leaves the driver; the agent only ever sees a list or ``false``.
The worker adds the entries its interpreter does not already have, in the driver's order,
before any user import.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..context import ContextBuilder
from ..errors import SpecError
from ..spec.paths import resolve_path
from .base import RuntimeEnvPlugin


class DriverSysPathPlugin(RuntimeEnvPlugin):
    name = "driver_sys_path"
    priority = 90
    pure_context = True
    description = "true, false, or a list of directories to put first on workers' sys.path"

    def validate(self, value: Any) -> bool | list[str]:
        if isinstance(value, bool):
            return value
        if not isinstance(value, list):
            raise SpecError(
                "", f"expected true, false or a list of paths, got {type(value).__name__}"
            )
        paths: list[str] = []
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise SpecError(str(i), f"expected a path string, got {type(item).__name__}")
            # "" on sys.path means the cwd at start; keep the driver's meaning explicit.
            path = resolve_path(item) if item else os.getcwd()
            if path not in paths:
                paths.append(path)
        return paths

    def is_empty(self, value: Any) -> bool:
        return False  # [] means "none of the driver's paths", unlike the default (true)

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        if isinstance(value, list):
            ctx.driver_sys_path = list(value)
