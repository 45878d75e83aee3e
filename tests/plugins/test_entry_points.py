"""``plugins/_entry_points.py``: one group's entry points, read without importlib.metadata,
compared with what ``importlib.metadata.entry_points(group=...)`` gives for the same
``sys.path`` (real directories, real files; the comparison is the test)."""

from __future__ import annotations

import importlib
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from jupyter_runtimeenv.plugins import _entry_points
from jupyter_runtimeenv.plugins._entry_points import entry_points_of
from jupyter_runtimeenv.plugins.registry import ENTRY_POINT_GROUP

GROUP = "jre_test.plugins"


def stdlib(group: str) -> dict[str, str]:
    importlib.invalidate_caches()  # metadata's directory listings, keyed by mtime
    return {ep.name: ep.value for ep in metadata.entry_points(group=group)}


def dist(where: Path, dirname: str, entry_points: str | bytes | None) -> Path:
    info = where / dirname
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dirname.split('-')[0]}\n")
    if isinstance(entry_points, bytes):
        (info / "entry_points.txt").write_bytes(entry_points)
    elif entry_points is not None:
        (info / "entry_points.txt").write_text(entry_points)
    return info


@pytest.mark.parametrize(
    "group", [ENTRY_POINT_GROUP, "console_scripts", "jupyter_client.kernel_provisioners"]
)
def test_the_installed_groups_read_as_importlib_metadata_reads_them(group: str) -> None:
    assert entry_points_of(group) == stdlib(group)
    if group == ENTRY_POINT_GROUP:  # the check sees something: this package's own plugins
        assert entry_points_of(group)["pip"] == "jupyter_runtimeenv.plugins.pip:PipPlugin"


def test_precedence_names_comments_and_sections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    text = (
        "# a comment\n"
        "[other]\nx = other:X\n\n"
        f"[{GROUP}]\n"
        "  spaced   =   pkg.mod : Cls  \n"
        "# inside = not:This\n"
        "dup = early:E\n"
        "dup = late:L\n"
        f"[[{GROUP}]]\n"  # strip('[]'): the same section again
        "again = pkg:Again\n"
    )
    dist(first, "Alpha_Pkg-1.0.dist-info", text)
    # The same project again, later on the path: only the first counts.
    dist(second, "alpha.pkg-2.0.dist-info", f"[{GROUP}]\nshadowed = no:No\n")
    dist(second, "beta-1.0.dist-info", f"[{GROUP}]\nbeta = beta:B\ndup = beta:Dup\n")
    dist(second, "gamma-1.0.egg-info", f"[{GROUP}]\ngamma = gamma:G\n")
    dist(second, "nothing-1.0.dist-info", None)
    (second / "single-1.0.egg-info").write_text("Metadata-Version: 1.0\nName: single\n")
    monkeypatch.setattr(sys, "path", [str(first), str(tmp_path / "missing"), str(second)])
    expected = stdlib(GROUP)
    assert entry_points_of(GROUP) == expected
    assert expected["spaced"] == "pkg.mod : Cls"
    assert expected["again"] == "pkg:Again"
    assert "shadowed" not in expected
    assert {"beta", "gamma"} <= expected.keys()


def test_the_working_directory_on_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dist(tmp_path, "here-1.0.dist-info", f"[{GROUP}]\nhere = here:H\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [""])
    assert entry_points_of(GROUP) == stdlib(GROUP) == {"here": "here:H"}


def fallbacks() -> list[str]:
    return ["zip", "egg", "upper", "no-equals", "not-utf8", "finder"]


@pytest.mark.parametrize("case", fallbacks())
def test_what_only_importlib_metadata_reads_is_left_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """Each case makes the scan give up (``_NotExact``); the answer is then importlib's own,
    whatever that is (an error included)."""
    where = tmp_path / "site"
    dist(where, "plain-1.0.dist-info", f"[{GROUP}]\nplain = plain:P\n")
    path = [str(where)]
    if case == "zip":
        archive = tmp_path / "bundle.zip"
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr("zipped-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: zipped\n")
            z.writestr("zipped-1.0.dist-info/entry_points.txt", f"[{GROUP}]\nz = zipped:Z\n")
        path.append(str(archive))
    elif case == "egg":
        egg = tmp_path / "old-1.0.egg"
        dist(egg, "EGG-INFO", f"[{GROUP}]\nold = old:O\n")
        path.append(str(egg))
    elif case == "upper":
        dist(where, "Upper-1.0.DIST-INFO", f"[{GROUP}]\nupper = upper:U\n")
    elif case == "no-equals":
        dist(where, "broken-1.0.dist-info", f"[{GROUP}]\nno equals sign here\n")
    elif case == "not-utf8":
        dist(where, "latin-1.0.dist-info", f"[{GROUP}]\nname = caf\xe9:C\n".encode("latin-1"))
    elif case == "finder":

        class Finder:
            @staticmethod
            def find_spec(*_args: object) -> None:
                return None

            @staticmethod
            def find_distributions(context: object = None) -> list[metadata.Distribution]:
                return [metadata.Distribution.at(where / "plain-1.0.dist-info")]

        monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    monkeypatch.setattr(sys, "path", path)
    with pytest.raises(_entry_points._NotExact):
        _entry_points._scan(GROUP)
    try:
        expected: object = stdlib(GROUP)
    except Exception as exc:  # importlib.metadata's own failure, passed on as it is
        expected = type(exc)
    try:
        got: object = entry_points_of(GROUP)
    except Exception as exc:
        got = type(exc)
    assert got == expected
    if case in ("zip", "finder", "egg"):  # what the scan could not read is found
        assert isinstance(expected, dict)
        assert expected.keys() & {"z", "old", "plain"}
