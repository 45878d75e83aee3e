"""What a ``%%remote`` cell shows is what the same cell shows locally (issue 20 items 1-3),
in IPython's real shell (its display publisher captured), with real workers.

``display()`` (builtin or imported from ``IPython.display``), ``_repr_*_``, display ids,
``clear_output``; matplotlib figures as the inline backend shows them: ``plt.show()``
shows every open figure, figures left open show after the result, ``;`` hides the value,
figures are closed after a cell (no axes leak into the next), in the kernel's formats;
widget views (whose model would live in the worker) are dropped; a value not asked for is
never shipped.
"""

from __future__ import annotations

import base64
import subprocess
import sys
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from jupyter_runtimeenv.ipython._remote_stream import figure_settings


def outputs(shell: InteractiveShell, source: str) -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    """Run ``source``; its result and its outputs in order: ('display' | 'result', data)."""
    with capture_output() as captured:
        result = shell.run_cell(source, store_history=True)
    assert result.success, result.error_in_exec
    shown = [("display", dict(o.data)) for o in captured.outputs]
    return result, shown


def mimes(shown: list[tuple[str, dict[str, Any]]]) -> list[list[str]]:
    return [sorted(data) for _, data in shown]


def test_display_and_repr_methods(shell: InteractiveShell) -> None:
    shell.run_cell(
        "class Card:\n"
        "    def _repr_html_(self):\n        return '<b>card</b>'\n"
        "    def _repr_markdown_(self):\n        return '**card**'\n"
        "class Bundle:\n"
        "    def _repr_mimebundle_(self, include=None, exclude=None):\n"
        "        return {'text/plain': 'bundle', 'application/x-test': 'yes'}\n"
    )
    result, shown = outputs(
        shell,
        "%%remote\n"
        "from IPython.display import display as ipy_display, HTML\n"
        "display(Card())\n"
        "ipy_display(HTML('<i>html</i>'))\n"
        "display({'k': 1}, Bundle())\n"
        "Card()",
    )
    datas = [data for _, data in shown]
    assert datas[0]["text/html"] == "<b>card</b>"
    assert datas[0]["text/markdown"] == "**card**"
    assert datas[1]["text/html"] == "<i>html</i>"
    assert datas[2] == {"text/plain": "{'k': 1}"}
    assert datas[3]["application/x-test"] == "yes"
    assert result.result.data["text/html"] == "<b>card</b>"  # Out[n]


def test_display_ids_update_in_place(shell: InteractiveShell) -> None:
    with capture_output() as captured:
        shell.run_cell(
            "%%remote\nhandle = display('first', display_id=True)\nhandle.update('second')\n"
        )
    first, second = captured.outputs
    assert first.data == {"text/plain": "'first'"}
    assert second.data == {"text/plain": "'second'"}
    assert first.transient["display_id"] == second.transient["display_id"]
    assert second.update
    assert not first.update


def test_a_widget_view_is_dropped(shell: InteractiveShell) -> None:
    pytest.importorskip("ipywidgets")
    with capture_output() as captured:
        source = "%%remote\nimport ipywidgets\ndisplay(ipywidgets.IntSlider(3))"
        result = shell.run_cell(source, store_history=True)
    assert result.success, result.error_in_exec
    assert [sorted(o.data) for o in captured.outputs] == [["text/plain"]]
    assert captured.stderr.strip() == (
        "%%remote: a widget cannot be live in a %%remote cell (its model would be in the"
        " worker): its text is shown; run this cell without %%remote to use it"
    )


def png_size(data: str) -> tuple[int, int]:
    raw = base64.b64decode(data)
    return int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")


def test_figures_as_the_inline_backend_shows_them(shell: InteractiveShell) -> None:
    _, shown = outputs(
        shell,
        "%%remote\n"
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3])\n"
        "plt.show()\n"
        "print('between')\n"
        "plt.bar([1, 2], [3, 4])\n",
    )
    # plt.show() showed the line plot; the bars, left open, show after the cell.
    assert mimes(shown) == [["image/png", "text/plain"], ["image/png", "text/plain"]]
    assert shown[0][1]["text/plain"] == "<Figure size 640x480 with 1 Axes>"
    assert png_size(shown[0][1]["image/png"])[0] > 100


