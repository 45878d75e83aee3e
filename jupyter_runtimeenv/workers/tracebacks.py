"""Remote tracebacks that read like local ones.

cloudpickle replaces the filename of every function it pickles by value with
``<dynamic-code>`` (so payloads are deterministic), which leaves frames of notebook-defined
functions without a file or source line. Line numbers survive, and the driver still has the
function's code objects and, for notebook cells, their source in ``linecache`` (IPython
registers every cell there). ``code_files`` is taken at submit; ``restore_frames`` rewrites
the worker's traceback text when the error comes back. Called by the executor and by
``serialize.load_outcome``.
"""

from __future__ import annotations

import linecache
import re
import types
from collections.abc import Callable, Mapping
from typing import Any

_DYNAMIC_FRAME = re.compile(
    r'(?P<indent>\s*)File "<dynamic-code>", line (?P<line>\d+), in (?P<name>\S+)'
)


def code_files(function: Callable[..., Any]) -> dict[str, str]:
    """Name -> filename of ``function``'s code and the code nested in it (lambdas, inner
    functions, comprehensions)."""
    code = getattr(function, "__code__", None)
    files: dict[str, str] = {}
    stack = [code] if isinstance(code, types.CodeType) else []
    while stack:
        current = stack.pop()
        files.setdefault(current.co_name, current.co_filename)
        stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
    return files


def restore_frames(text: str, files: Mapping[str, str]) -> str:
    """``text`` with ``<dynamic-code>`` frames of known functions named by their real file,
    each followed by its source line when the driver has it."""
    if not files or "<dynamic-code>" not in text:
        return text
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        match = _DYNAMIC_FRAME.fullmatch(line.rstrip("\n"))
        filename = files.get(match.group("name")) if match else None
        if match is None or filename is None:
            out.append(line)
            continue
        indent, lineno, name = match.group("indent", "line", "name")
        out.append(f'{indent}File "{filename}", line {lineno}, in {name}\n')
        source = linecache.getline(filename, int(lineno)).strip()
        if source:
            out.append(f"{indent}  {source}\n")
    return "".join(out)
