"""Modules a hostile spec names as plugins. Each one leaves a marker file when it is imported
(in ``$JRE_HOSTILE_MARKERS``), so a test can prove that no import happened."""

from __future__ import annotations

import os
from pathlib import Path

MARKER_VAR = "JRE_HOSTILE_MARKERS"
PACKAGE = __name__


def mark(name: str) -> None:
    where = os.environ.get(MARKER_VAR)
    if where:
        (Path(where) / f"imported-{name}").write_text("imported\n")
