"""Real notebook patterns, moved to ``%%remote``, show what they showed locally (issue 20).

The patterns follow four notebooks of jakevdp's Python Data Science Handbook (random forests,
hyperparameters and model validation, pivot tables over a CSV, k-means with t-SNE), adapted
the way the issue's new user adapted them: ``%load_ext``, one ``%runtime_env
--working-dir .``, and each compute cell prefixed with ``%%remote`` (a few with ``--out``).
Each notebook runs twice in a real kernel (nbclient): every cell local, then with the marked
cells remote; every output must be the same (the same streams, the same execute results and
displays in the same order, figures as the same PNG bytes), with addresses (``at 0x...``)
the only difference allowed. Figures come with and without ``plt.show()``, ``;``, figures
left open, DataFrames both ways with the kernel's pandas, a model fitted in one remote cell
and scored in the next (it never comes back), ``@name`` in a query string.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import nbformat
import pytest
from kernel_process import kernel_manager
from nbclient import NotebookClient

#: A cell: (code, how it runs in the remote version: None = as is, else the %%remote flags).
Cell = tuple[str, str | None]
R = ""  # remote, no flags

SETUP = "%load_ext jupyter_runtimeenv\n%runtime_env --working-dir . --no-widget"

RANDOM_FORESTS: list[Cell] = [
    ("import numpy as np\nimport matplotlib.pyplot as plt", None),
    (
        "from sklearn.datasets import make_blobs\n"
        "X, y = make_blobs(n_samples=300, centers=4, random_state=0, cluster_std=1.0)\n"
        "plt.scatter(X[:, 0], X[:, 1], c=y, s=50, cmap='rainbow');",
        R,
    ),
    (
        "from sklearn.tree import DecisionTreeClassifier\n"
        "tree = DecisionTreeClassifier(random_state=0).fit(X, y)",
        R,
    ),
    (  # a function defined in the notebook, used by remote cells
        "def visualize_classifier(model, X, y, ax=None, cmap='rainbow'):\n"
        "    ax = ax or plt.gca()\n"
        "    ax.scatter(X[:, 0], X[:, 1], c=y, s=30, cmap=cmap, clim=(y.min(), y.max()),"
        " zorder=3)\n"
        "    ax.axis('tight')\n"
        "    ax.axis('off')\n"
        "    xlim, ylim = ax.get_xlim(), ax.get_ylim()\n"
        "    model.fit(X, y)\n"
        "    xx, yy = np.meshgrid(np.linspace(*xlim, num=50), np.linspace(*ylim, num=50))\n"
        "    Z = model.predict(np.c_[xx.ravel(), yy.ravel()]).reshape(xx.shape)\n"
        "    n_classes = len(np.unique(y))\n"
        "    ax.contourf(xx, yy, Z, alpha=0.3, levels=np.arange(n_classes + 1) - 0.5,"
        " cmap=cmap, zorder=1)\n"
        "    ax.set(xlim=xlim, ylim=ylim)",
        None,
    ),
    ("visualize_classifier(DecisionTreeClassifier(random_state=0), X, y)", R),
    (
        "from sklearn.ensemble import RandomForestClassifier\n"
        "model = RandomForestClassifier(n_estimators=20, random_state=0)\n"
        "visualize_classifier(model, X, y);",
        R,
    ),
    (
        "rng = np.random.RandomState(42)\n"
        "x = 10 * rng.rand(100)\n"
        "def model(x, sigma=0.3):\n"
        "    return np.sin(5 * x) + np.sin(0.5 * x) + sigma * rng.randn(len(x))\n"
        "y = model(x)\n"
        "plt.errorbar(x, y, 0.3, fmt='o');",
        R,
    ),
    (
        "from sklearn.ensemble import RandomForestRegressor\n"
        "forest = RandomForestRegressor(50, random_state=0)\n"
        "forest.fit(x[:, None], y)\n"
        "xfit = np.linspace(0, 10, 200)\n"
        "yfit = forest.predict(xfit[:, None])\n"
        "plt.errorbar(x, y, 0.3, fmt='o', alpha=0.5)\n"
        "plt.plot(xfit, yfit, '-r');\n"
        "plt.show()\n"
        "print('forest', forest.n_estimators)",
        R,
    ),
    (
        "from sklearn.datasets import load_digits\n"
        "from sklearn.model_selection import train_test_split\n"
        "from sklearn import metrics\n"
        "digits = load_digits()\n"
        "Xtrain, Xtest, ytrain, ytest = train_test_split(digits.data, digits.target,"
        " random_state=0)\n"
        "model = RandomForestClassifier(n_estimators=30, random_state=0).fit(Xtrain, ytrain)\n"
        "ypred = model.predict(Xtest)",
        R,
    ),
    ("print(metrics.classification_report(ypred, ytest))", R),
    (
        "fig = plt.figure(figsize=(4, 4))\n"
        "for i in range(16):\n"
        "    ax = fig.add_subplot(4, 4, i + 1, xticks=[], yticks=[])\n"
        "    ax.imshow(digits.images[i], cmap=plt.cm.binary, interpolation='nearest')\n"
        "    ax.text(0, 7, str(digits.target[i]))",
        R,
    ),
]

MODEL_VALIDATION: list[Cell] = [
    (
        "from sklearn.datasets import load_iris\n"
        "iris = load_iris()\n"
        "X = iris.data\n"
        "y = iris.target",
        None,
    ),
    (
        "from sklearn.neighbors import KNeighborsClassifier\n"
        "model = KNeighborsClassifier(n_neighbors=1)\n"
        "model.fit(X, y)\n"
        "y_model = model.predict(X)",
        R,
    ),
    ("from sklearn.metrics import accuracy_score\naccuracy_score(y, y_model)", R),
    (
        "from sklearn.model_selection import train_test_split\n"
        "X1, X2, y1, y2 = train_test_split(X, y, random_state=0, train_size=0.5)\n"
        "model.fit(X1, y1)\n"
        "y2_model = model.predict(X2)\n"
        "accuracy_score(y2, y2_model)",
        R,
    ),
    ("from sklearn.model_selection import cross_val_score\ncross_val_score(model, X, y, cv=5)", R),
    (
        "import numpy as np\n"
        "from sklearn.preprocessing import PolynomialFeatures\n"
        "from sklearn.linear_model import LinearRegression\n"
        "from sklearn.pipeline import make_pipeline\n"
        "def PolynomialRegression(degree=2, **kwargs):\n"
        "    return make_pipeline(PolynomialFeatures(degree), LinearRegression(**kwargs))\n"
        "def make_data(N, err=1.0, rseed=1):\n"
        "    rng = np.random.RandomState(rseed)\n"
        "    X = rng.rand(N, 1) ** 2\n"
        "    y = 10 - 1. / (X.ravel() + 0.1)\n"
        "    if err > 0:\n"
        "        y += err * rng.randn(N)\n"
        "    return X, y\n"
        "X, y = make_data(40)",
        None,
    ),
    (
        "%matplotlib inline\n"
        "import matplotlib.pyplot as plt\n"
        "X_test = np.linspace(-0.1, 1.1, 100)[:, None]\n"
        "plt.scatter(X.ravel(), y, color='black')\n"
        "for degree in [1, 3, 5]:\n"
        "    y_test = PolynomialRegression(degree).fit(X, y).predict(X_test)\n"
        "    plt.plot(X_test.ravel(), y_test, label='degree={0}'.format(degree))\n"
        "plt.xlim(-0.1, 1.0)\n"
        "plt.ylim(-2, 12)\n"
        "plt.legend(loc='best');",
        R,
    ),
    (
        "from sklearn.model_selection import validation_curve\n"
        "degree = np.arange(0, 12)\n"
        "train_score, val_score = validation_curve(PolynomialRegression(), X, y,"
        " param_name='polynomialfeatures__degree', param_range=degree, cv=7)\n"
        "plt.plot(degree, np.median(train_score, 1), color='blue', label='training score')\n"
        "plt.plot(degree, np.median(val_score, 1), color='red', label='validation score')\n"
        "plt.legend(loc='best')\n"
        "plt.ylim(0, 1)\n"
        "plt.xlabel('degree')\n"
        "plt.ylabel('score');",
        R,
    ),
    (
        "from sklearn.model_selection import GridSearchCV\n"
        "param_grid = {'polynomialfeatures__degree': np.arange(8),"
        " 'linearregression__fit_intercept': [True, False]}\n"
        "grid = GridSearchCV(PolynomialRegression(), param_grid, cv=7)\n"
        "grid.fit(X, y);",
        R,
    ),
    ("grid.best_params_", R),
]

PIVOT_TABLES: list[Cell] = [
    ("import numpy as np\nimport pandas as pd", None),
    ("births = pd.read_csv('data/births.csv')", "--out births"),
    ("births.head()", R),
    (
        "births['decade'] = 10 * (births['year'] // 10)\n"
        "births.pivot_table('births', index='decade', columns='gender', aggfunc='sum')",
        R,
    ),
    (
        "%matplotlib inline\n"
        "import matplotlib.pyplot as plt\n"
        "births.pivot_table('births', index='year', columns='gender', aggfunc='sum').plot()\n"
        "plt.ylabel('total births per year');",
        R,
    ),
    (  # local, on the DataFrame that came back: the kernel's pandas reads it
        "quartiles = np.percentile(births['births'], [25, 50, 75])\n"
        "mu = quartiles[1]\n"
        "sig = 0.74 * (quartiles[2] - quartiles[0])\n"
        "mu, round(sig, 3)",
        None,
    ),
    ("births = births.query('(births > @mu - 5 * @sig) & (births < @mu + 5 * @sig)')", R),
    (
        "births['day'] = births['day'].astype(int)\n"
        "births.index = pd.to_datetime(10000 * births.year + 100 * births.month + births.day,"
        " format='%Y%m%d')\n"
        "births['dayofweek'] = births.index.dayofweek\n"
        "len(births)",
        R,
    ),
    (
        "births.pivot_table('births', index='dayofweek', columns='decade', aggfunc='mean').plot()\n"
        "plt.gca().set(xticks=range(7), xticklabels=['Mon', 'Tues', 'Wed', 'Thurs', 'Fri',"
        " 'Sat', 'Sun'])\n"
        "plt.ylabel('mean births by day');",
        R,
    ),
    (
        "births_by_date = births.pivot_table('births', [births.index.month, births.index.day])\n"
        "births_by_date.head()",
        "--out births_by_date",
    ),
    ("births_by_date.shape, type(births_by_date).__name__", None),
    (  # a DataFrame made in the notebook, used remotely
        "extra = pd.DataFrame({'a': [1, 2, 3]})",
        None,
    ),
    ("extra.assign(b=extra.a * 2)", R),
]

K_MEANS: list[Cell] = [
    (
        "%matplotlib inline\n"
        "import matplotlib.pyplot as plt\n"
        "import numpy as np\n"
        "from sklearn.datasets import make_blobs\n"
        "X, y_true = make_blobs(n_samples=300, centers=4, cluster_std=0.60, random_state=0)\n"
        "plt.scatter(X[:, 0], X[:, 1], s=50);",
        R,
    ),
    (
        "from sklearn.cluster import KMeans\n"
        "kmeans = KMeans(n_clusters=4, random_state=0, n_init=10)\n"
        "kmeans.fit(X)\n"
        "y_kmeans = kmeans.predict(X)",
        R,
    ),
    (
        "plt.scatter(X[:, 0], X[:, 1], c=y_kmeans, s=50, cmap='viridis')\n"
        "centers = kmeans.cluster_centers_\n"
        "plt.scatter(centers[:, 0], centers[:, 1], c='black', s=200);",
        R,
    ),
    (
        "from sklearn.datasets import load_digits\ndigits = load_digits()\ndigits.data.shape",
        R,
    ),
    (
        "kmeans = KMeans(n_clusters=10, random_state=0, n_init=10)\n"
        "clusters = kmeans.fit_predict(digits.data)\n"
        "fig, ax = plt.subplots(2, 5, figsize=(8, 3))\n"
        "centers = kmeans.cluster_centers_.reshape(10, 8, 8)\n"
        "for axi, center in zip(ax.flat, centers):\n"
        "    axi.set(xticks=[], yticks=[])\n"
        "    axi.imshow(center, interpolation='nearest', cmap=plt.cm.binary)",
        R,
    ),
    (
        "from sklearn.manifold import TSNE\n"
        "from sklearn.metrics import accuracy_score\n"
        "from scipy.stats import mode\n"
        "data, target = digits.data[:300], digits.target[:300]\n"
        "tsne = TSNE(n_components=2, init='random', learning_rate='auto', random_state=0)\n"
        "proj = tsne.fit_transform(data)\n"
        "clusters = KMeans(n_clusters=10, random_state=0, n_init=10).fit_predict(proj)\n"
        "labels = np.zeros_like(clusters)\n"
        "for i in range(10):\n"
        "    mask = clusters == i\n"
        "    labels[mask] = mode(target[mask])[0]\n"
        "round(accuracy_score(target, labels), 2)",
        R,
    ),
    ("import sys\nsorted(m for m in ('matplotlib', 'sklearn') if m in sys.modules)", None),
]

HELPER_AND_FILES: list[Cell] = [
    (
        "from pathlib import Path\n"
        "Path('helper.py').write_text('def greet(name):\\n    return \"hello \" + name\\n')",
        None,
    ),
    ("import helper\nhelper.greet('remote')", R),
    (
        "Path('helper.py').write_text('def greet(name):\\n    return \"hi there, \" + name\\n')",
        None,
    ),
    ("import importlib\nimport helper\nimportlib.reload(helper)\nhelper.greet('again')", R),
    (
        "import pandas as pd\n"
        "pd.DataFrame({'a': [1, 2]}).to_csv('results.csv', index=False)\n"
        "print(open('results.csv').read())",
        "--files-out results.csv",
    ),
    ("print(open('results.csv').read())", None),  # beside the notebook, both ways
]

#: Notebook and remote cells in turns (handbook.py --mode mixed): the notebook's matplotlib
#: style reaches the remote cells' figures, and a notebook cell reads the newest value of a
#: name a remote cell changed (rebound, changed in place, or defined: never --out), but not
#: one it binds itself before reading it.
MIXED: list[Cell] = [
    ("%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.style.use('ggplot')", None),
    ("plt.plot([1, 3, 2]);", R),
    ("plt.rcParams['lines.linewidth'] = 5", None),
    ("plt.plot([2, 1, 3]);", R),
    ("fig, ax = plt.subplots()\nax.plot([3, 1]);", R),
    ("fig, ax = plt.subplots()\nax.plot([1, 3]);", None),  # reads its own ax, not the remote
    ("import numpy as np\nimport pandas as pd\nx = np.arange(3)", None),
    ("x = x * 10", R),
    ("print(x)", None),
    ("x[0] = 7", R),
    ("x", None),
    ("total = x.sum()\nlabels = ['a', 'b']", R),
    ("total, labels", None),
    ("labels = labels + ['c']\nx = x + 1", None),
    ("x, labels", R),
    # changed by their own methods: a random generator's draws, inplace=True, list.append
    ("rng = np.random.default_rng(0)\nframe = pd.DataFrame({'v': [3, 1, 2]})", None),
    ("a = rng.integers(0, 100, 3)\nframe.sort_values('v', inplace=True)", R),
    ("b = rng.integers(0, 100, 3)\nframe", None),
    ("c = rng.integers(0, 100, 3)\nlabels.append('d')", None),
    ("a, b, c, rng.integers(0, 100, 3), labels", R),
]

NOTEBOOKS = {
    "mixed": MIXED,
    "random_forests": RANDOM_FORESTS,
    "model_validation": MODEL_VALIDATION,
    "pivot_tables": PIVOT_TABLES,
    "k_means": K_MEANS,
    "helper_and_files": HELPER_AND_FILES,
}
#: The one line a remote cell adds, where a local one has none: the cell after an edit to
#: a module of the working_dir runs in a new env (its names move there, and it says so),
#: and a cell that wrote files names them (and where --files-out copied them).
EXTRA_REMOTE_LINES = {
    ("helper_and_files", 3): re.compile(
        r"^%%remote: the default env changed since its last remote cell \(its local code"
        r" changed \(working_dir, py_modules\)\): its names move to a new worker"
        r" \(.*helper.*\)\n",
        re.MULTILINE,
    ),
    ("helper_and_files", 4): re.compile(r"^wrote results\.csv.*; copied 1 to .*\n", re.MULTILINE),
}


def write_births(path: Path) -> None:
    """A small births.csv with the columns of the handbook's (CDC births, 1969-1988)."""
    rng = random.Random(0)
    rows = ["year,month,day,gender,births"]
    for year in range(1969, 1989, 2):
        for month in range(1, 13):
            for day in (1, 9, 17, 25):
                for gender in ("F", "M"):
                    births = 4000 + 30 * (year - 1969) + rng.randint(-400, 400)
                    rows.append(f"{year},{month},{day},{gender},{births}")
    rows.append("1970,1,99,F,3")  # an outlier the query drops, as in the real data
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n")


