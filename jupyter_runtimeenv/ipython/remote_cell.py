"""``%%remote``: run a cell's body in a worker of an environment.

Who calls it: IPython, after ``%load_ext jupyter_runtimeenv`` registered ``RemoteCellMagics``.

The body is parsed here (a syntax error is shown as a local one), the notebook names it
reads are found from its code (or named by ``--in``) and pickled one by one (an unpicklable
one is an error naming it), and ``_cell_runner.run_cell`` is submitted through the same
executor as ``@remote`` tasks, so the cell's worker lives in the env's pool. The worker's
stdout/stderr stream into the cell as they come (without the ``(task pid=N)`` prefix tasks
get); ``display()`` calls and the last expression's value come back at the end, pickled,
or as their ``repr`` when they cannot be. ``--out`` names are assigned in the notebook.

An exception shows the remote traceback with the cell's own line numbers (``Cell In[n]``);
an interrupt cancels the task, which kills its worker (``RemoteFuture.cancel``).
"""

from __future__ import annotations

import ast
import builtins
import concurrent.futures
import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import cloudpickle
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class

from .. import _exc_state, api, session
from ..errors import RemoteInterrupt, RemoteTaskError, RuntimeEnvError, SpecError
from ..spec import parse
from ..workers.interrupt import interrupted
from ..workers.tracebacks import code_files, restore_frames
from . import _cell_runner
from .magics import argument, magic_arguments, parse_argstring

__all__ = ["RemoteCellMagics", "names_read"]

# The runner goes by value: the env's interpreter need not have jupyter_runtimeenv.
cloudpickle.register_pickle_by_value(_cell_runner)
cloudpickle.register_pickle_by_value(_exc_state)

#: The task name of a cell (its output lines are written without the task prefix).
TASK_NAME = _cell_runner.run_cell.__name__
#: IPython's own history names, never sent implicitly.
_HISTORY_NAME = re.compile(r"^(_+|_i+|_i?\d+|_(ih|oh|dh))$")


def names_read(tree: ast.AST) -> list[str]:
    """Every name the code loads (at any depth), in order of first appearance."""
    loads = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    loads.sort(key=lambda n: (n.lineno, n.col_offset))
    return list(dict.fromkeys(n.id for n in loads))


def _split_names(value: str | None, flag: str) -> list[str]:
    if not value:
        return []
    names = [n.strip() for n in value.split(",") if n.strip()]
    for name in names:
        if not name.isidentifier():
            raise UsageError(f"remote: {flag}: {name!r} is not a variable name")
    return names


