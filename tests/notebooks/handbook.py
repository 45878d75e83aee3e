"""Run real notebooks of the Python Data Science Handbook local and moved to ``%%remote``.

Not a test (it needs a clone of https://github.com/jakevdp/PythonDataScienceHandbook, or of
https://github.com/jakevdp/WhirlwindTourOfPython or
https://github.com/jrjohansson/scientific-python-lectures for the table's last entries, and an index
for ``--pip``): the check behind issue 20, repeatable by hand. Each notebook's code
cells run in a real kernel (nbclient) three times: twice as they are (cells whose outputs
differ between those two runs draw random numbers: compared by output kinds only), then
adapted as a new user would adapt them: ``%load_ext jupyter_runtimeenv`` and one
``%runtime_env --pip <its imports> --working-dir .`` first, and every cell (``--mode
remote``) or every other cell (``--mode mixed``) prefixed with ``%%remote``. Prints each cell
whose outputs differ and a count per notebook.

Adaptations made to both versions alike: the titanic half of the pivot-table notebook is
left out (``sns.load_dataset`` downloads it), so is the Olivetti faces cell of 04.10
(``fetch_olivetti_faces`` downloads them; the notebooks whose every dataset downloads, 03.08,
03.10, 03.11, 04.06, 04.14, 05.02, 05.05-05.10, 05.14, are not in the table), and
``plt.style.use('seaborn-white')``/``'seaborn-whitegrid'`` read ``'seaborn-v0_8-white...'``
(the names matplotlib >= 3.6 knows). The local runs import seaborn and numexpr from
``--seaborn DIR`` (``pip install --target DIR --no-deps seaborn numexpr``) when the kernel
lacks them; in ``--mode remote`` the kernel does not get them (the env has them), in
``--mode mixed`` it does (half the cells run there).

    python tests/notebooks/handbook.py CLONE [NAME...] [--mode remote|mixed] [--seaborn DIR]

(names before the flags: argparse takes no names after them.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from test_remote_patterns import normalized  # noqa: E402 - found through sys.path

#: notebook -> what its %runtime_env installs (its imports)
NOTEBOOKS = {
    "05.08-Random-Forests": "numpy matplotlib scikit-learn seaborn ipywidgets",
    "05.03-Hyperparameters-and-Model-Validation": "numpy matplotlib scikit-learn",
    "03.09-Pivot-Tables": "numpy pandas matplotlib",
    "05.11-K-Means": "numpy matplotlib scikit-learn scipy seaborn pillow",
    "02.02-The-Basics-Of-NumPy-Arrays": "numpy",
    "02.03-Computation-on-arrays-ufuncs": "numpy scipy",
    "02.04-Computation-on-arrays-aggregates": "numpy pandas matplotlib",
    "02.05-Computation-on-arrays-broadcasting": "numpy matplotlib",
    "02.07-Fancy-Indexing": "numpy matplotlib",
    "02.08-Sorting": "numpy matplotlib",
    "02.09-Structured-Data-NumPy": "numpy",
    "03.01-Introducing-Pandas-Objects": "numpy pandas",
    "03.02-Data-Indexing-and-Selection": "numpy pandas",
    "03.03-Operations-in-Pandas": "numpy pandas",
    "03.04-Missing-Values": "numpy pandas",
    "03.05-Hierarchical-Indexing": "numpy pandas",
    "03.06-Concat-And-Append": "numpy pandas",
    "03.07-Merge-and-Join": "numpy pandas",
    "03.12-Performance-Eval-and-Query": "numpy pandas numexpr",
    "04.01-Simple-Line-Plots": "numpy matplotlib",
    "04.02-Simple-Scatter-Plots": "numpy matplotlib scikit-learn",
    "04.03-Errorbars": "numpy matplotlib scikit-learn",
    "04.04-Density-and-Contour-Plots": "numpy matplotlib",
    "04.05-Histograms-and-Binnings": "numpy matplotlib scipy",
    "04.07-Customizing-Colorbars": "numpy matplotlib scikit-learn",
    "04.08-Multiple-Subplots": "numpy matplotlib",
    "04.09-Text-and-Annotation": "numpy pandas matplotlib",
    "04.10-Customizing-Ticks": "numpy matplotlib scikit-learn",
    "04.11-Settings-and-Stylesheets": "numpy matplotlib",
    "04.12-Three-Dimensional-Plotting": "numpy matplotlib",
    "05.04-Feature-Engineering": "numpy pandas matplotlib scikit-learn",
    "05.12-Gaussian-Mixtures": "numpy matplotlib scikit-learn scipy",
    "05.13-Kernel-Density-Estimation": "numpy matplotlib scikit-learn scipy",
    # https://github.com/jakevdp/WhirlwindTourOfPython (its notebooks at its top): Python alone
    "03-Semantics-Variables": "",
    "04-Semantics-Operators": "",
    "06-Built-in-Data-Structures": "",
    "07-Control-Flow-Statements": "",
    "08-Defining-Functions": "",
    "09-Errors-and-Exceptions": "",
    "10-Iterators": "",
    "11-List-Comprehensions": "",
    "12-Generators": "",
    "14-Strings-and-Regular-Expressions": "",
    # https://github.com/jrjohansson/scientific-python-lectures (its notebooks at its top)
    "Lecture-1-Introduction-to-Python-Programming": "",
    "Lecture-2-Numpy": "numpy matplotlib",
    "Lecture-3-Scipy": "numpy scipy matplotlib",
    "Lecture-4-Matplotlib": "numpy matplotlib",
    "Lecture-5-Sympy": "numpy sympy matplotlib",
}
FILES = [
    "data/births.csv",
    "data/president_heights.csv",
    "data/state-abbrevs.csv",
    "data/state-areas.csv",
    "data/state-population.csv",
    "helpers_05_08.py",
    "stockholm_td_adj.dat",
]
#: cells left out because they download (from both versions alike)
DOWNLOADS = ("fetch_olivetti_faces",)
_SITE = re.compile(r"\S*/site-packages/")


def notebooks(clone: Path) -> Path:
    """Where a clone keeps its notebooks: ``notebooks/`` (the Handbook), else its top."""
    return clone / "notebooks" if (clone / "notebooks").is_dir() else clone


def code_cells(clone: Path, name: str) -> list[str]:
    cells = []
    notebook = json.loads((notebooks(clone) / f"{name}.ipynb").read_text())
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        source = re.sub(r"'seaborn-(white|whitegrid)'", r"'seaborn-v0_8-\1'", source)
        if "sns.load_dataset('titanic')" in source:
            source = "import numpy as np\nimport pandas as pd"
        elif "titanic" in source or any(name in source for name in DOWNLOADS):
            continue
        if any(line.strip() and not line.startswith("#") for line in source.splitlines()):
            cells.append(source)
    return cells


def adapted(cells: list[str], name: str, mode: str) -> nbformat.NotebookNode:
    first = "pass"
    if mode != "local":
        pip = f"--pip {NOTEBOOKS[name]} " if NOTEBOOKS[name] else ""
        first = f"%load_ext jupyter_runtimeenv\n%runtime_env {pip}--working-dir ."
    sources = [first]
    for i, source in enumerate(cells):
        remote = mode == "remote" or (mode == "mixed" and i % 2 == 1)
        sources.append("%%remote\n" + source if remote else source)
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])


def execute(
    clone: Path, nb: nbformat.NotebookNode, folder: Path, pythonpath: str | None
) -> list[list[tuple[Any, ...]]]:
    folder.mkdir(parents=True)
    for name in FILES:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        if (notebooks(clone) / name).exists():
            shutil.copy(notebooks(clone) / name, folder / name)
    km = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    client = NotebookClient(
        nb, km=km, timeout=1800, kernel_name="python3", allow_errors=True,
        resources={"metadata": {"path": str(folder)}},
    )  # fmt: skip
    env = dict(os.environ)
    if pythonpath:  # before the caller's (which may name the package under test)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    try:
        client.execute(env=env)
    finally:  # nbclient leaves a kernel it was given running
        km.shutdown_kernel(now=True)
    nbformat.write(nb, folder / "executed.ipynb")
    cells = []
    for cell in nb.cells[1:]:
        shown: list[tuple[Any, ...]] = []
        for output in map(normalized, cell.outputs):
            if output[0] == "stream":  # a warning names the file: the env's copy remotely
                output = (*output[:2], _SITE.sub("<site-packages>/", output[2]))
            last = shown[-1] if shown else None
            if output[0] == "stream" and last is not None and last[:2] == output[:2]:
                shown[-1] = (*output[:2], last[2] + output[2])
            else:
                shown.append(output)
        cells.append(shown)
    return cells


def kinds(outputs: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [(o[0], sorted(o[1]) if isinstance(o[1], dict) else o[1]) for o in outputs]


def check(clone: Path, name: str, mode: str, seaborn: str | None, root: Path) -> int:
    cells = code_cells(clone, name)
    local = execute(clone, adapted(cells, name, "local"), root / "local", seaborn)
    again = execute(clone, adapted(cells, name, "local"), root / "again", seaborn)
    pythonpath = seaborn if mode == "mixed" else None
    moved = execute(clone, adapted(cells, name, mode), root / mode, pythonpath)
    differ = 0
    for i, (source, mine, twice, theirs) in enumerate(zip(cells, local, again, moved, strict=True)):
        stable = mine == twice
        if (mine == theirs) if stable else (kinds(mine) == kinds(theirs)):
            continue
        differ += 1
        print(f"--- {name} cell {i + 1} ({'stable' if stable else 'random'}):\n{source[:300]}")
        print("  local: ", repr(mine if stable else kinds(mine))[:800])
        print("  remote:", repr(theirs if stable else kinds(theirs))[:800])
    print(f"=== {name} [{mode}]: {differ} of {len(cells)} cells differ ({root})")
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("clone", type=Path)
    parser.add_argument("names", nargs="*", default=list(NOTEBOOKS))
    parser.add_argument("--mode", choices=["remote", "mixed"], default="remote")
    parser.add_argument("--seaborn", help="a directory holding seaborn, for the local runs")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="handbook-"))
    os.environ.setdefault("JUPYTER_RUNTIMEENV_CACHE", str(root / "cache"))
    total = sum(check(args.clone, n, args.mode, args.seaborn, root / n) for n in args.names)
    sys.exit(1 if total else 0)


if __name__ == "__main__":
    main()
