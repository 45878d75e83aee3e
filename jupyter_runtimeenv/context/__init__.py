"""What a process needs to start inside an environment, and how to start it."""

from __future__ import annotations

from .model import (
    SYS_PATH_VAR,
    ContextBuilder,
    EnvContext,
    compose,
    compose_template,
    expand,
    process_env,
)

__all__ = [
    "SYS_PATH_VAR",
    "ContextBuilder",
    "EnvContext",
    "compose",
    "compose_template",
    "expand",
    "process_env",
]
