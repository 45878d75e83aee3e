"""The ``get_ipython()`` of a ``%%remote`` cell, in its worker: the magics a cell may use.

Shipped by value with the cell runner. The kernel runs IPython's input transforms on the
body (``%time x`` becomes ``get_ipython().run_line_magic('time', 'x')``, ``!ls`` becomes
``get_ipython().system('ls')``) and refuses, before sending, every magic not in
``LINE_MAGICS``/``CELL_MAGICS`` with one line naming it; this object runs the rest against
the cell's namespace, printing what IPython prints (``CPU times: ...``, ``... ± ... per
loop``). Anything else of a shell is an ``AttributeError`` that says where the cell runs.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import subprocess
import sys
import time
import timeit as _timeit
from collections.abc import Iterator
from typing import Any

LINE_MAGICS = frozenset({"time", "timeit", "matplotlib", "pwd"})
CELL_MAGICS = frozenset({"time", "timeit", "writefile", "file"})
#: Cell magics whose body is text, not code (no names are read from it).
TEXT_MAGICS = frozenset({"writefile", "file"})


def format_time(seconds: float, precision: int = 3) -> str:
    """IPython's ``_format_time``: ``1.23 ms``, ``4.5 µs``, ``2min 3s``."""
    if seconds >= 60.0:
        parts = [("d", 86400), ("h", 3600), ("min", 60), ("s", 1)]
        out, left = [], seconds
        for suffix, length in parts:
            value = int(left / length)
            if value > 0:
                left = left % length
                out.append(f"{value}{suffix}")
            if not left:
                break
        return " ".join(out)
    units = ["s", "ms", "\xb5s", "ns"]
    if hasattr(sys.stdout, "encoding") and sys.stdout.encoding:
        try:
            "\xb5".encode(sys.stdout.encoding)
        except Exception:
            units[2] = "us"
    order = min(-int(math.floor(math.log10(seconds)) // 3), 3) if seconds > 0 else 3
    return f"{seconds * 1000**order:.{precision}g} {units[order]}"


class RemoteShell:
    """What ``get_ipython()`` returns in a ``%%remote`` cell."""

    def __init__(
        self,
        namespace: dict[str, Any],
        filename: str,
        line_offset: int,
        colors: str = "neutral",
        aliases: dict[str, str] | None = None,
    ) -> None:
        self.user_ns = namespace
        self._filename = filename
        self._offset = line_offset  # the cell's line of the current statement, for %%time
        self._aliases = aliases or {}  # the kernel's shell aliases: name -> command
        #: The kernel's colour scheme (sympy's ``init_printing`` picks its formulas' colour
        #: from it).
        self.colors = colors

    @property
    def display_formatter(self) -> Any:
        """The worker's IPython formatter, which formats the cells' values: what a cell
        registers on it (``formatters['text/latex'].for_type(...)``, sympy's
        ``init_printing()``) shows in the next cells this worker runs, as in a kernel."""
        from ._cell_display import ipython_formatter

        formatter = ipython_formatter()
        if formatter is None:
            raise AttributeError(
                "get_ipython().display_formatter is not available in a %%remote cell whose"
                " environment has no IPython"
            )
        return formatter

    @contextlib.contextmanager
    def in_builtins(self) -> Iterator[None]:
        """``get_ipython`` in ``builtins`` while the cell runs, as IPython puts it there: code
        that calls it without importing it (sympy's ``init_printing``) finds this shell."""
        import builtins

        missing = object()
        before = getattr(builtins, "get_ipython", missing)
        builtins.get_ipython = lambda: self  # type: ignore[attr-defined]
        try:
            yield
        finally:
            if before is missing:
                del builtins.get_ipython  # type: ignore[attr-defined]
            else:
                builtins.get_ipython = before  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"get_ipython().{name} is not available in a %%remote cell: the cell runs in a"
            " worker of the environment, not in the kernel"
        )

    # -- what IPython's transforms call ------------------------------------------------

    def run_line_magic(self, name: str, line: str, _stack_depth: int = 1) -> Any:
        if name in self._aliases:
            return self._alias(self._aliases[name], self.var_expand(line))
        if name == "time":
            return self._time(line, line_mode=True)
        if name == "timeit":
            return self._timeit(line, "")
        if name == "matplotlib":
            choice = line.strip().split()[0] if line.strip() else "inline"
            if choice != "inline":
                raise ValueError(f"%matplotlib {choice}: a %%remote cell shows figures inline")
            from ._cell_figures import use_inline

            use_inline()
            return None
        if name == "pwd":
            return os.getcwd()
        if name == "config" and line.lstrip().startswith("InlineBackend."):
            return None  # applied by the kernel before it sent the cell
        raise ValueError(f"%{name} cannot run in a %%remote cell")

    def run_cell_magic(self, name: str, line: str, cell: str) -> Any:
        if name == "time":
            return self._time(cell, line_mode=False)
        if name == "timeit":
            return self._timeit(line, cell)
        if name in ("writefile", "file"):
            return self._writefile(self.var_expand(line), cell)
        raise ValueError(f"%%{name} cannot run in a %%remote cell")

    def _alias(self, command: str, rest: str) -> None:
        """IPython's ``Alias.__call__``: ``%l`` is the whole line, each ``%s`` a word of it,
        the words left after them; run as ``!cmd`` runs."""
        if "%l" in command:
            command, rest = command.replace("%l", rest), ""
        wanted = command.count("%s") - command.count("%%s")
        if wanted == 0:
            command = f"{command.replace('%%s', '%s')} {rest}"
        else:
            words = rest.split(None, wanted)
            if len(words) < wanted:
                raise ValueError(f"the alias {command!r} takes {wanted} arguments")
            command = f"{command % tuple(words[:wanted])} {' '.join(words[wanted:])}"
        self.system(command)

    @staticmethod
    def _writefile(line: str, cell: str) -> None:
        """IPython's ``%%writefile [-a] FILE``, in the worker's cwd (the env's copy of the
        working dir): ``Writing``/``Overwriting``/``Appending to`` as it prints them."""
        import shlex

        words = shlex.split(line)
        append = any(word in ("-a", "--append") for word in words)
        names = [word for word in words if word not in ("-a", "--append")]
        if len(names) != 1:
            raise ValueError(
                f"%%writefile {line.strip()}: give one file name"
                f" ({'none' if not names else ', '.join(names)} given)"
            )
        filename = os.path.expanduser(names[0])
        if os.path.exists(filename):
            print(f"{'Appending to' if append else 'Overwriting'} {filename}")
        else:
            print(f"Writing {filename}")
        with open(filename, "a" if append else "w", encoding="utf-8") as file:
            file.write(cell)

    def system(self, cmd: str) -> None:
        """``!cmd``: a shell runs it in the worker's cwd; its output streams into the cell."""
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        self.user_ns["_exit_code"] = _system(self.var_expand(cmd))

    def getoutput(self, cmd: str, split: bool = True, depth: int = 0) -> Any:
        """``x = !cmd``: its output lines (IPython's ``SList`` when the env has IPython)."""
        done = subprocess.run(
            self.var_expand(cmd), shell=True, capture_output=True, text=True, check=False
        )
        text = done.stdout + done.stderr
        if not split:
            return text
        lines = text.splitlines()
        try:
            from IPython.utils.text import SList
        except Exception:
            return lines
        return SList(lines)

    def var_expand(self, cmd: str, depth: int = 0) -> str:
        """``$name`` and ``{expression}`` in a shell command, as IPython expands them."""
        try:
            from IPython.utils.text import DollarFormatter
        except Exception:
            return cmd
        try:
            return str(DollarFormatter().vformat(cmd, args=[], kwargs=self.user_ns))
        except Exception:
            return cmd

    # -- %time and %timeit ---------------------------------------------------------------

    def _compile(self, source: str, mode: str) -> Any:
        padded = "\n" * self._offset + source  # tracebacks name the cell's own lines
        return compile(padded, self._filename, mode)

    def _time(self, source: str, line_mode: bool) -> Any:
        import ast

        tree = ast.parse(source)
        expression = line_mode and len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr)
        code = self._compile(source, "eval" if expression else "exec")
        wall0, cpu0 = time.time(), os.times()
        value = None
        try:
            if expression:
                value = eval(code, self.user_ns)
            else:
                exec(code, self.user_ns)
        finally:
            cpu1, wall1 = os.times(), time.time()
            user, sys_ = cpu1.user - cpu0.user, cpu1.system - cpu0.system
            print(
                f"CPU times: user {format_time(user)}, sys: {format_time(sys_)},"
                f" total: {format_time(user + sys_)}"
            )
            print(f"Wall time: {format_time(wall1 - wall0)}")
        return value

    def _timeit(self, line: str, cell: str) -> Any:
        options, statement = _timeit_options(line)
        setup = "pass"
        if cell:
            setup, statement = statement or "pass", cell
        timer = _timeit.Timer(statement, setup, globals=self.user_ns)
        number = int(options.get("n", 0))
        repeat = int(options.get("r", 7))
        precision = int(options.get("p", 3))
        if number == 0:
            for index in range(10):
                number = 10**index
                if timer.timeit(number) >= 0.2:
                    break
        runs = [dt / number for dt in timer.repeat(repeat, number)]
        mean = sum(runs) / len(runs)
        std = (sum((x - mean) ** 2 for x in runs) / len(runs)) ** 0.5
        if "q" not in options:
            loops = f"{number:,} loop{'s' if number != 1 else ''} each"
            runs_text = f"{repeat} run{'s' if repeat != 1 else ''}"
            if repeat == 1:
                print(f"{format_time(mean, precision)} per loop (mean of {runs_text}, {loops})")
            else:
                print(
                    f"{format_time(mean, precision)} ± {format_time(std, precision)} per loop"
                    f" (mean ± std. dev. of {runs_text}, {loops})"
                )
        if "o" in options:
            return {
                "loops": number,
                "repeat": repeat,
                "all_runs": runs,
                "average": mean,
                "stdev": std,
            }
        return None