def test_no_axes_leak_into_the_next_cell_and_semicolon_hides(shell: InteractiveShell) -> None:
    outputs(shell, "%%remote\nimport matplotlib.pyplot as plt\nplt.bar([1, 2], [3, 4])")
    result, shown = outputs(shell, "%%remote\nlen(plt.get_fignums())")
    assert repr(result.result) == "0"
    assert shown == []
    # ';': no value, one figure; 'fig' as the value: the figure twice, as locally.
    result, shown = outputs(shell, "%%remote\nplt.scatter([1, 2], [3, 4]);")
    assert result.result is None
    assert mimes(shown) == [["image/png", "text/plain"]]
    result, shown = outputs(shell, "%%remote\nfig, ax = plt.subplots()\nax.plot([1])\nfig")
    assert result.result.data["text/plain"] == "<Figure size 640x480 with 1 Axes>"
    assert "image/png" in result.result.data  # Out[n] (the shell's displayhook shows it)
    assert mimes(shown) == [["image/png", "text/plain"]]  # and again after the cell


def test_figures_show_when_matplotlib_was_imported_before_the_cell() -> None:
    """handbook.py (04.01, mixed): a cell's arguments whose pickle names matplotlib (the
    notebook's style; a notebook variable such as a ``Normalize``) import matplotlib in the
    worker while they are read, before the cell chooses its backend: matplotlib took the
    kernel's ``MPLBACKEND`` (matplotlib-inline's, which an env of its own may lack) and the
    cell's figures were never shown. The worker's steps, in a process of their own."""
    script = (
        "import os\n"
        "os.environ['MPLBACKEND'] = 'module://matplotlib_inline.backend_inline'\n"
        "import matplotlib.colors\n"  # as unpickling the call's arguments does
        "from jupyter_runtimeenv.ipython import _cell_display\n"
        "figures = {'formats': ['png'], 'print_kwargs': {}, 'close': True, 'rc': {}}\n"
        "_cell_display.begin_cell('nonce', figures)\n"
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2]);\n"
        "_cell_display.end_cell()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.count('"image/png"') == 1, done.stdout[-2000:] + done.stderr[-2000:]


def test_config_inline_backend_in_a_remote_cell_sets_the_kernels(shell: InteractiveShell) -> None:
    """``%config InlineBackend.figure_format = 'svg'`` in a notebook's first cell (with its
    imports), moved to %%remote, refused the whole cell (scientific-python-lectures'
    Lecture-4). Figure formats are the kernel's: it applies the line before it sends the
    cell, whose figures are then drawn so, as a local cell's are."""
    try:
        _, shown = outputs(
            shell,
            "%%remote\n%config InlineBackend.figure_formats = ['svg']\n"
            "import matplotlib.pyplot as plt\nplt.plot([1]);\nplt.show()",
        )
        assert figure_settings(shell)["formats"] == ["svg"]  # the kernel's, from now on
    finally:
        shell.run_cell("%config InlineBackend.figure_formats = ['png']")
    assert mimes(shown) == [["image/svg+xml", "text/plain"]]


def test_the_kernels_figure_formats(shell: InteractiveShell) -> None:
    shell.run_cell("%config InlineBackend.figure_formats = ['svg', 'retina']")
    try:
        _, shown = outputs(
            shell, "%%remote\nimport matplotlib.pyplot as plt\nplt.plot([1]);\nplt.show()"
        )
    finally:
        shell.run_cell("%config InlineBackend.figure_formats = ['png']")
    assert mimes(shown) == [["image/png", "image/svg+xml", "text/plain"]]
    assert shown[0][1]["image/svg+xml"].lstrip().startswith("<?xml")


def test_a_style_a_remote_cell_sets_is_the_notebooks_too(shell: InteractiveShell) -> None:
    """handbook.py (04.11, mixed): ``plt.rc('axes', ...)`` in a remote cell, then the
    notebook's own figures drew without it. The settings a remote cell changes are the
    newest (a ``plt.style.context`` block changes none); the next remote cell keeps them."""
    import matplotlib

    try:
        outputs(shell, "import matplotlib")
        outputs(
            shell,
            "%%remote\nimport matplotlib.pyplot as plt\n"
            "plt.rc('axes', facecolor='#E6E6E6', grid=True)\n"
            "with plt.style.context('dark_background'):\n    pass",
        )
        assert matplotlib.rcParams["axes.facecolor"] == "#E6E6E6"
        assert matplotlib.rcParams["axes.grid"] is True
        assert matplotlib.rcParams["figure.facecolor"] == "white"  # the block's, undone
        result, _ = outputs(shell, "%%remote\nplt.rcParams['axes.facecolor']")
        assert result.result.data["text/plain"] == "'#E6E6E6'"
    finally:
        matplotlib.rc_file_defaults()
