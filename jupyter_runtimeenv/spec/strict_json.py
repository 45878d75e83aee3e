"""JSON as the standard defines it, in both directions.

Python's ``json`` accepts and writes ``NaN`` and ``Infinity`` (not JSON), turns ``1e400`` into
``inf``, and raises ``RecursionError`` (not ``ValueError``) on deep nesting. Specs come in
through ``loads_strict`` (REST bodies, inline JSON on the command line, ``.json`` spec files)
and answers go out through ``dumps_strict``.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["dumps_strict", "loads_strict"]


def loads_strict(raw: str | bytes) -> Any:
    """The value of ``raw``; ``ValueError`` for ``NaN``/``Infinity``, for numbers that do not
    fit a float (``1e400``) and for nesting past the recursion limit."""
    try:
        return json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def dumps_strict(data: Any, **options: Any) -> str:
    """``data`` as JSON; ``ValueError`` rather than writing ``NaN`` or ``Infinity``."""
    return json.dumps(data, allow_nan=False, **options)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value
