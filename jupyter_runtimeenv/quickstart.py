"""``python -m jupyter_runtimeenv.quickstart`` (what ``./dev quickstart`` runs).

Executes ``notebooks/quickstart.ipynb`` headless, end to end, in a ``python3`` kernel of the
interpreter running this module (not whatever ``python3`` kernelspec a user installed), with
the notebooks directory as the kernel's cwd so the notebook's relative paths work. The
notebook in the checkout is never written: a copy is executed and saved to a temp dir.
Prints each code cell's first source line and its text outputs, then one summary line;
exits 1 with the failing cell's error if a cell fails.

It needs a source checkout (the notebook lives next to the package, not in the wheel) and
nbclient/nbformat, which the ``test`` extra installs (``./dev`` installs ``.[test]``).
The environments go to the user's normal cache unless ``--cache-dir`` says otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["default_notebook", "main", "text_outputs"]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_BUILT = re.compile(r"runtime env ([0-9a-f]{12}) ready")


def default_notebook() -> Path:
    """``notebooks/quickstart.ipynb`` of the source checkout this package was imported from."""
    return Path(__file__).resolve().parent.parent / "notebooks" / "quickstart.ipynb"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jupyter_runtimeenv.quickstart",
        description="Run the quickstart notebook headless and print what it did.",
    )
    parser.add_argument(
        "--notebook", type=Path, default=None, help="the notebook (default: the checkout's)"
    )
    parser.add_argument(
        "--cache-dir",
        default=None,
        help="the environments' cache root (default: $JUPYTER_RUNTIMEENV_CACHE, else the"
        " user's cache dir)",
    )
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="seconds allowed per cell (default 900)"
    )
    return parser


def text_outputs(cell: Any) -> list[str]:
    """The text a code cell produced: streams, plain-text results and error lines.

    Consecutive outputs of one stream are joined first: a kernel flushes a stream on a
    timer, so one printed line may arrive as two outputs.
    """
    lines: list[str] = []
    stream: tuple[str, str] | None = None  # (name, text) of the stream being joined
    for output in cell.get("outputs", []):
        kind = output.get("output_type")
        if kind == "stream":
            name, text = str(output.get("name", "")), str(output.get("text", ""))
            if stream is not None and stream[0] == name:
                stream = (name, stream[1] + text)
                continue
            if stream is not None:
                lines.extend(_lines(stream[1]))
            stream = (name, text)
            continue
        if kind in ("execute_result", "display_data"):
            text = str(output.get("data", {}).get("text/plain", ""))
        elif kind == "error":
            text = f"{output.get('ename')}: {output.get('evalue')}"
        else:
            continue
        if stream is not None:
            lines.extend(_lines(stream[1]))
            stream = None
        lines.extend(_lines(text))
    if stream is not None:
        lines.extend(_lines(stream[1]))
    return lines


def _lines(text: str) -> list[str]:
    return _ANSI.sub("", text).rstrip("\n").splitlines()


def _first_line(cell: Any) -> str:
    lines = str(cell.get("source", "")).strip().splitlines()
    return lines[0] if lines else ""


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    notebook: Path = args.notebook or default_notebook()
    if not notebook.is_file():
        print(
            f"quickstart: no notebook at {notebook}; the quickstart runs from a source checkout"
            " of jupyter-runtimeenv (or pass --notebook PATH)",
            file=sys.stderr,
        )
        return 2
    try:
        import nbformat as _nbformat
        from jupyter_client.kernelspec import KernelSpecManager
        from jupyter_client.manager import KernelManager
        from nbclient import NotebookClient
        from nbclient.exceptions import CellExecutionError
    except ImportError as exc:
        print(
            f"quickstart: {exc.name} is missing; install the test extra: pip install -e '.[test]'",
            file=sys.stderr,
        )
        return 2
    nbformat: Any = _nbformat  # untyped

    # The kernel inherits this environment: our cache, and the embedded agent (a server
    # that started this process must not lend the kernel its agent).
    if args.cache_dir:
        os.environ["JUPYTER_RUNTIMEENV_CACHE"] = os.path.abspath(args.cache_dir)
    os.environ.pop("JUPYTER_RUNTIMEENV_URL", None)
    os.environ.pop("JUPYTER_RUNTIMEENV_TOKEN", None)

    workdir = Path(tempfile.mkdtemp(prefix="jre-quickstart-"))
    copy = workdir / notebook.name
    nb = nbformat.read(notebook, as_version=4)
    nbformat.write(nb, copy)
    print(f"quickstart: running {notebook} (copy in {workdir})", flush=True)

    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    # No kernel dirs: "python3" is ipykernel's native spec, i.e. this very interpreter.
    km = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    done: list[int] = []
    current: list[Any] = []

    def on_cell_start(cell: Any, cell_index: int) -> None:
        current[:] = [cell]

    def on_cell_executed(cell: Any, cell_index: int, execute_reply: Any) -> None:
        if cell.cell_type != "code":
            return
        done.append(cell_index)
        print(f"[{len(done)}/{len(code_cells)}] {_first_line(cell)}", flush=True)
        for line in text_outputs(cell):
            print(f"    {line}", flush=True)

    client = NotebookClient(
        nb,
        km=km,
        timeout=args.timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(notebook.parent.resolve())}},
        on_cell_start=on_cell_start,
        on_cell_executed=on_cell_executed,
    )
    started = time.perf_counter()
    kernel_log = workdir / "kernel.log"
    try:
        # The kernel's own stderr (not the cells' output, which comes over iopub) goes to a log.
        with open(kernel_log, "wb") as log:
            client.execute(stderr=log)
    except CellExecutionError as exc:
        where = _first_line(current[0]) if current else "?"
        print(f"quickstart: FAILED in the cell starting {where!r}", file=sys.stderr)
        print(_ANSI.sub("", str(exc)).rstrip(), file=sys.stderr)
        print(f"(kernel log: {kernel_log})", file=sys.stderr)
        return 1
    finally:
        nbformat.write(nb, copy)
    elapsed = time.perf_counter() - started
    built = sorted({m.group(1) for c in code_cells for m in _BUILT.finditer(_all_text(c))})
    print(
        f"quickstart: OK, {len(code_cells)} code cells run in {elapsed:.1f} s;"
        f" envs built: {', '.join(built) or 'none'}; executed copy: {copy}"
    )
    return 0


def _all_text(cell: Any) -> str:
    return "\n".join(text_outputs(cell))


if __name__ == "__main__":
    sys.exit(main())