def _timeit_options(line: str) -> tuple[dict[str, str], str]:
    """``-n N -r R -p P -q -o`` before the statement, as ``%timeit`` takes them."""
    options: dict[str, str] = {}
    rest = line.strip()
    while True:
        match = re.match(r"-([nrp])\s*(\d+)\s*|-([qo])\s+|-([qo])$", rest)
        if match is None:
            break
        if match.group(1):
            options[match.group(1)] = match.group(2)
        else:
            options[match.group(3) or match.group(4)] = ""
        rest = rest[match.end() :]
    return options, rest


def _timeit_result(loops: int, repeat: int, per_loop: list[float], precision: int) -> Any:
    """What ``%timeit -o`` returns: IPython's ``TimeitResult`` when the env has IPython."""
    try:
        from IPython.core.magics import execution
    except Exception:
        mean = sum(per_loop) / len(per_loop)
        return {"loops": loops, "repeat": repeat, "all_runs": per_loop, "average": mean}
    all_runs = [t * loops for t in per_loop]
    result: Any = execution.TimeitResult
    return result(loops, repeat, min(per_loop), max(per_loop), all_runs, 0.0, precision)


def _system(command: str) -> int:
    """Run ``command`` as IPython runs ``!cmd`` in a kernel (pexpect): the user's shell in a
    pseudo-terminal of 24 x 80, so its output and errors are one stream, lines end with
    ``\r\n``, and programs write as they do to a terminal (``ls`` in columns). Where no
    pseudo-terminal can be had, a plain shell with the worker's own streams."""
    import shutil

    try:
        import fcntl
        import pty
        import struct
        import termios

        master, slave = pty.openpty()
    except (ImportError, OSError):
        return subprocess.call(command, shell=True)
    shell = shutil.which(os.environ.get("SHELL") or "sh") or "/bin/sh"
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        child = subprocess.Popen(
            [shell, "-c", command],
            stdin=slave,
            stdout=slave,
            stderr=slave,  # in the worker's process group: it goes with the worker
        )
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal closed it
                break
            if not data:
                break
            sys.stdout.write(decoder.decode(data))
            sys.stdout.flush()
        sys.stdout.write(decoder.decode(b"", final=True))
        sys.stdout.flush()
    finally:
        os.close(master)
    return child.wait()
