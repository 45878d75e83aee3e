"""A plugin class whose constructor needs arguments the loader cannot give."""

from __future__ import annotations

from jupyter_runtimeenv.plugins import RuntimeEnvPlugin
from tests.security.hostile import mark

mark("needs_args")


class NeedsArgs(RuntimeEnvPlugin):
    name = "needs_args"

    def __init__(self, required: str) -> None:
        self.required = required
