"""A ``pip`` requirement line's canonical form without ``packaging`` (``_requirements.
_canonical_simple``), for the lines most specs are made of, against ``packaging``'s own."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys

import pytest

from jupyter_runtimeenv.errors import SpecError
from jupyter_runtimeenv.plugins import _requirements as reqs

NAMES = [
    "pandas", "Six", "scikit-learn", "scikit_learn", "zope.interface", "A", "a1", "1a",
    "Foo__Bar", "foo-.-bar", "x.y_z-w", "jupyter-runtimeenv", "Jupyter_Runtimeenv",
    "cloudpickle", "CloudPickle", "-bad", "bad-", "_x", "x_", "a b", "ä", "pkg[extra]",
]  # fmt: skip
OPERATORS = ["==", "!=", "<=", ">=", "<", ">", "~=", "===", "=", "=>", "=<", "!", "~"]
VERSIONS = [
    "1", "1.0", "01.2", "1.2.3", "2024.10.1", "0", "1.*", "1.0a1", "1.0.post1", "1.0+local",
    "", "1..2", "1.", ".1", "v1", "1.0-1", "1.0 ",
]  # fmt: skip


def lines() -> list[str]:
    out = []
    for name, operator, version in itertools.product(NAMES, OPERATORS, VERSIONS):
        out.append(f"{name}{operator}{version}")
    rng = random.Random(19)
    for _ in range(4000):
        parts = [rng.choice(OPERATORS) + rng.choice(VERSIONS) for _ in range(rng.randint(0, 4))]
        line = (
            rng.choice(NAMES)
            + rng.choice(["", " ", "  "])
            + rng.choice([",", ", ", " ,"]).join(parts)
        )
        out.append(line)
    return out + NAMES


def test_a_simple_line_is_spelled_as_packaging_spells_it() -> None:
    fast = 0
    for line in lines():
        simple = reqs._canonical_simple(line)
        if simple is None:
            continue
        fast += 1
        # packaging accepts every line the fast path takes, and spells it the same.
        assert reqs._canonical_by_packaging(line, "packages") == simple, line
    assert fast > 500  # the corpus reaches the fast path, not only packaging


@pytest.mark.parametrize(
    ("line", "canonical"),
    [
        ("Scikit_Learn>=1.5,<2", "scikit-learn<2,>=1.5"),
        ("zope.Interface~=5.1", "zope-interface~=5.1"),
        ("numpy!=1.0,==1.2", "numpy!=1.0,==1.2"),
    ],
)
def test_examples(line: str, canonical: str) -> None:
    assert reqs._canonical_simple(line) == canonical
    assert reqs._canonical(line, "packages") == canonical


@pytest.mark.parametrize(
    "line",
    [
        "numpy>=1,>=1.0",  # equal specifiers: packaging keeps one, which this does not guess
        "numpy >= 1",  # spaces
        "numpy>=1.0a1",  # not a plain release
        "numpy==1.*",
        "numpy[extra]>=1",
        "numpy>=1; python_version > '3'",
        "numpy @ https://example.invalid/numpy.whl",
        "numpy~=1",  # packaging refuses a one-part ~=
    ],
)
def test_anything_else_goes_to_packaging(line: str) -> None:
    assert reqs._canonical_simple(line) is None


def test_the_guards_hold_on_the_fast_path() -> None:
    with pytest.raises(SpecError, match="provided to every environment"):
        reqs.normalize(["Jupyter_Runtimeenv>=0.1"])
    with pytest.raises(SpecError, match="would break the workers"):
        reqs.normalize(["cloudpickle<1"])
    assert reqs.normalize(["cloudpickle>=3.0"])["packages"] == ["cloudpickle>=3.0"]


def test_parsing_a_spec_of_simple_lines_imports_no_packaging() -> None:
    """A cached CLI build parses the spec (issue 19 item 4, ready in ≤ 100 ms): simple lines
    need none of ``packaging``; a line with a marker does (so the check can fail)."""
    code = (
        "import sys\n"
        "from jupyter_runtimeenv.plugins.registry import default_registry\n"
        "from jupyter_runtimeenv.spec import TRUSTED\n"
        "from jupyter_runtimeenv.spec.parse import parse\n"
        "parse({'pip': sys.argv[1:]}, registry=default_registry(), policy=TRUSTED)\n"
        "print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] == 'packaging'))\n"
    )
    for packages, loaded in (
        (["pandas", "scikit-learn", "pandas>=0.0.7"], False),
        (["pandas; python_version > '3'"], True),
    ):
        done = subprocess.run(
            [sys.executable, "-c", code, *packages],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        assert ("'packaging." in done.stdout) == loaded, done.stdout
