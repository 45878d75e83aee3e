"""One limiter per agent: how many installs and downloads run at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

Kind = Literal["install", "download"]


class Limiter:
    def __init__(self, installs: int = 2, downloads: int = 4) -> None:
        if installs < 1 or downloads < 1:
            raise ValueError("limits must be at least 1")
        self.installs = installs
        self.downloads = downloads
        self._sems = {
            "install": asyncio.Semaphore(installs),
            "download": asyncio.Semaphore(downloads),
        }

    @asynccontextmanager
    async def limit(self, kind: Kind) -> AsyncIterator[None]:
        async with self._sems[kind]:
            yield