@magics_class
class RemoteCellMagics(Magics):
    """The ``%%remote`` cell magic; one instance per IPython shell."""

    @magic_arguments()
    @argument(
        "--env", metavar="NAME", help="a named env (%%runtime_env --name); default: the default env"
    )
    @argument("--runtime-env", metavar="JSON", help="a spec merged over the env, as JSON")
    @argument(
        "--in",
        dest="inputs",
        metavar="a,b",
        help="the notebook variables to send (default: those the cell reads)",
    )
    @argument(
        "--out", dest="outputs", metavar="x,y", help="variables to bring back into the notebook"
    )
    @argument(
        "--timeout", type=float, metavar="S", help="stop the cell (kill its worker) after S seconds"
    )
    @argument(
        "--files-out",
        dest="files_out",
        metavar="PATTERN",
        action="append",
        help="copy the files the cell writes in its working dir that match PATTERN"
        " (gitignore-style: *.csv, out/) beside the notebook; may be repeated",
    )
    @cell_magic
    def remote(self, line: str, cell: str) -> Any:
        """Run the cell in a worker of an environment; ``--out`` brings variables back."""
        try:
            args = parse_argstring(RemoteCellMagics.remote, line, "remote")
        except SystemExit:  # --help (printed) or a bad flag (IPython printed the usage)
            return None
        outputs = _split_names(args.outputs, "--out")
        source = "\n" + cell  # line 1 of the cell is the %%remote line
        number = self._cell_number(cell)
        filename = self._cache(source, number)
        tree = ast.parse(source, filename)  # a SyntaxError shows as a local one
        function = self._function(args)
        inputs, files = self._inputs(args, tree)
        with _unprefixed():
            future = function.remote(source, filename, inputs, outputs)
        try:
            result: dict[str, Any] = future.result(args.timeout)
        except KeyboardInterrupt as caught:
            # The task is cancelled (its worker killed); a KeyboardInterrupt, so that "run
            # all" stops here, shown as one line.
            cancelled = interrupted([future], caught).cancelled
            raise RemoteInterrupt(
                "%%remote cell stopped; its worker was killed", cancelled
            ) from None
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise UsageError(
                f"remote: the cell ran longer than --timeout {args.timeout:g} s;"
                " its worker was killed"
            ) from None
        except RemoteTaskError:
            raise
        except RuntimeEnvError as exc:
            raise UsageError(f"remote: {_first_line(exc)}") from None
        return self._deliver(result, outputs, files)

    # -- before --------------------------------------------------------------------------

    def _cell_number(self, cell: str) -> int:
        """The ``n`` of ``In[n]`` of the running cell: IPython counts a cell that goes into
        the history before running it, so the count is one ahead then."""
        shell: Any = self.shell
        count = int(getattr(shell, "execution_count", 0) or 0)
        history = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None)
        stored = count > 0 and history is not None and len(history) == count
        if stored and cell.strip() in str(history[count - 1]):  # type: ignore[index]
            return count - 1
        return count

    def _cache(self, source: str, number: int) -> str:
        """Register the cell's source like IPython does (tracebacks, ``Cell In[n]``)."""
        compiler = getattr(self.shell, "compile", None)
        if compiler is not None and hasattr(compiler, "cache"):
            return str(compiler.cache(source, number, raw_code=f"%%remote\n{source}"))
        return f"<remote-cell-{number}>"

    def _function(self, args: Any) -> api.RemoteFunction[Any, Any]:
        overrides = None
        if args.runtime_env:
            try:
                data = json.loads(args.runtime_env)
            except ValueError as exc:
                raise UsageError(f"remote: --runtime-env is not JSON: {exc}") from None
            try:
                overrides = parse(data)
            except SpecError as exc:
                raise UsageError(f"remote: invalid --runtime-env: {_first_line(exc)}") from None
        try:
            if args.env:
                session.lookup(args.env)  # an unknown name fails here, naming the declared ones
            return api.RemoteFunction(
                _cell_runner.run_cell,
                overrides,
                env_name=args.env,
                files_out=args.files_out or (),
            )
        except SpecError as exc:
            raise UsageError(f"remote: --env: {exc.reason}") from None

    def _inputs(self, args: Any, tree: ast.AST) -> tuple[dict[str, bytes], dict[str, str]]:
        """The pickled notebook variables to send, and the code files of the functions
        among them (to name their frames in a traceback)."""
        shell: Any = self.shell
        namespace: dict[str, Any] = shell.user_ns
        if args.inputs is not None:
            names = _split_names(args.inputs, "--in")
            for name in names:
                if name not in namespace:
                    raise UsageError(f"remote: --in {name}: the notebook has no variable {name!r}")
        else:
            hidden = getattr(self.shell, "user_ns_hidden", {})
            names = [
                n
                for n in names_read(tree)
                if n in namespace
                and n not in hidden
                and not _HISTORY_NAME.match(n)
                and not (hasattr(builtins, n) and namespace[n] is getattr(builtins, n))
            ]
        inputs: dict[str, bytes] = {}
        files: dict[str, str] = {}
        for name in names:
            value = namespace[name]
            try:
                inputs[name] = cloudpickle.dumps(value, protocol=5)
            except Exception as exc:
                hint = "" if args.inputs is not None else " (--in a,b chooses what is sent)"
                raise UsageError(
                    f"remote: the variable {name!r} ({type(value).__name__}) cannot be"
                    f" pickled: {type(exc).__name__}: {exc}{hint}"
                ) from None
            if callable(value):
                files.update(code_files(value))
        return inputs, files

    # -- after ---------------------------------------------------------------------------

    def _deliver(self, result: dict[str, Any], outputs: list[str], files: dict[str, str]) -> Any:
        import IPython.display

        display: Any = IPython.display.display  # untyped
        for item in result["displays"]:
            display(_load(item))
        error = result["error"]
        if error is not None:
            raise self._remote_error(error, files)
        if result["missing"]:
            names = ", ".join(repr(n) for n in result["missing"])
            raise UsageError(f"remote: --out: the cell did not define {names}")
        values = {name: _load(item) for name, item in result["outputs"].items()}
        for name in outputs:
            if isinstance(values[name], _Repr):
                raise UsageError(
                    f"remote: --out {name}: its value cannot be pickled"
                    f" (in the worker or here): {values[name]}"
                )
        shell: Any = self.shell
        shell.push(values)
        return None if result["value"] is None else _load(result["value"])

    def _remote_error(self, error: dict[str, Any], files: dict[str, str]) -> BaseException:
        cause, remote_type = _exc_state.rebuild(error.get("exception"), cloudpickle.loads)
        text = self._cells(restore_frames(error["text"], files))
        if error.get("input"):
            return UsageError(
                f"remote: the variable {error['input']!r} cannot be unpickled in the worker:"
                f" {error['type']}: {error['message']}"
            )
        return RemoteTaskError.wrap("%%remote", text, cause, remote_type)

    def _cells(self, text: str) -> str:
        """``File "<cell file>", line k, in f`` lines as IPython names cells: ``Cell In[n]``."""
        compiler = getattr(self.shell, "compile", None)
        names: dict[str, int] = getattr(compiler, "_filename_map", {}) or {}
        if not names:
            return text

        def rename(match: re.Match[str]) -> str:
            number = names.get(match.group("file"))
            if number is None:
                return match.group(0)
            where = match.group("name")
            tail = "" if where == "<module>" else f", in {where}"
            return f"{match.group('indent')}Cell In[{number}], line {match.group('line')}{tail}"

        return _FRAME.sub(rename, text)


_FRAME = re.compile(
    r'^(?P<indent>[ \t]*)File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)$',
    re.MULTILINE,
)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


class _Repr:
    """A value that came back as its ``repr`` only."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __str__(self) -> str:
        return self.text


def _load(item: dict[str, Any]) -> Any:
    blob = item.get("pickle")
    if blob is not None:
        try:
            return cloudpickle.loads(blob)
        except Exception:  # e.g. its class lives in a module only the worker has
            pass
    return _Repr(str(item.get("repr", "")))


class _Unprefixed:
    """A stream that drops the ``(run_cell pid=N) `` prefix of forwarded worker lines (and
    ``(run_cell node=H:P pid=N) `` of a Dask node's), also where a ``\\r`` rewrites a line."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        # "(run_cell) " too: the line telling the files the cell wrote (workers/files.py).
        self._prefix = re.compile(
            rf"(^|\r)\({TASK_NAME}(?: node=\S+)?(?: pid=\d+)?\) ", re.MULTILINE
        )

    def write(self, text: str) -> int:
        return self._stream.write(self._prefix.sub(r"\1", text))

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def _unprefixed() -> Iterator[None]:
    """While a cell's task is submitted, ``sys.stdout``/``stderr`` are wrapped: the task's
    output target captures them there (``OutputTarget.capture``)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Unprefixed(saved[0]), _Unprefixed(saved[1])
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
