from __future__ import annotations

import importlib

import pytest

import jupyter_runtimeenv


def test_all_is_sorted_and_unique() -> None:
    names = [n for n in jupyter_runtimeenv.__all__ if n != "__version__"]
    assert names == sorted(names, key=lambda n: (n[0].islower(), n))
    assert len(set(jupyter_runtimeenv.__all__)) == len(jupyter_runtimeenv.__all__)


def test_every_public_name_resolves() -> None:
    for name in jupyter_runtimeenv.__all__:
        assert getattr(jupyter_runtimeenv, name) is not None, name


def test_all_lists_every_public_exception() -> None:
    errors = importlib.import_module("jupyter_runtimeenv.errors")
    missing = set(errors.__all__) - set(jupyter_runtimeenv.__all__)
    assert not missing


def test_unknown_attribute_raises() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        jupyter_runtimeenv.no_such_name  # noqa: B018
