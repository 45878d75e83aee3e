"""IPython's ``magic_arguments``, typed, and reading a magic's line.

Who calls it: every magic of the package (``%runtime_env`` in ``magics.py``, ``%%remote``
in ``remote_cell.py``, ``%driver_sys_path`` in ``sys_path.py``) to declare its flags and
parse its line. What it owns: the typed doors to IPython's untyped decorators (mypy stays
strict on the magics), shell-like word splitting, and ``--help`` as plain text.
"""

from __future__ import annotations

import shlex
import textwrap
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import IPython.core.magic_arguments as _untyped_magic_arguments
from IPython.core.error import UsageError

_F = TypeVar("_F", bound=Callable[..., Any])
# IPython's magic_arguments is untyped; these typed doors keep mypy strict on the magic.
_margs: Any = _untyped_magic_arguments


class _Decorator(Protocol):
    def __call__(self, function: _F, /) -> _F: ...


def magic_arguments() -> _Decorator:
    decorator: _Decorator = _margs.magic_arguments()
    return decorator


def argument(*args: Any, **kwargs: Any) -> _Decorator:
    decorator: _Decorator = _margs.argument(*args, **kwargs)
    return decorator


def parse_argstring(magic: Any, line: str, name: str = "runtime_env") -> Any:
    """Shell-like words (quotes removed, unlike IPython's ``arg_split``), then the flags.

    ``-h``/``--help`` prints the usage and raises ``SystemExit`` (IPython's magic parsers
    have no help flag of their own); a bad flag is a ``UsageError``.
    """
    try:
        words = shlex.split(line)
    except ValueError as exc:  # an unclosed quote
        raise UsageError(f"{name}: {exc}") from None
    if "-h" in words or "--help" in words:
        print(_plain_help(magic.parser.format_help()))
        raise SystemExit(0)
    return magic.parser.parse_args(words)


def _plain_help(text: str) -> str:
    """IPython's magic help is reStructuredText (a ``::`` line, double backquotes): plain it."""
    lines = text.strip("\n").splitlines()
    if lines and lines[0].strip() == "::":
        lines = lines[1:]
    return textwrap.dedent("\n".join(lines)).strip("\n").replace("``", "`")
