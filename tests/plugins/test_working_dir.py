"""``working_dir``: hashing with excludes, the per-file store, zips, URLs and limits."""

from __future__ import annotations

import asyncio
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.errors import BuildError, SpecError
from jupyter_runtimeenv.plugins import _hashing
from jupyter_runtimeenv.plugins.working_dir import WorkingDirPlugin
from jupyter_runtimeenv.spec import parse

Agent = Callable[..., Any]


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def listing(root: str | Path) -> list[str]:
    out = []
    for dirpath, _dirs, files in os.walk(root):
        out += [os.path.relpath(os.path.join(dirpath, f), root) for f in files]
    return sorted(out)


def test_default_excludes_gitignore_and_spec_excludes(tmp_path: Path) -> None:
    src = make_tree(
        tmp_path / "src",
        {
            "main.py": "x",
            "data/keep.csv": "1",
            "data/big.bin": "0" * 10,
            ".git/HEAD": "ref",
            "__pycache__/main.cpython-311.pyc": "",
            ".venv/bin/python": "",
            ".ipynb_checkpoints/nb.ipynb": "",
            ".gitignore": "*.log\n/build/\n",
            "run.log": "",
            "build/out.o": "",
            "sub/.gitignore": "secret.txt\n",
            "sub/secret.txt": "s",
            "sub/public.txt": "p",
        },
    )
    tree = _hashing.hash_tree(src, ["data/*.bin"])
    assert [e.rel for e in tree.entries] == [
        ".gitignore",
        "data/keep.csv",
        "main.py",
        "sub/.gitignore",
        "sub/public.txt",
    ]
    # Excluded files do not change the id; kept ones do.
    spec = {"working_dir": str(src), "excludes": ["data/*.bin"]}
    before = parse(spec).env_id
    (src / "run.log").write_text("changed")
    (src / "sub" / "secret.txt").write_text("changed")
    assert parse(spec).env_id == before
    (src / "main.py").write_text("changed")
    assert parse(spec).env_id != before


def test_id_follows_content_not_location(tmp_path: Path) -> None:
    a = make_tree(tmp_path / "a", {"m.py": "1"})
    b = make_tree(tmp_path / "b", {"m.py": "1"})
    assert parse({"working_dir": str(a)}).env_id == parse({"working_dir": str(b)}).env_id
    os.chmod(b / "m.py", 0o755)  # the mode is part of the content
    assert parse({"working_dir": str(a)}).env_id != parse({"working_dir": str(b)}).env_id


def test_memo_makes_rehashing_read_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = make_tree(tmp_path / "src", {f"f{i}.py": str(i) for i in range(20)})
    old = 1_600_000_000
    for f in src.iterdir():
        os.utime(f, (old, old))  # older than the racy window
    first = _hashing.hash_tree(src)
    opened: list[str] = []
    real_open = open

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    assert _hashing.hash_tree(src).digest == first.digest
    assert opened == []
    (src / "f3.py").write_text("changed")
    _hashing.hash_tree(src)
    assert opened == [str(src / "f3.py")]


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("/does/not/exist", "does not exist"),
        ("gcs://_ray_pkg_0123.zip", "a Ray feature"),  # s3:// works: tests/plugins/test_remote.py
        (42, "expected a local path"),
    ],
)
def test_bad_values_are_refused(value: Any, words: str) -> None:
    with pytest.raises(SpecError) as info:
        parse({"working_dir": value})
    assert info.value.field == "working_dir"
    assert words in info.value.reason


def test_size_limit_names_the_largest_files(tmp_path: Path) -> None:
    src = make_tree(
        tmp_path / "src", {"small.txt": "x", "huge.bin": "0" * 5000, "mid.bin": "0" * 900}
    )
    from jupyter_runtimeenv.plugins import PluginRegistry, default_registry

    plugins = [default_registry().for_field(f) for f in ("pip", "py_modules")]
    registry = PluginRegistry([WorkingDirPlugin(max_bytes=4096), *[p for p in plugins if p]])
    with pytest.raises(SpecError) as info:
        parse({"working_dir": str(src)}, registry=registry)
    assert info.value.field == "working_dir"
    assert "huge.bin" in info.value.reason
    assert info.value.reason.index("huge.bin") < info.value.reason.index("mid.bin")
    assert parse({"working_dir": str(src), "excludes": ["*.bin"]}, registry=registry)