def notebook(cells: list[Cell], remote: bool) -> nbformat.NotebookNode:
    sources = [SETUP]
    for code, flags in cells:
        if remote and flags is not None:
            sources.append(f"%%remote {flags}".rstrip() + "\n" + code)
        else:
            sources.append(code)
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])


def execute(nb: nbformat.NotebookNode, folder: Path, cache: Path) -> nbformat.NotebookNode:
    with kernel_manager() as km:
        client = NotebookClient(
            nb,
            km=km,
            timeout=600,
            kernel_name="python3",
            resources={"metadata": {"path": str(folder)}},
        )
        client.execute(env={**os.environ, "JUPYTER_RUNTIMEENV_CACHE": str(cache)})
    return nb


_ADDRESS = re.compile(r" at 0x[0-9a-f]+")
#: Where a warning was raised: each cell has a file of its own (a remote one has its
#: %%remote line first, so its line numbers are one more).
_WARNING_AT = re.compile(r"^\S*ipykernel_\d+/\d+\.py:\d+: ", re.MULTILINE)


def normalized(output: dict[str, Any]) -> tuple[Any, ...]:
    kind = output["output_type"]
    if kind == "stream":
        return (kind, output["name"], _WARNING_AT.sub("<cell>: ", output["text"]))
    if kind == "error":
        return (kind, output["ename"], output["evalue"])
    data = {
        k: _ADDRESS.sub(" at 0x…", v) if isinstance(v, str) else v
        for k, v in output["data"].items()
    }
    return (kind, data, dict(output.get("metadata") or {}))


