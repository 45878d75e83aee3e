"""The manifest without a cluster: what the driver lists and stores, what a node asks for,
checks and lays out, and that no driver path survives into the node's spec."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from jupyter_runtimeenv import parse
from jupyter_runtimeenv.dask.manifest import (
    PREFIX,
    build_manifest,
    materialize_manifest,
    missing,
    put_blob,
    read_blob,
)
from jupyter_runtimeenv.errors import SpecError
from jupyter_runtimeenv.plugins._hashing import hash_tree


def make_sources(root: Path) -> tuple[Path, Path, Path]:
    work = root / "work"
    (work / "sub").mkdir(parents=True)
    (work / "data.txt").write_text("data")
    (work / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (work / "sub" / "run.sh").chmod(0o755)
    (work / "secret.txt").write_text("owner only")
    (work / "secret.txt").chmod(0o600)
    (work / "ignored.log").write_text("left out")
    (work / ".gitignore").write_text("*.log\n")
    pkg = root / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("VALUE = 1\n")
    single = root / "helper.py"
    single.write_text("X = 2\n")
    return work, pkg, single


def test_a_node_gets_exactly_the_content_and_never_a_driver_path(tmp_path: Path):
    work, pkg, single = make_sources(tmp_path / "driver-files")
    spec = parse(
        {
            "working_dir": str(work),
            "py_modules": [str(pkg), str(single)],
            "driver_sys_path": [str(pkg.parent), str(tmp_path / "does-not-exist")],
        }
    )
    manifest = build_manifest(spec, tmp_path / "driver-store")
    text = json.dumps(manifest.to_json())
    assert str(tmp_path / "driver-files") not in text  # only placeholders and content hashes
    assert manifest.spec["working_dir"].startswith(PREFIX + "tree/")
    assert len(manifest.spec["driver_sys_path"]) == 1  # the missing entry is dropped
    listed = {rel for rel, *_ in manifest.trees[manifest.spec["working_dir"].split("/")[3]]}
    assert listed == {".gitignore", "data.txt", "secret.txt", "sub/run.sh"}  # .gitignore kept

    # The driver's copies go; the node is served from the driver's store.
    shutil.rmtree(tmp_path / "driver-files")
    node_root = tmp_path / "node"
    wanted = missing(manifest, node_root)
    assert set(wanted) == set(manifest.blobs())
    for name in wanted:
        put_blob(node_root, name, read_blob(tmp_path / "driver-store", name))
    assert missing(manifest, node_root) == []

    node_spec = materialize_manifest(manifest, node_root)
    assert str(tmp_path / "driver-files") not in json.dumps(node_spec)
    laid_out = Path(node_spec["working_dir"])
    assert laid_out.is_relative_to(node_root)
    assert (laid_out / "data.txt").read_text() == "data"
    assert (laid_out / "sub" / "run.sh").stat().st_mode & 0o111
    assert not (laid_out / "ignored.log").exists()
    assert (laid_out / "secret.txt").stat().st_mode & 0o777 == 0o400  # stays owner-only
    module_dir, module_file = map(Path, node_spec["py_modules"])
    assert module_dir.name == "mypkg"
    assert (module_dir / "__init__.py").read_text() == "VALUE = 1\n"
    assert module_file.name == "helper.py"
    assert module_file.read_text() == "X = 2\n"
    # The node's layout hashes to what the driver listed: the same env content.
    digest = manifest.spec["working_dir"].split("/")[3]
    assert hash_tree(laid_out).digest == digest
    # And parses as a spec on the node.
    assert parse(node_spec).get("working_dir") == str(laid_out)


def test_a_blob_with_other_content_or_a_bad_name_is_refused(tmp_path: Path):
    sha = "0" * 64
    with pytest.raises(ValueError, match="arrived with other content"):
        put_blob(tmp_path, sha, b"not that")
    with pytest.raises(ValueError, match="not a blob name"):
        put_blob(tmp_path, "../../etc/passwd", b"")
    assert not any(tmp_path.rglob("*"))


def test_an_oversized_sys_path_entry_names_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    big = tmp_path / "big"
    big.mkdir()
    (big / "blob.bin").write_bytes(b"x" * 2048)
    monkeypatch.setenv("JUPYTER_RUNTIMEENV_MAX_UPLOAD_BYTES", "1024")
    spec = parse({"driver_sys_path": [str(big)]})
    with pytest.raises(SpecError) as info:
        build_manifest(spec, tmp_path / "store")
    assert info.value.field == "driver_sys_path.0"
    assert "blob.bin" in str(info.value)
    assert "driver_sys_path: false" in str(info.value)
