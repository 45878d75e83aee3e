"""Threat: a Dask node follows ``..`` in a manifest and lays files outside its cache.

A manifest comes from whoever can reach the scheduler. Its blob names were checked, but not
its placeholders (``jre-blob://tree/<key>/<name>``) nor its trees' listings: ``name`` or a
listed path holding ``..`` (or absolute) made the node write outside its cache.

Rule under test (``dask/manifest.py`` ``Manifest.from_json``): placeholders and listings
are checked whole before any path is made: plain names, plain relative paths, sha256 keys
the manifest lists, read-only blob modes. Real files: a real manifest of a real tree, then
each field made hostile the way a forged driver would, through the node's entry point.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv import parse
from jupyter_runtimeenv.dask.manifest import (
    PREFIX,
    Manifest,
    build_manifest,
    materialize_manifest,
    missing,
    put_blob,
    read_blob,
)


@pytest.fixture
def honest(tmp_path: Path) -> dict[str, Any]:
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "sub" / "a.py").write_text("A = 1\n")
    single = tmp_path / "helper.py"
    single.write_text("X = 2\n")
    spec = parse({"working_dir": str(work), "py_modules": [str(single)]})
    manifest = build_manifest(spec, tmp_path / "driver-store")
    data: dict[str, Any] = json.loads(json.dumps(manifest.to_json()))
    return data


def _forgeries(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    tree = data["spec"]["working_dir"].split("/")[3]
    file_key = data["spec"]["py_modules"][0].split("/")[3]
    out = []

    def forge(case: str, change: Any) -> None:
        forged = copy.deepcopy(data)
        change(forged)
        out.append((case, forged))

    def set_wd(value: str) -> Any:
        return lambda d: d["spec"].__setitem__("working_dir", value)

    def set_rel(rel: str) -> Any:
        return lambda d: d["trees"][tree][0].__setitem__(0, rel)

    forge("name ..", set_wd(f"{PREFIX}tree/{tree}/.."))
    forge("name with a slash", set_wd(f"{PREFIX}tree/{tree}/../../../escaped"))
    forge("key ..", set_wd(f"{PREFIX}tree/../x"))
    forge("key not listed", set_wd(f"{PREFIX}tree/{'a' * 64}/x"))
    forge("kind unknown", set_wd(f"{PREFIX}dir/{tree}/x"))
    forge(
        "file name ..",
        lambda d: d["spec"].__setitem__("py_modules", [f"{PREFIX}file/{file_key}/.."]),
    )
    forge("listed path ..", set_rel("../../../../escaped.py"))
    forge("listed path absolute", set_rel("/tmp/escaped.py"))
    forge("listed path with a dot", set_rel("sub/./a.py"))
    forge("listed path empty part", set_rel("sub//a.py"))
    forge("writable mode", lambda d: d["trees"][tree][0].__setitem__(1, 0o666))
    forge("key not a sha", lambda d: d["trees"].__setitem__("../x", d["trees"].pop(tree)))
    return out


def _as_a_node(data: dict[str, Any], node: Path, store: Path) -> dict[str, Any]:
    """What a node does with a manifest it is offered (``NodeAgent.offer``, then staging)."""
    manifest = Manifest.from_json(data)
    for name in missing(manifest, node):
        put_blob(node, name, read_blob(store, name))
    return materialize_manifest(manifest, node)


def test_every_hostile_placeholder_and_listing_is_refused_before_a_path_is_made(
    honest: dict[str, Any], tmp_path: Path
) -> None:
    node = tmp_path / "node"
    for case, forged in _forgeries(honest):
        with pytest.raises(ValueError, match="manifest: ") as info:
            _as_a_node(forged, node, tmp_path / "driver-store")
        assert "\n" not in str(info.value), case
    escaped = [p for p in tmp_path.rglob("escaped*")]
    assert escaped == []
    assert not (node / "dask").exists() or not any((node / "dask").rglob("*.py"))


def test_the_honest_manifest_still_lays_out(honest: dict[str, Any], tmp_path: Path) -> None:
    spec = _as_a_node(honest, tmp_path / "node", tmp_path / "driver-store")
    assert (Path(spec["working_dir"]) / "sub" / "a.py").read_text() == "A = 1\n"
