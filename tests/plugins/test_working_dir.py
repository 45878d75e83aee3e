"""``working_dir``: hashing with excludes, the per-file store, zips, URLs and limits."""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.errors import BuildError, SpecError
from jupyter_runtimeenv.plugins import _hashing, _sources, _statcache, _store, _watch
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


def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files ``_hashing`` opens to read, from now on (directories opened to work
    relative to them are no reads)."""
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        fd = real_open(path, flags, *args, **kwargs)
        if not flags & (os.O_WRONLY | os.O_RDWR | os.O_DIRECTORY):
            opened.append(str(path))
        return fd

    monkeypatch.setattr(_hashing.os, "open", counting_open)
    return opened


def test_stat_cache_makes_rehashing_read_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_tree(tmp_path / "src", {f"f{i}.py": str(i) for i in range(40)})
    # Files changed within the racy window are not remembered; these were just written.
    monkeypatch.setattr(_statcache, "RACY_NS", 0)
    _hashing.forget_stat_cache()
    opened = _counting_reads(monkeypatch)
    first = _hashing.hash_tree(src)
    assert sorted(opened) == sorted(str(p) for p in src.iterdir())  # each file read once
    opened.clear()
    assert _hashing.hash_tree(src).digest == first.digest
    assert opened == []
    (src / "f3.py").write_text("changed")
    assert _hashing.hash_tree(src).digest != first.digest
    assert opened == [str(src / "f3.py")]


def test_a_change_that_keeps_size_and_mtime_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stat key has the ctime: restoring a file's size and mtime does not hide an edit."""
    src = make_tree(tmp_path / "src", {"a.py": "A = 1\n"})
    monkeypatch.setattr(_statcache, "RACY_NS", 0)
    before = _hashing.hash_tree(src).digest
    st = os.stat(src / "a.py")
    (src / "a.py").write_text("A = 2\n")
    os.utime(src / "a.py", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _hashing.hash_tree(src).digest != before


def test_a_racy_file_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a watch, a file changed within the racy window of its read is never taken
    from the cache (its stat could stay while it changes again)."""
    monkeypatch.setattr(_watch, "watch", lambda *_a, **_k: None)
    src = make_tree(tmp_path / "src", {"a.py": "1"})
    opened = _counting_reads(monkeypatch)
    _hashing.hash_tree(src)
    _hashing.hash_tree(src)
    assert opened == [str(src / "a.py")] * 2


def test_one_pass_stores_what_it_hashes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a store, each file is read once: hashed and stored from the same bytes (large
    ones in chunks), on threads for many files; materialize then only links."""
    files = {f"d{i % 4}/f{i}.txt": f"content {i}\n" * (i + 1) for i in range(60)}
    src = make_tree(tmp_path / "src", files)
    big = src / "big.bin"
    big.write_bytes(os.urandom(_hashing.WHOLE_MAX + 12345))
    _hashing.forget_stat_cache()
    opened = _counting_reads(monkeypatch)
    store = tmp_path / "cache" / "shared" / "blobs"
    tree = _hashing.hash_tree(src, store=store)
    assert sorted(opened) == sorted(e.source for e in tree.entries)
    for entry in tree.entries:
        blob = store / entry.blob_name[:2] / entry.blob_name
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == entry.sha256
        assert blob.stat().st_mode & 0o777 == entry.mode == 0o444
    opened.clear()
    assert _store.materialize(tree, tmp_path / "cache", tmp_path / "out") == 0
    assert opened == []
    assert (tmp_path / "out" / "big.bin").read_bytes() == big.read_bytes()


def test_a_tree_on_another_file_system_is_copied_from_the_store(tmp_path: Path) -> None:
    """Links across file systems fail (EXDEV, for real: the target is on /dev/shm's tmpfs,
    the store here): each file is copied from its blob instead, nested directories and
    files at the root alike, with the blob's mode."""
    files = {"top.py": "t", "a/b.py": "b", "a/deep/c.txt": "c", "z/d.txt": "d"}
    src = make_tree(tmp_path / "src", files)
    (src / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(src / "run.sh", 0o755)
    _hashing.forget_stat_cache()
    tree = _hashing.hash_tree(src, store=_store.blob_dir(tmp_path / "cache"))
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second file system here to make a link fail")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:
        out = Path(other) / "tree"
        assert _store.materialize(tree, tmp_path / "cache", out) == 0
        assert listing(out) == sorted([*files, "run.sh"])
        for rel, text in files.items():
            assert (out / rel).read_text() == text
            assert (out / rel).stat().st_nlink == 1  # copies, not links
        assert (out / "run.sh").stat().st_mode & 0o777 == 0o555


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
    assert "huge.bin (0.0 MiB)" in info.value.reason
    assert "counting stopped" in info.value.reason
    assert "JUPYTER_RUNTIMEENV_MAX_UPLOAD_BYTES" in info.value.reason
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


async def test_the_env_holds_the_content_its_id_was_made_from(
    make_agent: Agent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parsing stored the content it hashed: an edit after parse does not change what the
    env holds. Where nothing was stored (no agent in the parsing process), the build fails
    rather than give other code under the same id."""
    src = make_tree(tmp_path / "src", {"a.py": "1"})
    agent = await make_agent()
    spec = await asyncio.to_thread(agent.parse, {"working_dir": str(src)})
    (src / "a.py").write_text("2")
    ctx = await agent.get_or_create(spec, "t")
    assert ctx.cwd is not None
    assert (Path(ctx.cwd) / "a.py").read_text() == "1"

    (src / "a.py").write_text("3")
    monkeypatch.setattr(_sources, "default_store", lambda: None)
    spec = await asyncio.to_thread(agent.parse, {"working_dir": str(src)})
    (src / "a.py").write_text("4")
    with pytest.raises(BuildError, match="changed after the spec was parsed"):
        await agent.get_or_create(spec, "t")
