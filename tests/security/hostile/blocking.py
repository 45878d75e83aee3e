"""A plugin whose ``validate`` blocks the way a read on a file system that does not answer
would (a dead network mount): it opens the FIFO named in its config for reading, which waits
for a writer. Only a server whose operator lists it in ``allowed_plugins`` loads it."""

from __future__ import annotations

from typing import Any

from jupyter_runtimeenv.plugins import RuntimeEnvPlugin
from tests.security.hostile import mark

mark("blocking")


class Blocking(RuntimeEnvPlugin):
    name = "blocking"

    def validate(self, value: Any) -> Any:
        with open(value["fifo"], "rb") as f:  # blocks until a writer opens the FIFO
            f.read()
        return value
