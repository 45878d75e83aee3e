"""A notebook's ``%%remote`` cells share a remote namespace per env (issue 20 items 4, 5, 6,
10; issue 21 item 8), in IPython's real shell with real workers of a real embedded agent.

Names and imports of earlier remote cells are there; the newest binding of a name wins
(a remote cell's, until the notebook binds or changes it again); ``--fresh`` and a dead
worker start over, and say so; a value the kernel cannot unpickle stays remote, named with
its cause, while the other ``--out`` names are assigned; ``@name`` in pandas query strings
is sent; a name the code only spells in a string gets one line naming it and ``--in``;
magics run in the worker or are refused naming them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from processes import wait_gone
from wheelhouse import offline_installers

from jupyter_runtimeenv.ipython._remote_namespaces import namespaces
from jupyter_runtimeenv.plugins._uv import uv_bin


def run(shell: InteractiveShell, source: str) -> Any:
    result = shell.run_cell(source, store_history=True)
    return result


def shown(result: Any) -> str:
    assert result.success, result.error_in_exec
    return repr(result.result)


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.out + captured.err
    return lines[0]


def test_names_and_imports_stay_for_the_next_cell(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    first = shown(run(shell, "%%remote\nimport os, math\nradius = 2\nos.getpid()"))
    assert shown(run(shell, "%%remote\nround(math.pi * radius**2, 3)")) == "12.566"
    assert shown(run(shell, "%%remote\nos.getpid()")) == first  # one worker, kept
    assert "radius" not in shell.user_ns  # nothing came back that was not asked for
    capsys.readouterr()
    run(shell, "%remote --list")
    listing = capsys.readouterr().out
    assert "the default env (env " in listing
    assert f"worker pid {first}, 3 cell(s)" in listing
    assert "math, os, radius" in listing


def test_a_notebook_cell_reads_a_remote_name_or_is_told_where_it_is(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(shell, "%%remote\nremote_total = 41\nremote_lines = (line for line in 'ab')")
    capsys.readouterr()
    assert run(shell, "remote_total + 1").result == 42  # brought back before the cell ran
    result = run(shell, "next(remote_lines)")  # a generator does not cross
    assert isinstance(result.error_in_exec, NameError)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith(
        "%%remote: 'remote_lines' was changed last by a %%remote cell of the default env, and"
        " cannot be brought back into the notebook: it cannot be pickled in the worker:"
    ), lines
    assert lines[-1] == (
        "%%remote: 'remote_lines' is in the remote namespace of the default env, not in the"
        " notebook: run this cell with %%remote, or add --out remote_lines to the %%remote"
        " cell that makes it"
    )
    result = run(shell, "held_by_no_namespace + 1")  # IPython's NameError alone
    assert isinstance(result.error_in_exec, NameError)
    assert "%%remote" not in capsys.readouterr().err
    assert shown(run(shell, "%%remote\nnext(remote_lines)")) == "'a'"


def test_a_value_brought_back_is_not_fetched_again(shell: InteractiveShell) -> None:
    run(shell, "%%remote\nfetched = [1, 2]")
    [space] = [s for s in namespaces() if "fetched" in s.names]
    assert run(shell, "len(fetched)").result == 2
    cells = space.cells  # the worker counts the fetch as a cell of the namespace
    assert run(shell, "sum(fetched)").result == 3
    assert space.cells == cells
    run(shell, "%%remote\nfetched = fetched + [3]")
    assert run(shell, "fetched").result == [1, 2, 3]


def test_a_name_the_cell_binds_before_reading_it_is_not_brought_back(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    """handbook.py (04.01, mixed): ``fig, ax = plt.subplots()`` then ``ax.plot(...)`` in a
    notebook cell brought back the remote ``ax`` first (a figure, for nothing)."""
    run(shell, "%%remote\nletters = (c for c in 'ab')\ncount = 1")
    capsys.readouterr()
    result = run(shell, "letters = iter('xy')\ncount += 1\nnext(letters), count")
    assert result.result == ("x", 2)
    assert capsys.readouterr().err == ""  # no word of a value that cannot come back


def test_names_that_share_an_object_share_it_across_a_transfer(shell: InteractiveShell) -> None:
    """handbook.py --mode mixed: ``fig, ax = plt.subplots()`` in a remote cell, then
    ``ax.set(...); fig`` in a notebook cell drew on a copy of the figure (each name crossed
    as its own pickle); the names of one transfer are pickled together, both ways."""
    run(
        shell,
        "%%remote\nimport numpy as np\nx = [1, 2, 3]\ny = x\n"
        "grid = np.arange(12.0).reshape(3, 4)\ncorner = grid[:2, :2]",
    )
    # Brought back together: one list, and a view of the array brought back with it.
    result = run(shell, "x.append(4)\ncorner[0, 0] = 99.0\n(y, float(grid[0, 0]))")
    assert result.result == ([1, 2, 3, 4], 99.0)
    # Sent together.
    run(shell, "pair = [0]\nsame = pair")
    assert shown(run(shell, "%%remote\npair.append(1)\nsame")) == "[0, 1]"
    # --out together.
    run(shell, "%%remote --out left,both\nleft = {'k': 1}\nboth = [left, left]")
    assert shell.user_ns["both"][0] is shell.user_ns["left"]
    assert shell.user_ns["both"][1] is shell.user_ns["left"]


def test_a_change_in_place_reaches_the_other_names_of_its_object(shell: InteractiveShell) -> None:
    """Whirlwind 03 (mixed): ``y = x`` in a remote cell, ``x.append(4)`` in a later one,
    then ``print(y)`` in a notebook cell printed the notebook's older ``y``."""
    run(shell, "%%remote\nxs = [1, 2, 3]\nys = xs")
    assert run(shell, "ys").result == [1, 2, 3]
    run(shell, "%%remote\nxs.append(4)")
    assert run(shell, "ys").result == [1, 2, 3, 4]
    # The same the other way: a notebook cell's change in place is sent for both names.
    run(shell, "%%remote\nus = [0]\nvs = us")
    run(shell, "us, vs")
    run(shell, "us.append(1)")
    assert shown(run(shell, "%%remote\nvs")) == "[0, 1]"


