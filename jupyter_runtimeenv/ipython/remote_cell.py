"""``%%remote``: run a cell's body in its env's remote namespace, as a local cell would run.

Who calls it: IPython, after ``%load_ext jupyter_runtimeenv`` registered ``RemoteCellMagics``.

The body goes through IPython's input transforms and is read here (``_remote_code``: a
syntax error shows as a local one, a magic a worker cannot run is refused naming it). It runs
in the env's *remote namespace* (``_remote_namespaces``): one per notebook and env, kept in
one worker of the env's pool for all the cells of that namespace (``Task.affinity``), so
names and imports of earlier remote cells are there; the notebook variables the cell reads
go with it unless a remote cell changed them last. ``--fresh`` starts the namespace over (in
a new worker), ``%remote --list`` shows each namespace and its worker.

What the cell prints and shows arrives while it runs, in order (``_remote_stream``): stdout
and stderr lines, ``display()`` outputs and figures as mime bundles made in the worker, so
the kernel needs neither the objects' classes nor matplotlib; figures left open show after
the cell's result, as the inline backend shows them. The last expression's value shows as
``Out[n]`` (a ``RemoteResult``: its rendering, never the value itself) unless the cell ends
with ``;``. ``--out`` names come back as values; one that cannot be unpickled here is named
with its cause and stays in the remote namespace, and the others are assigned. An exception
is raised as its own type with the remote traceback and the cell's own line numbers
(``Cell In[n]``); an interrupt or ``--timeout`` kills the worker, which takes the
namespace with it (said in the message).
"""

from __future__ import annotations

import builtins
import concurrent.futures
import json
import re
import secrets
import sys
from typing import Any

import cloudpickle
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from .. import _exc_state, api, session
from ..errors import (
    RemoteCellError,
    RemoteInterrupt,
    RemoteTaskError,
    RuntimeEnvError,
    SpecError,
    WorkerError,
)
from ..spec import RuntimeEnvSpec, parse, refresh
from ..workers.interrupt import interrupted
from ..workers.tracebacks import code_files, restore_frames
from . import (
    _cell_display,
    _cell_figures,
    _cell_handover,
    _cell_magics,
    _cell_runner,
    _cell_values,
    _remote_handover,
)
from ._magic_args import argument, magic_arguments, parse_argstring
from ._remote_code import (
    CellCode,
    CodeError,
    cell_frames,
    names_read,
    plain_syntax_error,
    prepare,
    shell_aliases,
    stateful,
)
from ._remote_fetch import bring_back
from ._remote_namespaces import RemoteNamespace, namespace_for, namespaces, track_local_cell
from ._remote_printers import kernel_printers
from ._remote_stream import cell_streams, figure_settings, kernel_style, publish, take_style
from ._remote_values import explain, load_all

__all__ = ["RemoteCellMagics", "RemoteResult", "names_read"]

# The runner goes by value: the env's interpreter need not have jupyter_runtimeenv.
for _module in (
    _cell_runner,
    _cell_values,
    _cell_display,
    _cell_figures,
    _cell_magics,
    _cell_handover,
    _exc_state,
):
    cloudpickle.register_pickle_by_value(_module)

#: The task name of a cell (its output lines are written without the task prefix).
TASK_NAME = _cell_runner.run_cell.__name__
#: IPython's own history names, never sent implicitly.
_HISTORY_NAME = re.compile(r"^(_+|_i+|_i?\d+|_(ih|oh|dh))$")
_NAME_IN_MESSAGE = re.compile(r"'([A-Za-z_][A-Za-z_0-9]*)'")


