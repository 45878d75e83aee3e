"""A ``%%remote`` cell's figure renders inline in a real JupyterLab, and the next remote cell
draws on fresh axes (issue 20 items 1, 2), in headless Chromium.

The first cell draws orange bars and leaves the figure open (no ``plt.show()``: shown after
the cell, as the inline backend shows it); the second draws a blue line with a bare
``plt.plot`` (on pyplot's current figure: the bars' own, had the first cell's figure stayed
open). In the browser, each output must hold a rendered image; the pixels of the second must
have no orange (the bars did not leak into its axes) and those of the first must. The kernel
never imports matplotlib.
Screenshot: ``tests/lab/screenshots/remote-figures-*.png``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from labserver import Lab, Page, needs_browser

pytestmark = needs_browser()

CELLS = [
    "%load_ext jupyter_runtimeenv",
    "%%remote\n"
    "import matplotlib.pyplot as plt\n"
    "plt.figure(figsize=(4, 3))\n"
    "plt.bar([1, 2, 3], [3, 1, 2], color='#ff7f0e')\n"
    "plt.title('remote bars')",
    # no plt.figure(): pyplot draws on the current figure, the previous cell's if it leaked
    "%%remote\n"
    "plt.plot([0, 1, 2], [0, 1, 4], color='#1f77b4', linewidth=4)\n"
    "plt.title('remote line');\n"
    "print(len(plt.gca().patches), 'bars on the new axes')",
    "import sys\nprint('kernel has matplotlib:', 'matplotlib' in sys.modules)",
]

#: For each rendered <img> of an output area: its size and how many of its pixels are the
#: bars' orange (#ff7f0e, with a tolerance for antialiasing).
COUNT_ORANGE = """(area) => Array.from(area.querySelectorAll('img')).map((img) => {
    const canvas = document.createElement('canvas');
    canvas.width = img.naturalWidth;
    canvas.height = img.naturalHeight;
    const ctx = canvas.getContext('2d');
    ctx.drawImage(img, 0, 0);
    const data = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
    let orange = 0;
    for (let i = 0; i < data.length; i += 4) {
        if (Math.abs(data[i] - 255) < 12 && Math.abs(data[i + 1] - 127) < 12
            && Math.abs(data[i + 2] - 14) < 12) orange++;
    }
    return {width: img.naturalWidth, height: img.naturalHeight, orange};
})"""


def _notebook() -> dict[str, Any]:
    cells = [
        {"cell_type": "code", "metadata": {}, "source": src, "outputs": [], "execution_count": None}
        for src in CELLS
    ]
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def test_a_remote_figure_renders_inline_and_the_next_cell_starts_clean(
    lab: Lab, new_page: Callable[[str], Page]
) -> None:
    from playwright.sync_api import expect

    (lab.root / "figures.ipynb").write_text(json.dumps(_notebook()))
    view = new_page("remote-figures")
    view.open_notebook(lab, "figures.ipynb")
    page = view.page
    view.command("notebook:run-all-cells", wait=False)
    cells = page.locator(".jp-Notebook .jp-CodeCell")
    expect(cells.nth(3).locator(".jp-OutputArea-output")).to_contain_text(
        "kernel has matplotlib: False", timeout=240_000
    )
    expect(cells.nth(2).locator(".jp-OutputArea-output").first).to_contain_text(
        "0 bars on the new axes"
    )
    bars = cells.nth(1).locator(".jp-OutputArea")
    line = cells.nth(2).locator(".jp-OutputArea")
    expect(bars.locator("img")).to_have_count(1)
    expect(line.locator("img")).to_have_count(1)
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('.jp-OutputArea img'))"
        ".every((img) => img.complete && img.naturalWidth > 0)",
        timeout=30_000,
    )
    cells.nth(1).scroll_into_view_if_needed()
    view.shot("notebook")
    view.shot("bars-cell", cells.nth(1))
    view.shot("line-cell", cells.nth(2))
    [bar_image] = bars.evaluate(COUNT_ORANGE)
    [line_image] = line.evaluate(COUNT_ORANGE)
    assert bar_image["width"] > 200
    assert line_image["width"] > 200
    assert bar_image["orange"] > 1000  # the bars are there
    assert line_image["orange"] == 0  # and not under the next cell's line
    assert view.errors == []
