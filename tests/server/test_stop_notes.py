"""The notes a Stop leaves a kernel (``workers/stops.py``): taken once, trusted while fresh,
withdrawn when the kill failed, unreadable ones ignored."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from jupyter_runtimeenv.workers import stops


@pytest.fixture
def notes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(stops.NOTES_ENV_VAR, str(tmp_path))
    return tmp_path


def test_a_note_is_taken_once(notes: Path) -> None:
    stops.leave(str(notes), 4242, "was stopped from the sidebar by Ada")
    assert os.listdir(notes) == ["4242"]  # written whole: no temporary file left
    assert stops.take(4242) == "was stopped from the sidebar by Ada"
    assert stops.take(4242) is None
    assert os.listdir(notes) == []


def test_withdrawn_stale_and_unreadable_notes_say_nothing(notes: Path) -> None:
    stops.leave(str(notes), 1, "was stopped from the sidebar")
    stops.withdraw(str(notes), 1)
    assert stops.take(1) is None
    (notes / "2").write_text(json.dumps({"reason": "old", "at": time.time() - stops.MAX_AGE - 1}))
    assert stops.take(2) is None
    (notes / "3").write_text("{not json")
    assert stops.take(3) is None
    (notes / "4").write_text(json.dumps(["reason", 1]))
    assert stops.take(4) is None
    assert stops.take(5) is None  # no note at all


def test_without_a_notes_directory_nothing_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(stops.NOTES_ENV_VAR, raising=False)
    stops.leave(str(tmp_path), 7, "was stopped from the sidebar")
    assert stops.take(7) is None
    assert os.listdir(tmp_path) == ["7"]