def cell_outputs(nb: nbformat.NotebookNode) -> list[list[tuple[Any, ...]]]:
    """Each cell's outputs as a frontend shows them: consecutive pieces of one stream are
    one text (they arrive in as many messages as the kernel's flushes made)."""
    cells = []
    for cell in nb.cells[1:]:
        shown: list[tuple[Any, ...]] = []
        for output in map(normalized, cell.outputs):
            last = shown[-1] if shown else None
            if output[0] == "stream" and last is not None and last[:2] == output[:2]:
                shown[-1] = (*output[:2], last[2] + output[2])
            else:
                shown.append(output)
        cells.append(shown)
    return cells


def folder(root: Path) -> Path:
    """The notebook's folder (its kernel's cwd and working_dir), one per run."""
    write_births(root / "data" / "births.csv")
    return root


def without(outputs: list[tuple[Any, ...]], extra: re.Pattern[str]) -> list[tuple[Any, ...]]:
    """``outputs`` without the one line ``extra`` allows (it must be there)."""
    text = "".join(o[2] for o in outputs if o[0] == "stream")
    assert extra.search(text), (extra.pattern, outputs)
    kept = []
    for output in outputs:
        if output[0] == "stream":
            output = (*output[:2], extra.sub("", output[2], count=1))
            if not output[2]:
                continue
        kept.append(output)
    return kept


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_remote_cells_show_what_local_cells_show(name: str, tmp_path: Path) -> None:
    cells = NOTEBOOKS[name]
    local_nb = notebook(cells, remote=False)
    local = cell_outputs(execute(local_nb, folder(tmp_path / "local"), tmp_path / "cache"))
    remote_nb = execute(
        notebook(cells, remote=True), folder(tmp_path / "remote"), tmp_path / "cache"
    )
    remote = cell_outputs(remote_nb)
    for (notebook_name, index), extra in EXTRA_REMOTE_LINES.items():
        if notebook_name == name:
            remote[index] = without(remote[index], extra)
    assert not any(o[0] == "error" for cell in local for o in cell), local
    for index, ((code, flags), mine, theirs) in enumerate(zip(cells, local, remote, strict=True)):
        if name == "k_means" and index == len(cells) - 1:
            # The one difference that is the point: the kernel never loaded matplotlib or
            # scikit-learn to show the remote cells' figures and values.
            assert mine == [("execute_result", {"text/plain": "['matplotlib', 'sklearn']"}, {})]
            assert theirs == [("execute_result", {"text/plain": "[]"}, {})]
            continue
        assert theirs == mine, (
            f"cell {index + 1} ({'remote' if flags is not None else 'local'}):\n{code}"
        )
    figures = sum(1 for cell in remote for o in cell if o[0] != "stream" and "image/png" in o[1])
    assert figures >= 2 or name == "helper_and_files"
