"""``%%remote`` in IPython's real shell, with real workers of a real embedded agent.

Inputs found from the code or named by ``--in``, ``--out``, rich results, errors naming
what is wrong (one line, the default unchanged), remote tracebacks as ``Cell In[n]``. The
live output and the interrupt are tested in a real kernel (``test_remote_kernel.py``).
"""

from __future__ import annotations

import ast
import os
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

from jupyter_runtimeenv.ipython.remote_cell import RemoteResult, names_read


def run(shell: InteractiveShell, source: str) -> Any:
    return shell.run_cell(source)


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.out + captured.err
    return lines[0]


def test_names_read_from_the_code() -> None:
    tree = ast.parse("y = f(a) + b.c\ndef g():\n    return h\n[k for k in z]")
    assert names_read(tree) == ["f", "a", "b", "h", "k", "z"]


def test_inputs_found_from_the_code_and_outputs_brought_back(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(shell, "base = 20\ndef add(x):\n    return x + base\nunused = object()")
    result = run(
        shell,
        "%%remote --out total,where\nimport os\ntotal = add(2)\nwhere = os.getpid()\n",
    )
    assert result.success, result.error_in_exec
    assert shell.user_ns["total"] == 22
    assert shell.user_ns["where"] != os.getpid()  # it ran in a worker


def test_the_last_expression_is_the_cells_value_and_display_shows(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run(shell, "%%remote\ndisplay({'shown': 1})\nprint('printed')\n6 * 7")
    assert result.success
    # What shows as Out[n] is the value's rendering; the value stays remote (as ``_``).
    assert isinstance(result.result, RemoteResult)
    assert result.result.data == {"text/plain": "42"}
    out = capsys.readouterr().out
    assert "{'shown': 1}" in out
    assert "printed\n" in out
    assert "pid=" not in out  # a cell's lines come without the task prefix


def test_an_unpicklable_value_shows_as_it_would_locally(shell: InteractiveShell) -> None:
    result = run(shell, "%%remote\nimport threading\nthreading.Lock()")
    assert result.success
    assert repr(result.result).startswith("<unlocked _thread.lock object")


def test_a_value_the_cell_binds_before_reading_it_need_not_cross(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    """Whirlwind 12 (mixed): ``G = (n ** 2 for n in ...)`` in a notebook cell, then a
    remote cell that makes its own ``G`` before it reads it was refused (the notebook's
    generator cannot be pickled); one that reads the notebook's is still told so."""
    run(shell, "squares = (n ** 2 for n in range(3))")
    capsys.readouterr()
    result = run(shell, "%%remote\nsquares = (n ** 2 for n in range(4))\nlist(squares)")
    assert result.success, result.error_in_exec
    assert repr(result.result) == "[0, 1, 4, 9]"
    run(shell, "squares = (n ** 2 for n in range(3))")
    run(shell, "%%remote\nlist(squares)")
    line = one_error_line(capsys)
    assert line.startswith("UsageError: remote: the variable 'squares' (generator) cannot be")


def test_explicit_inputs_only(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    run(shell, "import threading\nlock = threading.Lock()\nsmall = 3")
    run(shell, "%%remote\nlock")
    line = one_error_line(capsys)
    assert line.startswith("UsageError: remote: the variable 'lock' (lock) cannot be pickled")
    assert "--in" in line

    # --in sends only what it names: the lock is not read by this body anyway.
    result = run(shell, "%%remote --in small --out doubled\ndoubled = small * 2")
    assert result.success
    assert shell.user_ns["doubled"] == 6

    run(shell, "%%remote --in nothing_here\n1")
    assert "the notebook has no variable 'nothing_here'" in one_error_line(capsys)


def test_an_out_name_the_cell_did_not_define(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.user_ns.pop("never", None)
    run(shell, "%%remote --out defined,never\ndefined = 1")
    assert one_error_line(capsys) == "UsageError: remote: --out: the cell did not define 'never'"
    assert "never" not in shell.user_ns


def test_a_remote_exception_shows_the_cells_own_lines(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_cell("def inverse(x):\n    return 1 / x", store_history=True)
    number = shell.execution_count
    result = shell.run_cell("%%remote\nvalue = 0\ninverse(value)", store_history=True)
    assert isinstance(result.error_in_exec, ZeroDivisionError)  # the original type, too
    captured = capsys.readouterr()
    err = captured.err + captured.out
    assert f"Cell In[{number}], line 3" in err  # the %%remote line is line 1
    assert "    inverse(value)" in err
    assert f"Cell In[{number - 1}], line 2, in inverse" in err  # the function's own cell
    assert "ZeroDivisionError: division by zero" in err
    assert "_cell_runner" not in err
    assert "<dynamic-code>" not in err


def test_a_syntax_error_is_shown_locally(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run(shell, "%%remote\nx = (")
    assert isinstance(result.error_in_exec, SyntaxError)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--env nowhere", "UsageError: remote: --env: no environment named 'nowhere'"),
        ("--runtime-env '{bad'", "UsageError: remote: --runtime-env is not JSON:"),
        (
            """--runtime-env '{"env_vars": {"A": 1}}'""",
            "UsageError: remote: invalid --runtime-env: env_vars.A: expected a string",
        ),
        ("--out 'not a name'", "UsageError: remote: --out: 'not a name' is not a variable name"),
        ("--bogus", "UsageError: unrecognized arguments: --bogus"),
    ],
)
def test_bad_flags_are_one_line(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], line: str, message: str
) -> None:
    run(shell, f"%%remote {line}\n1")
    assert one_error_line(capsys).startswith(message)


def test_runtime_env_json_and_a_named_env(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(shell, "%runtime_env --env-var WHO=default --no-eager-install")
    run(shell, "%runtime_env --name other --env-var WHO=other --env-var ONLY=here")
    cell = "%%remote {}\nimport os\nos.environ.get('WHO'), os.environ.get('ONLY')"
    assert repr(run(shell, cell.format("")).result) == "('default', None)"
    assert repr(run(shell, cell.format("--env other")).result) == "('other', 'here')"
    merged = cell.format("""--env other --runtime-env '{"env_vars": {"WHO": "json"}}'""")
    assert repr(run(shell, merged).result) == "('json', 'here')"


def test_timeout_kills_the_worker(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(shell, "%%remote --timeout 0.5\nimport time\ntime.sleep(30)")
    line = one_error_line(capsys)
    assert line.startswith(
        "UsageError: remote: the cell ran longer than --timeout 0.5 s; its worker was killed,"
        " and the remote namespace of the default env was lost with it"
    )


def test_help(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    run(shell, "%%remote --help\n1")
    out = capsys.readouterr().out
    assert "%remote [--env NAME]" in out
    assert "--out x,y" in out


CELL_ERRORS = [
    ("import json\njson.loads('not json')", "json.JSONDecodeError", "(e.pos, e.msg)"),
    ("b'\\xff'.decode('utf-8')", "UnicodeDecodeError", "(e.start, e.encoding)"),
    (
        "import subprocess\nraise subprocess.CalledProcessError(returncode=2, cmd='x')",
        "subprocess.CalledProcessError",
        "(e.returncode, e.cmd)",
    ),
    ("open('/nonexistent/jre')", "FileNotFoundError", "(e.errno, e.filename)"),
    ("{}['k']", "KeyError", "e.args"),
    ("raise KwOnly(code=5)", "KwOnly", "(e.code, e.args)"),
]


@pytest.mark.parametrize(("body", "kind", "fields"), CELL_ERRORS)
def test_a_cells_exception_is_caught_by_its_type(
    shell: InteractiveShell, body: str, kind: str, fields: str
) -> None:
    # KwOnly is defined in the notebook: by value to the worker, the same class back.
    run(
        shell,
        "import json, subprocess\n"
        "class KwOnly(Exception):\n"
        "    def __init__(self, *, code):\n"
        "        super().__init__(f'code {code}')\n"
        "        self.code = code\n",
    )
    shell.user_ns["_cell_body"] = body
    handler = f"except {kind} as e:\n    caught = {fields}\n"
    # The same body run here first: what a local cell would catch.
    run(shell, "try:\n    exec(_cell_body)\n" + handler + "expected = caught\ndel caught")
    result = run(
        shell,
        "from IPython import get_ipython\n"
        "try:\n"
        "    get_ipython().run_cell_magic('remote', '', _cell_body)\n" + handler,
    )
    assert result.success, result.error_in_exec
    assert shell.user_ns["caught"] == shell.user_ns["expected"]


@pytest.mark.parametrize(
    "body",
    [
        "{}['missing']",
        "int('x')",
        "import math\nmath.nope",
        "raise OSError(2, 'gone', 'f.txt')",
        "raise KeyboardInterrupt('by the cell')",
    ],
)
def test_a_cells_exception_shows_as_the_local_cells(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], body: str
) -> None:
    """handbook.py: a remote cell's error showed as ``RemoteTaskError[AttributeError]: %%remote
    raised in its worker: AttributeError: ...`` where the local cell shows ``AttributeError:
    module 'matplotlib.cm' has no attribute 'get_cmap'`` (ipykernel's ename and evalue are
    the class's name and ``str()``); the frames shown are still the worker's."""
    local = run(shell, body).error_in_exec
    capsys.readouterr()
    remote = run(shell, "%%remote\n" + body).error_in_exec
    assert (type(remote).__name__, str(remote)) == (type(local).__name__, str(local))
    assert isinstance(remote, type(local))
    shown = capsys.readouterr()
    assert "(raised in the worker of %%remote)" in shown.out + shown.err


@pytest.mark.parametrize("body", ["import sys\nsys.exit(2)", "raise SystemExit('bye')", "exit()"])
def test_a_cells_exit_shows_as_the_local_cells(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], body: str
) -> None:
    """A cell's ``sys.exit(2)`` showed as ``RemoteCellError: 2``: IPython shows a local one as
    ``SystemExit: 2`` with no frames and warns "To exit: use 'exit', 'quit', or Ctrl-D."."""
    local = run(shell, body.replace("exit()", "raise SystemExit(None)")).error_in_exec
    shown_local = capsys.readouterr()
    remote = run(shell, "%%remote\n" + body).error_in_exec
    shown_remote = capsys.readouterr()
    assert isinstance(remote, SystemExit), remote
    assert (type(remote).__name__, str(remote)) == (type(local).__name__, str(local))
    # "An exception has occurred ...", the exception's line (no frames), then the warning
    # (whose frames are where each cell ran).
    assert shown_remote.out.split("\n\n")[:2] == shown_local.out.split("\n\n")[:2]
    assert shown_remote.out.count("To exit: use") == shown_local.out.count("To exit: use") == 1


def test_a_formatter_a_cell_registers_formats_the_next_cells_values(
    shell: InteractiveShell,
) -> None:
    """sympy's ``init_printing()`` in a remote cell (scientific-python-lectures' Lecture-5,
    every cell remote: 64 of 90 cells showed ``(x + pi)**2`` where the local cell shows the
    formula drawn, its pretty text and LaTeX). It calls ``get_ipython()`` without importing
    it, from builtins, as IPython puts it there, reads the shell's ``colors`` and registers
    its printers with ``display_formatter.formatters[mime].for_type``. Here the same three
    steps, by a function whose globals do not have ``get_ipython``."""
    library = (
        "def init_printing(cls):\n"
        "    ip = get_ipython()\n"
        "    colour = ip.colors.lower()\n"
        "    latex = ip.display_formatter.formatters['text/latex']\n"
        "    latex.for_type(cls, lambda f: f'$\\\\frac{{{f.n}}}{{{f.d}}}$ ' + colour)\n"
    )
    result = run(
        shell,
        "%%remote\n"
        "class Frac:\n"
        "    def __init__(self, n, d):\n"
        "        self.n, self.d = n, d\n"
        "    def __repr__(self):\n"
        "        return f'{self.n}/{self.d}'\n"
        "lib = {}\n"
        f"exec({library!r}, lib)\n"
        "lib['init_printing'](Frac)",
    )
    assert result.success, result.error_in_exec
    result = run(shell, "%%remote\nFrac(1, 2)")
    assert result.success, result.error_in_exec
    colour = str(shell.colors).lower()
    assert result.result.data == {"text/plain": "1/2", "text/latex": f"$\\frac{{1}}{{2}}$ {colour}"}


def test_printers_the_notebook_registers_format_remote_values(shell: InteractiveShell) -> None:
    """sympy's ``init_printing()`` in a notebook cell, then its formulas made in remote
    cells (scientific-python-lectures' Lecture-5, every other cell remote: 33 of 90 cells
    showed ``(x + pi)**2`` where a notebook cell shows it drawn). The printers the notebook
    registered on its display formatter (by type, by name) format the remote values too, and
    the newest one wins."""
    latex = "get_ipython().display_formatter.formatters['text/latex']"
    run(
        shell,
        "from fractions import Fraction\n"
        f"{latex}.for_type(Fraction, lambda f: f'$\\\\frac{{{{{{f.numerator}}}}}}{{{{2}}}}$')\n"
        f"{latex}.for_type_by_name('decimal', 'Decimal', lambda d: f'$d={{d}}$')",
    )
    result = run(shell, "%%remote\nfrom fractions import Fraction\nFraction(1, 2)")
    assert result.success, result.error_in_exec
    assert result.result.data == {"text/plain": "Fraction(1, 2)", "text/latex": "$\\frac{1}{2}$"}
    result = run(shell, "%%remote\nimport decimal\ndecimal.Decimal('1.5')")
    assert result.result.data == {"text/plain": "Decimal('1.5')", "text/latex": "$d=1.5$"}
    run(shell, f"{latex}.for_type(Fraction, lambda f: 'half')")
    assert run(shell, "%%remote\nFraction(1, 2)").result.data["text/latex"] == "half"


def test_a_recarray_comes_back_as_numpys(shell: InteractiveShell) -> None:
    """handbook.py (02.09, mixed): ``data.view(np.recarray)`` made in a remote cell came back
    as a copy of the class, whose ``rec['age']`` raised ``TypeError: super(type, obj)``:
    cloudpickle pickles a class by value when its module (``numpy.rec``, loaded lazily) is not
    imported yet."""
    run(shell, "import numpy as np")
    result = run(
        shell,
        "%%remote --out rec\nimport numpy as np\n"
        "rec = np.zeros(2, dtype=[('age', 'i4')]).view(np.recarray)",
    )
    assert result.success, result.error_in_exec
    result = run(shell, "type(rec) is np.recarray, rec['age'].tolist()")
    assert result.result == (True, [0, 0]), result.error_in_exec


def test_files_the_cell_writes_are_listed_and_files_out_copies_them(
    shell: InteractiveShell,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 20 item 7: a cell's df.to_csv('results.csv') lands in its env's copy of the
    working dir; the cell says so in one line, and --files-out brings it beside the notebook."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "in.csv").write_text("a\n1\n")
    notebook = tmp_path / "notebook"
    notebook.mkdir()
    monkeypatch.chdir(notebook)
    run(shell, f"%runtime_env --working-dir {project} --no-eager-install")
    capsys.readouterr()
    cell = "_ = open('results.csv', 'w').write(open('in.csv').read() + '2\\n')"
    assert run(shell, f"%%remote\n{cell}").success
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out
    assert out.startswith("wrote results.csv in its env's copy of the working dir")
    assert "--files-out" in out
    assert not (notebook / "results.csv").exists()

    assert run(shell, f"%%remote --files-out '*.csv'\n{cell}").success
    assert (notebook / "results.csv").read_text() == "a\n1\n2\n"
    assert "copied 1 to" in capsys.readouterr().out
    run(shell, "%runtime_env --clear")