class RemoteResult:
    """The value of a ``%%remote`` cell's last expression, as shown: ``Out[n]`` holds this,
    its rendering in the worker (the value stays in the remote namespace as ``_``)."""

    def __init__(self, data: dict[str, Any], metadata: dict[str, Any]) -> None:
        self.data = data
        self.metadata = metadata

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        return self.data, self.metadata

    def __repr__(self) -> str:
        return str(self.data.get("text/plain", ""))


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
    """``%%remote`` (and ``%remote --list``/``--fresh``); one instance per IPython shell."""

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell, **kwargs)
        events = getattr(shell, "events", None)
        if events is not None and track_local_cell not in events.callbacks["post_run_cell"]:
            events.register("post_run_cell", track_local_cell)
        if events is not None and bring_back not in events.callbacks["pre_run_cell"]:
            events.register("pre_run_cell", bring_back)

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
    @argument(
        "--fresh",
        action="store_true",
        help="start the env's remote namespace over, in a new worker",
    )
    @argument("--list", action="store_true", help="show the remote namespaces and their workers")
    @line_cell_magic
    def remote(self, line: str, cell: str | None = None) -> Any:
        """Run the cell in its env's remote namespace; ``--out`` brings variables back."""
        try:
            args = parse_argstring(RemoteCellMagics.remote, line, "remote")
        except SystemExit:  # --help (printed) or a bad flag (IPython printed the usage)
            return None
        if args.list:
            self._list()
            return None
        if cell is None:
            if not args.fresh:
                raise UsageError("remote: %remote takes --list or --fresh; %%remote runs a cell")
            space, _ = self._namespace(args)
            self._fresh(space)
            return None
        outputs = _split_names(args.outputs, "--out")
        number = self._cell_number(cell)
        filename = self._cache("\n" + cell, number)
        transform = getattr(self.shell, "transform_cell", None)
        aliases = shell_aliases(self.shell)
        try:
            code = prepare(cell, filename, transform, frozenset(aliases))
        except SyntaxError:
            # As the body alone in a cell shows it: its own line numbers and file name.
            raise plain_syntax_error(self.shell, cell, number, transform).with_traceback(
                None
            ) from None
        except CodeError as exc:
            raise UsageError(f"remote: {exc}") from None
        shell: Any = self.shell
        for setting in code.inline_config:  # figure formats are the kernel's: set them there
            shell.run_line_magic("config", setting)
        space, spec = self._namespace(args)
        space.spec = spec
        executor = api._executor()
        sticky = getattr(executor, "keeps_affinity", False)
        if args.fresh:
            self._fresh(space)
        elif not space.held_by(executor):
            pass  # the session's executor changed: a new namespace, nothing to say
        elif sticky and space.cells and executor.affinity_pid(space.key) is None:
            # Its worker died (or was stopped) since the last cell: say so now, and send
            # this cell everything it reads.
            self._say_lost(space)
        nonce = secrets.token_hex(8)
        request: dict[str, Any] = {
            "source": code.source,
            "lines": "\n" + cell,
            "filename": filename,
            "outputs": outputs,
            "nonce": nonce,
            "quiet": code.quiet,
            "changes": code.changes,
            "colors": str(getattr(self.shell, "colors", "neutral")),
            "aliases": aliases,
        }
        extra: dict[str, Any] = {"affinity": space.key} if sticky else {}
        if args.files_out:
            extra["files_out"] = tuple(args.files_out)
        style = kernel_style()
        if space.seed:  # the names of the namespace this one replaced (_remote_handover)
            request["seed"], space.seed = space.seed, ""
        for _attempt in range(2):
            request["figures"] = figure_settings(self.shell)
            if style is not None and (style != space.style_sent or not sticky):
                request["figures"]["style"] = style  # the notebook's own, changed since
            printed, printers = kernel_printers(self.shell, space.printers_sent if sticky else None)
            if printers:  # changed since its worker took them (or no worker keeps them)
                request["printers"] = printers
            request["inputs"], files = self._inputs(args, code, space)
            request["namespace"] = {"key": space.key, "expected": space.expected()}
            if not sticky:  # each cell in a namespace of its own, dropped after it
                request["namespace"] = {"key": f"{space.key}:{space.cells}", "keep": False}
            try:
                result = self._submit(executor, request, spec, extra, args.timeout, space)
            finally:  # loaded (and removed) by the worker as the cell began, or never
                _remote_handover.dropped(request.pop("seed", ""))
            if not result.get("lost"):
                space.style_sent = style
                space.printers_sent = printed
                break
            # The worker died just before this cell reached it: nothing ran. Again, with
            # every name the cell reads.
            self._say_lost(space)
        try:
            return self._deliver(result, code, space, outputs, files)
        finally:
            if sticky:
                executor.label_affinity(space.key, f"%%remote namespace of {space.label}")

    def _submit(
        self,
        executor: Any,
        request: dict[str, Any],
        spec: RuntimeEnvSpec,
        extra: dict[str, Any],
        timeout: float | None,
        space: RemoteNamespace,
    ) -> dict[str, Any]:
        """Run the cell's task and wait for it; interrupts, timeouts and a dead worker
        become one line saying what was lost."""
        with cell_streams(request["nonce"], TASK_NAME) as (out, err):
            future = executor.submit(
                _cell_runner.run_cell, (request,), {}, runtime_env=spec, name=TASK_NAME, **extra
            )
        try:
            try:
                result: dict[str, Any] = future.result(timeout)
            finally:
                out.finish()
                err.finish()
                self._show_after_result(out.post)
        except KeyboardInterrupt as caught:
            # The task is cancelled (its worker killed); a KeyboardInterrupt, so that "run
            # all" stops here, shown as one line.
            cancelled = interrupted([future], caught).cancelled
            raise RemoteInterrupt(
                f"%%remote cell stopped; its worker was killed, and {space.lost()}", cancelled
            ) from None
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise UsageError(
                f"remote: the cell ran longer than --timeout {timeout:g} s; its worker"
                f" was killed, and {space.lost()}"
            ) from None
        except WorkerError as exc:
            raise UsageError(f"remote: {_first_line(exc)}; {space.lost()}") from None
        except RemoteTaskError:
            raise
        except RuntimeEnvError as exc:
            raise UsageError(f"remote: {_first_line(exc)}") from None
        return result

    @staticmethod
    def _say_lost(space: RemoteNamespace) -> None:
        print(
            f"%%remote: the worker of {space.label} is gone: {space.lost(keep_key=True)}",
            file=sys.stderr,
        )

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

    def _namespace(self, args: Any) -> tuple[RemoteNamespace, RuntimeEnvSpec]:
        """The env's spec and remote namespace; a namespace replaced because the env changed
        lets its worker go, and says so."""
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
            function = api.RemoteFunction(_cell_runner.run_cell, overrides, env_name=args.env)
            spec = function._effective_env()
        except SpecError as exc:
            raise UsageError(f"remote: --env: {exc.reason}") from None
        label = repr(args.env) if args.env else "the default env"
        if overrides is not None:
            label += f" with --runtime-env {overrides.canonical_json()}"
        # The local code as it is now (what the executor will run, a stat walk from the stat
        # cache): an edit to a module of the working_dir is another env, in another worker.
        current = refresh(spec)
        space, replaced = namespace_for(label, current.env_id, spec.env_id)
        if replaced is not None and replaced.owner is not None:
            told = _remote_handover.replace(api._executor(), replaced, space, spec.env_id)
            if told:
                print(
                    f"%%remote: {label} changed since its last remote cell {told}", file=sys.stderr
                )
        return space, spec

    def _fresh(self, space: RemoteNamespace) -> None:
        release = getattr(api._executor(), "release_affinity", None)
        if release is not None:
            release(space.key)
        space.renew()

    def _inputs(
        self, args: Any, code: CellCode, space: RemoteNamespace
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The notebook variables to send, pickled together (``_cell_values``: what they
        share stays shared), and the code files of the functions among them (to name their
        frames in a traceback)."""
        shell: Any = self.shell
        namespace: dict[str, Any] = shell.user_ns
        if args.inputs is not None:
            names = _split_names(args.inputs, "--in")
            for name in names:
                if name not in namespace:
                    raise UsageError(f"remote: --in {name}: the notebook has no variable {name!r}")
        else:
            hidden = getattr(self.shell, "user_ns_hidden", {})
            candidates = [
                n
                for n in code.reads
                if n in namespace
                and n not in hidden
                and not _HISTORY_NAME.match(n)
                and not (hasattr(builtins, n) and namespace[n] is getattr(builtins, n))
            ]
            names = space.to_send(candidates, namespace)
        inputs = _cell_values.dump({name: namespace[name] for name in names})
        for name, problem in inputs["problems"].items():
            if args.inputs is None and name not in code.needed:
                continue  # the cell binds it before it reads it: G = (...) of a generator
            hint = "" if args.inputs is not None else " (--in a,b chooses what is sent)"
            raise UsageError(
                f"remote: the variable {name!r} ({type(namespace[name]).__name__}) cannot be"
                f" pickled: {problem}{hint}"
            )
        files: dict[str, str] = {}
        for name in names:
            if callable(namespace[name]):
                files.update(code_files(namespace[name]))
        return inputs, files

    # -- after ---------------------------------------------------------------------------

    def _show_after_result(self, messages: list[dict[str, Any]]) -> None:
        """Figures the cell left open: shown once the kernel has shown its result."""
        events = getattr(self.shell, "events", None)
        if not messages:
            return
        if events is None:
            for message in messages:
                publish(message)
            return

        def show() -> None:
            events.unregister("post_execute", show)
            for message in messages:
                publish(message)

        events.register("post_execute", show)

    def _deliver(
        self,
        result: dict[str, Any],
        code: CellCode,
        space: RemoteNamespace,
        outputs: list[str],
        files: dict[str, str],
    ) -> Any:
        shell: Any = self.shell
        if result.get("style"):  # the settings the cell changed are the newest
            take_style(result["style"])
            space.style_sent = kernel_style()  # its worker has them
        drawn = [n for n in code.receivers if stateful(shell.user_ns.get(n))]
        changed = list(dict.fromkeys(result["changed"] + code.changes + drawn))
        error = result["error"]
        if error is not None:
            space.after_cell(result["namespace"], changed, shell.user_ns, {})
            raise self._remote_error(error, files, shell.user_ns)
        if result["missing"]:
            space.after_cell(result["namespace"], changed, shell.user_ns, {})
            names = ", ".join(repr(n) for n in result["missing"])
            raise UsageError(f"remote: --out: the cell did not define {names}")
        values, unloadable = load_all(result["outputs"])
        failed = [f"--out {name}: {unloadable[name]}" for name in outputs if name in unloadable]
        shell.push(values)
        space.after_cell(result["namespace"], changed, shell.user_ns, values)
        if failed:
            where = "they stay" if len(failed) > 1 else "it stays"
            raise UsageError(
                f"remote: {'; '.join(failed)} ({where} in the remote namespace: use"
                " it in the next %%remote cell)"
            )
        value = result["value"]
        return None if value is None else RemoteResult(value["data"], value["metadata"])

    def _remote_error(
        self, error: dict[str, Any], files: dict[str, str], user_ns: dict[str, Any]
    ) -> BaseException:
        cause, remote_type = _exc_state.rebuild(error.get("exception"), cloudpickle.loads)
        if error.get("input"):
            why = explain(cause or Exception(error["message"]), error.get("modules") or {}, "env")
            return UsageError(
                f"remote: the variable {error['input']!r} cannot be unpickled in the worker: {why}"
            )
        if isinstance(cause, NameError):
            name = getattr(cause, "name", None) or _quoted_name(str(cause))
            if name and name in user_ns:
                return UsageError(
                    f"remote: {name!r} is a notebook variable the cell did not send (its code"
                    f" names it only inside a string): add --in {name}"
                )
        text = cell_frames(self.shell, restore_frames(error["text"], files))
        return RemoteCellError.wrap("%%remote", text, cause, remote_type)

    def _list(self) -> None:
        spaces = namespaces()
        if not spaces:
            print("no remote namespaces yet (a %%remote cell starts one per env)")
            return
        for space in spaces:
            print(space.describe())


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _quoted_name(message: str) -> str | None:
    match = _NAME_IN_MESSAGE.search(message)
    return match.group(1) if match else None
