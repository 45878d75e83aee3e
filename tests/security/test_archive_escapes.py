"""Threat: an archive (working_dir / py_modules zip, from a user or a web server) writes or
points outside its extraction root.

The rule under test (``plugins/_unpack.py``): member names are relative without ``..``;
nothing is written through a link that resolves outside; a symlink is kept only if it
resolves inside the root on the real file system, checked as it is built and again once the
archive is complete. Every refused archive is checked for what it must not have done: no
file appears next to the root, nothing reads from outside.
"""

from __future__ import annotations

import asyncio
import io
import os
import stat
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.errors import BuildError
from jupyter_runtimeenv.plugins._unpack import SafeTree, safe_unzip

Member = tuple[str, str, str]  # (name, content or link target, "file" | "link" | "dir")


def zip_of(members: list[Member], mode: int = 0o644) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w") as zf:
        warnings.simplefilter("ignore")  # duplicate names are part of the attack
        for name, content, kind in members:
            info = zipfile.ZipInfo(name)
            if kind == "link":
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
            elif kind == "dir":
                info.external_attr = (stat.S_IFDIR | 0o755) << 16 | 0x10
            else:
                info.external_attr = (stat.S_IFREG | mode) << 16
            zf.writestr(info, content)
    return buf.getvalue()


@pytest.fixture
def box(tmp_path: Path) -> dict[str, Path]:
    """A root to unpack into, inside ``outer``; ``secret`` is a file outside the root."""
    outer = tmp_path / "outer"
    root = outer / "root"
    root.mkdir(parents=True)
    secret = outer / "secret.txt"
    secret.write_text("SECRET")
    return {"outer": outer, "root": root, "secret": secret, "tmp": tmp_path}


def unpack(box: dict[str, Path], members: list[Member]) -> None:
    archive = box["tmp"] / "a.zip"
    archive.write_bytes(zip_of(members))
    safe_unzip(archive, box["root"])


def nothing_escaped(box: dict[str, Path]) -> None:
    assert sorted(p.name for p in box["outer"].iterdir()) == ["root", "secret.txt"]
    assert box["secret"].read_text() == "SECRET"
    for dirpath, dirs, files in os.walk(box["root"]):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            real = os.path.realpath(path)
            assert real.startswith(str(box["root"].resolve())), f"{path} -> {real}"


REFUSED: dict[str, list[Member]] = {
    # Names.
    "absolute member": [("/tmp/evil", "x", "file")],
    "dotdot member": [("../evil", "x", "file")],
    "dotdot inside member": [("ok/../../evil", "x", "file")],
    "drive member": [("C:/evil", "x", "file")],
    # Links, text-level.
    "absolute link": [("l", "/etc/passwd", "link")],
    "absolute link to a dir": [("l", "/etc", "link")],
    "dotdot link": [("l", "../secret.txt", "link")],
    # A link inside a link: text says root/a/.. = root, the disk says outer.
    "link through a link": [("a", ".", "link"), ("a/b", "../secret.txt", "link")],
    "link to link to outside": [
        ("l1", "l2", "link"),
        ("l2", "l3", "link"),
        ("l3", "../secret.txt", "link"),
    ],
    "link to dir link then up": [
        ("d", ".", "link"),
        ("up", "d/../secret.txt", "link"),
    ],
    # The first link resolves inside when it is made (x is missing); x -> . appearing later
    # makes it escape. Only the check of the finished tree sees it.
    "late link changes an earlier one": [
        ("a", "x/y/../../secret.txt", "link"),
        ("x", ".", "link"),
    ],
    "late link to a directory": [
        ("pkg/data", "x/y/../../..", "link"),
        ("pkg/x", ".", "link"),
    ],
    # Writing through a previously extracted link that (by then) leads outside.
    "member written through an escaping link": [
        ("a", "x/y/../..", "link"),
        ("x", ".", "link"),
        ("a/evil.txt", "pwned", "file"),
    ],
    "member replacing a link": [("l", "target.txt", "link"), ("l", "pwned", "file")],
    "dir member through a link chain": [
        ("a", ".", "link"),
        ("a/b", ".", "link"),
        ("a/b/c/", "", "dir"),
        ("a/b/c/../../../evil.txt", "pwned", "file"),
    ],
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_escapes_are_refused(box: dict[str, Path], case: str) -> None:
    with pytest.raises(BuildError, match="refusing to unpack"):
        unpack(box, REFUSED[case])
    nothing_escaped_before_cleanup(box)


def nothing_escaped_before_cleanup(box: dict[str, Path]) -> None:
    # The caller removes a failed target; until then nothing outside it was written,
    # and nothing it leaves could be read through except links still to be removed.
    assert sorted(p.name for p in box["outer"].iterdir()) == ["root", "secret.txt"]
    assert box["secret"].read_text() == "SECRET"


KEPT: dict[str, list[Member]] = {
    "link to a file": [("pkg/real.txt", "content", "file"), ("pkg/alias.txt", "real.txt", "link")],
    "link to a link": [
        ("real.txt", "content", "file"),
        ("one", "real.txt", "link"),
        ("two", "one", "link"),
        ("pkg/three", "../two", "link"),
    ],
    "link to a directory": [
        ("data/table.csv", "content", "file"),
        ("pkg/data", "../data", "link"),
    ],
    "member written through an inside link": [
        ("data/", "", "dir"),
        ("alias", "data", "link"),
        ("alias/table.csv", "content", "file"),
    ],
    "dangling link inside": [("later", "not/there/yet", "link")],
}


@pytest.mark.parametrize("case", sorted(KEPT))
def test_links_that_stay_inside_are_kept(box: dict[str, Path], case: str) -> None:
    unpack(box, KEPT[case])
    nothing_escaped(box)
    root = box["root"]
    if case != "dangling link inside":
        reads = [
            p.read_text()
            for p in root.rglob("*")
            if p.is_file() and (p.is_symlink() or p.name == "table.csv")
        ]
        assert reads
        assert set(reads) == {"content"}


def test_owner_only_members_stay_owner_only(box: dict[str, Path]) -> None:
    archive = box["tmp"] / "modes.zip"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, mode in [("private.txt", 0o600), ("tool.sh", 0o700), ("open.txt", 0o666)]:
            info = zipfile.ZipInfo(name)
            info.create_system = 3
            info.external_attr = (stat.S_IFREG | mode) << 16
            zf.writestr(info, "x")
    archive.write_bytes(buf.getvalue())
    safe_unzip(archive, box["root"])
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in box["root"].iterdir()}
    # Owner-only kept; nothing group/other-writable even when the archive says so.
    assert modes == {"private.txt": 0o600, "tool.sh": 0o700, "open.txt": 0o644}


