"""The spec: parsing, the canonical form and env id, and merge rules."""

from __future__ import annotations

from .model import RuntimeEnvConfig, RuntimeEnvSpec
from .parse import load_spec_file, merge, parse
from .paths import resolve_path

__all__ = ["RuntimeEnvConfig", "RuntimeEnvSpec", "load_spec_file", "merge", "parse", "resolve_path"]
