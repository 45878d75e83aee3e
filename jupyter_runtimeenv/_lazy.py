"""A package's public names imported on first use (PEP 562), so that importing the package
stays cheap: a worker's bootstrap or a kernel that needs one small module must not pay for the
rest (the agent's build machinery, the server's dependencies)."""

from __future__ import annotations

import importlib
import sys

TYPE_CHECKING = False  # typing and collections are not imported with the package (``cli``)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any


def exports(
    package: str, names: Mapping[str, str], public: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__``: ``names`` maps each lazy name to the
    submodule (relative to ``package``) that defines it; ``public`` is what ``dir()`` lists."""
    namespace = sys.modules[package].__dict__
    listed = sorted(public)

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value  # the next access does not come here
        return value

    def __dir__() -> list[str]:
        return listed

    return __getattr__, __dir__
