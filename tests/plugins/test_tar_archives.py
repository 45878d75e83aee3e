"""Tar archives (``.tar.gz``/``.tgz``/``.tar``) through the same ``SafeTree`` as zips: the
zip's hostile cases and a tar's own (hard links, devices, fifos, symlink chains), and real
builds of working_dir and py_modules."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.errors import BuildError
from jupyter_runtimeenv.plugins._untar import safe_untar

Agent = Callable[..., Any]
#: (name, type, content or link target)
Member = tuple[str, bytes, str]


def tar_bytes(members: list[Member], mode: str = "w:gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            payload = b""
            if kind == tarfile.REGTYPE:
                payload = data.encode()
                info.size = len(payload)
            elif kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = data
            elif kind == tarfile.DIRTYPE:
                info.mode = 0o755
            tf.addfile(info, io.BytesIO(payload) if payload else None)
    return buf.getvalue()


F, D, S, H = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE


@pytest.mark.parametrize(
    ("members", "words"),
    [
        ([("/etc/evil", F, "x")], "absolute paths"),
        ([("../evil", F, "x")], "'..'"),
        ([("ok/../../evil", F, "x")], "'..'"),
        ([("C:/windows/evil", F, "x")], "absolute paths"),
        ([("link", S, "/etc")], "absolute links are not allowed"),
        ([("link", S, "../../outside")], "outside the archive's root"),
        # A chain: each link alone looks harmless until the next one is made.
        ([("a", S, "b/../.."), ("b", S, "."), ("c", F, "x")], "outside the archive's root"),
        ([("d", S, "."), ("d/e", S, "../outside")], "outside the archive's root"),
        # A file then written through a symlinked directory would escape.
        ([("dir", S, "../"), ("dir/evil", F, "x")], "outside the archive's root"),
        ([("hard", H, "/etc/passwd")], "absolute paths"),
        ([("hard", H, "../outside")], "'..'"),
        ([("hard", H, "not-in-archive")], "not a file unpacked inside"),
        ([("dev", tarfile.CHRTYPE, "")], "devices, fifos"),
        ([("blk", tarfile.BLKTYPE, "")], "devices, fifos"),
        ([("fifo", tarfile.FIFOTYPE, "")], "devices, fifos"),
    ],
)
def test_hostile_tars_are_refused(tmp_path: Path, members: list[Member], words: str) -> None:
    archive = tmp_path / "bad.tar.gz"
    archive.write_bytes(tar_bytes(members))
    dest = tmp_path / "root" / "out"
    dest.mkdir(parents=True)
    with pytest.raises(BuildError) as info:
        safe_untar(archive, dest)
    assert words in str(info.value)
    assert not (tmp_path / "evil").exists()
    assert not (tmp_path / "root" / "evil").exists()
    assert not (tmp_path / "root" / "outside").exists()


def test_links_inside_the_root_and_hard_links_are_kept(tmp_path: Path) -> None:
    archive = tmp_path / "ok.tgz"
    archive.write_bytes(
        tar_bytes(
            [
                ("pkg", D, ""),
                ("pkg/data.txt", F, "hello"),
                ("pkg/alias.txt", S, "data.txt"),
                ("pkg/sub", S, "."),
                ("copy.txt", H, "pkg/data.txt"),
            ]
        )
    )
    dest = tmp_path / "out"
    dest.mkdir()
    assert safe_untar(archive, dest) == 5  # the hard link adds no bytes
    assert (dest / "pkg" / "alias.txt").read_text() == "hello"
    assert (dest / "pkg" / "sub" / "data.txt").read_text() == "hello"
    assert (dest / "copy.txt").read_text() == "hello"
    assert not (dest / "copy.txt").is_symlink()
    assert (dest / "copy.txt").stat().st_ino == (dest / "pkg" / "data.txt").stat().st_ino


def test_not_a_tar_is_a_clear_error(tmp_path: Path) -> None:
    archive = tmp_path / "broken.tar.gz"
    archive.write_bytes(b"\x1f\x8b not really gzip")
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(BuildError, match="not a readable tar archive"):
        safe_untar(archive, dest)


@pytest.mark.parametrize("name", ["code.tar.gz", "code.tgz", "code.tar"])
async def test_working_dir_from_a_tar(
    make_agent: Agent, run_in: Callable[..., Any], tmp_path: Path, name: str
) -> None:
    archive = tmp_path / name
    mode = "w" if name.endswith(".tar") else "w:gz"
    # One top directory, as `tar czf code.tgz code` makes: its content becomes the cwd.
    archive.write_bytes(
        tar_bytes([("code", D, ""), ("code/helper.py", F, "VALUE = 7\n")], mode=mode)
    )
    agent = await make_agent()
    ctx = await agent.get_or_create({"working_dir": str(archive)}, "t")
    assert run_in(ctx, "import helper, os; print(json.dumps([helper.VALUE, os.getcwd()]))") == [
        7,
        ctx.cwd,
    ]


async def test_py_modules_from_a_tar_and_a_hostile_one_fails_the_build(
    make_agent: Agent, run_in: Callable[..., Any], tmp_path: Path
) -> None:
    good = tmp_path / "mods.tar.gz"
    good.write_bytes(tar_bytes([("tarmod", D, ""), ("tarmod/__init__.py", F, "X = 'tar'\n")]))
    agent = await make_agent()
    ctx = await agent.get_or_create({"py_modules": [str(good)]}, "t")
    assert run_in(ctx, "import tarmod; print(json.dumps(tarmod.X))") == "tar"

    bad = tmp_path / "bad.tgz"
    bad.write_bytes(tar_bytes([("x", S, "../../../etc")]))
    with pytest.raises(BuildError, match="outside the archive's root"):
        await agent.get_or_create({"py_modules": [str(bad)]}, "t")