def test_safe_tree_is_the_reusable_unit_for_other_archive_formats(box: dict[str, Path]) -> None:
    """A tar reader calls the same methods: hardlinks only to files already inside."""
    tree = SafeTree(box["root"])
    tree.file("lib/real.so.1", io.BytesIO(b"elf"), 0o755)
    tree.symlink("lib/real.so", "real.so.1")
    tree.hardlink("lib/copy.so", "lib/real.so.1")
    with pytest.raises(BuildError, match="hardlink"):
        tree.hardlink("evil", "lib/missing")
    assert tree.finish() == 3
    assert (box["root"] / "lib" / "copy.so").read_bytes() == b"elf"


def test_link_to_the_root_parent_is_refused_by_the_unit(box: dict[str, Path]) -> None:
    tree = SafeTree(box["root"])
    with pytest.raises(BuildError, match="resolves outside"):
        tree.symlink("up", "..")
    with pytest.raises(BuildError, match="refusing to unpack"):
        tree.hardlink("h", "../secret.txt")
    nothing_escaped(box)


Agent = Callable[..., Any]


@pytest.mark.parametrize("field", ["working_dir", "py_modules"])
async def test_an_escaping_zip_fails_the_env_and_leaves_nothing(
    make_agent: Agent, tmp_path: Path, cache_dir: Path, field: str
) -> None:
    """End to end: a link chain to /etc/passwd used to end READY; now the env fails."""
    archive = tmp_path / "proj.zip"
    archive.write_bytes(
        zip_of(
            [
                ("proj/hello.py", "X = 1\n", "file"),
                ("proj/a", "x/y/../../../../../../../../../../etc/passwd", "link"),
                ("proj/x", ".", "link"),
            ]
        )
    )
    agent = await make_agent()
    value: Any = str(archive) if field == "working_dir" else [str(archive)]
    with pytest.raises(BuildError, match="refusing to unpack 'proj/a'"):
        await agent.get_or_create({field: value}, "t")
    assert await asyncio.to_thread(lambda: list((cache_dir / "tmp").iterdir())) == []
    assert await asyncio.to_thread(lambda: list((cache_dir / "resources").rglob("passwd"))) == []


async def test_a_link_out_of_the_single_top_directory_is_refused_after_flattening(
    make_agent: Agent, tmp_path: Path, cache_dir: Path
) -> None:
    """``top/l -> ../x`` is inside when unpacked; a working_dir's single top directory is
    moved up one level, and then it would point next to the env's directory."""
    archive = tmp_path / "top.zip"
    archive.write_bytes(
        zip_of([("top/hello.py", "X = 1\n", "file"), ("top/l", "../neighbour", "link")])
    )
    agent = await make_agent()
    with pytest.raises(BuildError, match="refusing to unpack 'l'"):
        await agent.get_or_create({"working_dir": str(archive)}, "t")
    assert await asyncio.to_thread(lambda: list((cache_dir / "tmp").iterdir())) == []