def test_a_function_that_changes_its_argument_changes_it_where_it_ran(
    shell: InteractiveShell,
) -> None:
    """Whirlwind 10 (mixed): ``next(I)`` in turns in notebook and remote cells drew the
    same items twice; ``np.add.at(counts, ...)`` was not seen as a change of ``counts``."""
    run(shell, "%%remote\nI = iter([2, 4, 6, 8])")
    assert run(shell, "next(I)").result == 2
    assert shown(run(shell, "%%remote\nnext(I)")) == "4"
    assert run(shell, "next(I)").result == 6
    run(shell, "import numpy as np\ncounts = np.zeros(3)")
    run(shell, "%%remote\nnp.add.at(counts, [0, 0, 2], 1)")
    assert run(shell, "counts.tolist()").result == [2.0, 0.0, 1.0]


def test_the_newest_binding_wins(shell: InteractiveShell) -> None:
    run(shell, "model = 'notebook'")
    run(shell, "%%remote\nmodel = 'remote'")
    # The notebook's older value is not sent over the remote one.
    assert shown(run(shell, "%%remote\nmodel")) == "'remote'"
    run(shell, "model = 'notebook again'")
    assert shown(run(shell, "%%remote\nmodel")) == "'notebook again'"


def test_changes_in_place_go_where_they_were_made(shell: InteractiveShell) -> None:
    run(shell, "%%remote --out table\ntable = {'a': 1}")
    run(shell, "table['local'] = 2")  # changed in a notebook cell: sent again
    assert shown(run(shell, "%%remote\nsorted(table)")) == "['a', 'local']"
    run(shell, "%%remote\ntable['remote'] = 3")  # changed remotely: the remote one is used
    assert shown(run(shell, "%%remote\nsorted(table)")) == "['a', 'local', 'remote']"
    assert sorted(shell.user_ns["table"]) == ["a", "local"]
    assert shown(run(shell, "%%remote --in table\nsorted(table)")) == "['a', 'local']"


def test_fresh_starts_over_in_a_new_worker(shell: InteractiveShell) -> None:
    before = shown(run(shell, "%%remote\nimport os\nkept = 1\nos.getpid()"))
    result = run(shell, "%%remote --fresh\nimport os\n('kept' in dir(), os.getpid())")
    fresh, pid = eval(shown(result))
    assert fresh is False
    assert str(pid) != before
    wait_gone([int(before)])  # the old worker was let go


