"""The spec: parsing, the canonical form and env id, and merge rules."""

from __future__ import annotations

from .model import RuntimeEnvConfig, RuntimeEnvSpec
from .parse import load_spec_file, merge, parse, refresh
from .paths import resolve_path
from .policy import TRUSTED, SpecPolicy

__all__ = [
    "TRUSTED",
    "RuntimeEnvConfig",
    "RuntimeEnvSpec",
    "SpecPolicy",
    "load_spec_file",
    "merge",
    "parse",
    "refresh",
    "resolve_path",
]