async def test_becomes_cwd_and_first_on_sys_path(
    make_agent: Agent, run_in: Callable[..., Any], tmp_path: Path
) -> None:
    src = make_tree(tmp_path / "src", {"helper.py": "VALUE = 41\n", "data.txt": "hello"})
    agent = await make_agent()
    ctx = await agent.get_or_create({"working_dir": str(src)}, "t")
    assert ctx.cwd == ctx.extra_paths[0]
    out = run_in(
        ctx,
        "import helper, os; print(json.dumps([helper.VALUE, open('data.txt').read(),"
        " os.path.dirname(helper.__file__)]))",
    )
    assert out == [41, "hello", ctx.cwd]
    assert ctx.cwd != str(src)  # a copy the agent owns, not the user's directory


def _inodes(root: str) -> dict[str, int]:
    return {rel: os.stat(os.path.join(root, rel)).st_ino for rel in listing(root)}


async def test_one_changed_file_is_the_only_one_stored_again(
    make_agent: Agent, tmp_path: Path, cache_dir: Path
) -> None:
    src = make_tree(tmp_path / "src", {f"pkg/m{i}.py": f"# {i}\n" for i in range(30)})
    agent = await make_agent()
    first = await agent.get_or_create({"working_dir": str(src)}, "t")
    (src / "pkg" / "m7.py").write_text("# seven, changed\n")
    second = await agent.get_or_create({"working_dir": str(src)}, "t")
    assert first.cwd != second.cwd
    assert first.cwd is not None
    assert second.cwd is not None
    before = await asyncio.to_thread(_inodes, first.cwd)
    after = await asyncio.to_thread(_inodes, second.cwd)
    changed = sorted(rel for rel in after if after[rel] != before[rel])
    assert changed == ["pkg/m7.py"]  # the 29 others are the same blobs, linked
    blobs = await asyncio.to_thread(listing, cache_dir / "shared" / "blobs")
    assert len(blobs) == 31  # 30 contents + the changed one, each stored once


async def test_an_edited_copy_does_not_leak_into_the_next_env(
    make_agent: Agent, tmp_path: Path
) -> None:
    src = make_tree(tmp_path / "src", {"a.txt": "original", "b.txt": "b"})
    agent = await make_agent()
    first = await agent.get_or_create({"working_dir": str(src)}, "t")
    assert first.cwd is not None
    edited = Path(first.cwd) / "a.txt"
    # A worker (as root, read-only bits do not stop it) writes through its link.
    await asyncio.to_thread(os.chmod, edited, 0o644)
    await asyncio.to_thread(edited.write_text, "edited by a worker")
    (src / "b.txt").write_text("b2")  # a new env for the same a.txt content
    second = await agent.get_or_create({"working_dir": str(src)}, "t")
    assert second.cwd is not None
    assert await asyncio.to_thread((Path(second.cwd) / "a.txt").read_text) == "original"


def _zip(path: Path, members: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return path


async def test_local_zip_with_one_top_dir_is_flattened(
    make_agent: Agent, run_in: Callable[..., Any], tmp_path: Path
) -> None:
    archive = _zip(tmp_path / "proj.zip", {"proj/mod.py": "X = 'zipped'\n", "proj/d/f.txt": "f"})
    agent = await make_agent()
    ctx = await agent.get_or_create({"working_dir": str(archive)}, "t")
    assert ctx.cwd is not None
    assert await asyncio.to_thread(listing, ctx.cwd) == ["d/f.txt", "mod.py"]
    assert run_in(ctx, "import mod; print(json.dumps(mod.X))") == "zipped"


async def test_a_changed_dir_after_parse_fails_rather_than_lies(
    make_agent: Agent, tmp_path: Path
) -> None:
    src = make_tree(tmp_path / "src", {"a.py": "1"})
    agent = await make_agent()
    spec = await asyncio.to_thread(agent.parse, {"working_dir": str(src)})
    (src / "a.py").write_text("2")
    with pytest.raises(BuildError, match="changed after the spec was parsed"):
        await agent.get_or_create(spec, "t")