def test_a_dead_worker_says_the_namespace_was_lost(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(shell, "size = 10")
    pid = int(shown(run(shell, "%%remote\nimport os\nsize = 20\nextra = 1\nos.getpid()")))
    os.kill(pid, 9)
    wait_gone([pid])
    deadline = time.monotonic() + 30
    capsys.readouterr()
    while True:
        result = run(shell, "%%remote\n(size, 'extra' in dir())")
        err = capsys.readouterr().err
        if "lost" in err or time.monotonic() > deadline:
            break
    assert "the worker of the default env is gone" in err
    assert "extra, os, size" in err
    # The notebook's value is sent again: the remote one died with its worker.
    assert shown(result) == "(10, False)"


def test_a_value_the_kernel_cannot_load_stays_remote(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "envonly.py").write_text(
        "class Model:\n    def fit(self):\n        self.fitted = True\n        return self\n"
        "    def score(self):\n        return 0.75 if self.fitted else 0\n"
    )
    spec = '{"py_modules": ["' + str(tmp_path / "envonly.py") + '"]}'
    shell.user_ns.pop("model", None)
    run(
        shell,
        f"%%remote --runtime-env '{spec}' --out model,count\n"
        "import envonly\nmodel = envonly.Model().fit()\ncount = 3",
    )
    line = one_error_line(capsys)
    assert line == (
        "UsageError: remote: --out model: envonly is not installed in this kernel"
        " (it stays in the remote namespace: use it in the next %%remote cell)"
    )
    assert shell.user_ns["count"] == 3  # the other names are assigned
    assert "model" not in shell.user_ns
    # Pickled together, a name that holds the one that cannot load is named too (not
    # loaded with a stand-in); the names after them still load.
    run(
        shell,
        f"%%remote --runtime-env '{spec}' --out model,holder,total\n"
        "holder = [model]\ntotal = count + 1",
    )
    line = one_error_line(capsys)
    assert line == (
        "UsageError: remote: --out model: envonly is not installed in this kernel;"
        " --out holder: it shares an object with 'model', which did not load"
        " (they stay in the remote namespace: use it in the next %%remote cell)"
    )
    assert shell.user_ns["total"] == 4
    assert "holder" not in shell.user_ns
    assert shown(run(shell, f"%%remote --runtime-env '{spec}'\nmodel.score()")) == "0.75"


def test_a_value_whose_package_differs_names_both_versions(
    shell: InteractiveShell,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    wheelhouse: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The kernel (this process) has alpha 1.0, from a sys.path entry of its own; the env has
    # alpha 2.0 (whose Model 1.0 lacks), and its worker does not see the kernel's sys.path.
    offline_installers(monkeypatch, wheelhouse)
    site = tmp_path / "kernel-site"
    subprocess.run(
        [
            *(uv_bin(), "pip", "install", "-q", "--target", str(site), "alpha==1.0"),
            *("--no-index", "--find-links", str(wheelhouse), "--no-config"),
        ],
        check=True,
    )
    monkeypatch.syspath_prepend(str(site))
    spec = json.dumps({"pip": ["alpha==2.0"], "driver_sys_path": False})
    run(
        shell,
        f"%%remote --runtime-env '{spec}' --out model,count\n"
        "import alpha\nmodel = alpha.Model()\ncount = 2",
    )
    line = one_error_line(capsys)
    assert line.startswith("UsageError: remote: --out model: AttributeError: "), line
    assert line.endswith(
        "; alpha 2.0 in the env, 1.0 here (it stays in the remote namespace: use it in the"
        " next %%remote cell)"
    ), line
    assert shell.user_ns["count"] == 2
    run(shell, f"%%remote --runtime-env '{spec}'\nprint(type(model).__name__, alpha.__version__)")
    assert capsys.readouterr().out == "Model 2.0\n"


def test_query_strings_send_their_at_names(shell: InteractiveShell) -> None:
    run(
        shell,
        "import pandas as pd\nframe = pd.DataFrame({'a': [1, 5, 9]})\nmu = 4\nsig = 2",
    )
    result = run(shell, "%%remote\nframe.query('a > @mu + @sig')['a'].tolist()")
    assert shown(result) == "[9]"
    result = run(shell, "%%remote\nframe.eval('a * @sig').tolist()")
    assert shown(result) == "[2, 10, 18]"


def test_a_name_only_in_a_string_is_one_line(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(shell, "limit = 7")
    run(shell, "%%remote\neval('limit + 1')")
    assert one_error_line(capsys) == (
        "UsageError: remote: 'limit' is a notebook variable the cell did not send (its code"
        " names it only inside a string): add --in limit"
    )
    assert shown(run(shell, "%%remote --in limit\neval('limit + 1')")) == "8"


def test_magics_run_in_the_worker(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    result = run(shell, "%%remote\n%time total = sum(range(1000))\ntotal")
    out = capsys.readouterr().out
    assert re.search(r"CPU times: user .*, sys: .*, total: .*\nWall time: .*\n", out), out
    assert shown(result) == "499500"
    run(shell, "%%remote\n%timeit -n 3 -r 2 sum(range(10))")
    out = capsys.readouterr().out
    assert re.search(r"per loop \(mean ± std\. dev\. of 2 runs, 3 loops each\)", out), out
    run(shell, "word = 'hello'")
    run(shell, "%%remote\n!echo {word} $word\nlines = !echo a; echo b\nprint(lines)")
    out = capsys.readouterr().out
    assert "hello hello\r\n" in out  # a terminal's line end, as in a kernel
    assert "['a', 'b']" in out
    assert shown(run(shell, "%%remote\n%matplotlib inline\nimport os\n%pwd")) != ""


def test_what_a_shell_command_started_goes_with_the_cells_worker(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    """``!cmd`` runs in a pseudo-terminal but in the worker's process group: a ``--timeout``
    (which kills the worker and its group) ends what the command started too."""
    capsys.readouterr()
    run(shell, "%%remote --timeout 10\n!sleep 120 & echo started $!; wait")
    found = re.search(r"started (\d+)", capsys.readouterr().out)
    assert found is not None
    assert wait_gone([int(found.group(1))]) == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("%pip install six", "UsageError: remote: %pip cannot run in a %%remote cell"),
        ("%matplotlib qt", "UsageError: remote: %matplotlib qt: a %%remote cell shows"),
        ("%who", "UsageError: remote: %who cannot run in a %%remote cell"),
        ("%%bash\nls", "UsageError: remote: %%bash cannot run in a %%remote cell"),
        ("x = 1\nx?", "UsageError: remote: %pinfo cannot run in a %%remote cell"),
    ],
)
def test_magics_a_worker_cannot_run_are_refused(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], body: str, message: str
) -> None:
    run(shell, f"%%remote\n{body}")
    assert one_error_line(capsys).startswith(message)


def in_project(shell: InteractiveShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A notebook's folder (``tmp_path/project``: ``tmp_path`` holds the cache), the kernel's
    cwd and its default env's working dir."""
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    run(shell, f"%runtime_env --working-dir {project} --no-eager-install")
    return project


def test_writefile_writes_where_the_cell_runs(
    shell: InteractiveShell,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """scientific-python-lectures' Lecture-1 writes a module with ``%%file mymodule.py`` and
    imports it in the next cell: moved to %%remote, the first was refused and the import
    failed. IPython's %%writefile (and its %%file): the file in the worker's cwd, the line
    IPython prints, ``-a``, ``{name}`` in the file name; the body is text, not code."""
    project = in_project(shell, tmp_path, monkeypatch)
    run(shell, "stem = 'jre_written'")
    capsys.readouterr()
    body = "VALUE = 41\n# undefined_name is only text here\n"
    assert run(shell, f"%%remote\n%%writefile {{stem}}.py\n{body}").success
    assert capsys.readouterr().out.startswith("Writing jre_written.py\n")
    assert run(shell, f"%%remote\n%%file {{stem}}.py\n{body}").success
    assert capsys.readouterr().out.startswith("Overwriting jre_written.py\n")
    assert run(shell, "%%remote\n%%writefile -a jre_written.py\nVALUE += 1\n").success
    assert capsys.readouterr().out.startswith("Appending to jre_written.py\n")
    result = run(shell, "%%remote\nimport os, jre_written\n(jre_written.VALUE, os.getcwd())")
    assert result.success, result.error_in_exec
    value, cwd = eval(shown(result))
    assert value == 42
    assert (Path(cwd) / "jre_written.py").read_text() == body + "VALUE += 1\n"
    assert not (project / "jre_written.py").exists()  # in the env's copy of the working dir
    run(shell, "%%remote\n%%writefile\nx")
    assert "ValueError: %%writefile : give one file name (none given)" in capsys.readouterr().out


def test_the_kernels_shell_aliases_run_in_the_worker(
    shell: InteractiveShell,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """scientific-python-lectures' Lecture-1 runs ``ls scripts/hello-world*.py`` and ``cat
    scripts/hello-world.py`` (IPython's aliases %ls and %cat, by automagic): moved to
    %%remote, both were refused. They run as commands in the worker's cwd, as IPython runs
    an alias (``%s`` a word each, ``%l`` the line, ``{name}`` expanded)."""
    project = in_project(shell, tmp_path, monkeypatch)
    (project / "hello.py").write_text("print('hello')\n")
    run(shell, "name = 'hello.py'")
    run(shell, "%alias two echo %s and %s")
    run(shell, "%alias whole echo [%l]")
    capsys.readouterr()
    for cell in ("cat hello.py", "%cat {name}", "%two a b c", "%whole x  y"):
        result = run(shell, f"%%remote\n{cell}")
        assert result.success, (cell, result.error_in_exec)
    # (through a terminal, as ipykernel runs a command: lines end in \r\n)
    assert capsys.readouterr().out == "print('hello')\r\n" * 2 + "a and b c\r\n[x y]\r\n"
    run(shell, "%%remote\n%two a")
    assert "the alias 'echo %s and %s' takes 2 arguments" in capsys.readouterr().out


def test_the_namespace_moves_when_a_notebook_cell_writes_into_the_working_dir(
    shell: InteractiveShell,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """scientific-python-lectures' Lecture-2, every other cell remote: ``from numpy import *``
    in a remote cell, then ``savetxt("random-matrix.csv", M)`` in a notebook cell, which
    writes into the env's working dir, so the next remote cell runs in a worker of the new
    env (to see the file): its namespace started empty, and 55 cells failed (``dot`` not
    defined). The names move to the new worker: one object under two names stays one, a
    function reads the new namespace's names, a lock is named as lost; the file is seen."""
    in_project(shell, tmp_path, monkeypatch)
    body = (
        "%%remote\n"
        "from math import *\n"
        "from matplotlib.pyplot import *\n"  # its rcParams: a copy could not be loaded
        "import threading, os\n"
        "fig, ax = subplots()\n"
        "data = [1, 2]\n"
        "alias = data\n"
        "lock = threading.Lock()\n"
        "def total():\n"
        "    return sum(data) + later\n"
        "before = os.getpid()"
    )
    assert run(shell, body).success
    run(shell, "open('written.csv', 'w').write('1,2\\n')")  # a notebook cell writes a file
    # A notebook cell reads a remote name: it comes from the old worker, which stays.
    assert run(shell, "data").result == [1, 2]
    capsys.readouterr()
    result = run(
        shell,
        "%%remote\nlater = 10\n"
        "(sqrt(16), total(), alias is data, open('written.csv').read(), os.getpid() != before,"
        " fig.axes[0] is ax, rcParams is __import__('matplotlib').rcParams)",
    )
    assert result.success, result.error_in_exec
    # (rcParams: the module's own, as a star import binds it, not a copy)
    assert eval(shown(result)) == (4.0, 13, True, "1,2\n", True, True, True)
    said = capsys.readouterr().err
    assert "changed since its last remote cell (its local code changed" in said
    assert "its names move to a new worker (" in said
    assert "; these cannot be pickled and are lost: lock (TypeError: " in said
    assert not list(Path(tempfile.gettempdir()).glob("jre-namespace-*"))  # loaded, removed


def test_a_trailing_semicolon_shows_nothing(shell: InteractiveShell) -> None:
    result = run(shell, "%%remote\nvalue = [1, 2]\nvalue;")
    assert result.success
    assert result.result is None
    assert shown(run(shell, "%%remote\nvalue  # a comment after the value")) == "[1, 2]"
    assert shown(run(shell, "%%remote\n_")) == "[1, 2]"  # the remote namespace's own _


def test_a_worker_that_lacks_the_namespace_runs_nothing() -> None:
    """The worker kept for a namespace died just before a cell reached it (the kernel could
    not know yet): the new worker runs nothing, and the kernel sends the cell again with
    every name it reads (the end-to-end path is the test above)."""
    from jupyter_runtimeenv.ipython import _cell_runner

    result = _cell_runner.run_cell(
        {"namespace": {"key": "never-seen", "expected": {"pid": 1, "names": ["a"]}}}
    )
    assert result == {"lost": True, "namespace": {"pid": os.getpid(), "created": True}}
    assert "never-seen" not in _cell_runner._registry()
