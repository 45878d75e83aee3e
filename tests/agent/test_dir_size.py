"""``cache_resources.dir_size``: the bytes a built resource uses, as ``os.walk`` sees them."""

from __future__ import annotations

import os
from pathlib import Path

from jupyter_runtimeenv.agent.cache_resources import dir_size


def walk_size(path: Path) -> int:
    """The walk ``dir_size`` replaced (``os.walk``, an ``lstat`` of each file, each inode
    once): the reference it must agree with."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def test_a_tree_of_every_kind_of_entry_sums_as_os_walk_does(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "big").write_bytes(b"o" * 10_000)  # never reached: links not followed
    root = tmp_path / "env"
    (root / "lib" / "pkg" / "sub").mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "empty").mkdir()
    (root / "lib" / "pkg" / "a.py").write_bytes(b"a" * 1234)
    (root / "lib" / "pkg" / "sub" / "b.so").write_bytes(b"b" * 5000)
    (root / "bin" / "tool").write_bytes(b"#!" + b"t" * 300)
    # Hard links, within the tree and to a file outside it (uv's cache): each inode once.
    os.link(root / "lib" / "pkg" / "a.py", root / "bin" / "a-again.py")
    (tmp_path / "cached.whl-file").write_bytes(b"c" * 777)
    os.link(tmp_path / "cached.whl-file", root / "lib" / "pkg" / "from-cache")
    os.link(tmp_path / "cached.whl-file", root / "lib" / "pkg" / "sub" / "from-cache-2")
    # Symbolic links: to a file and a broken one count by their own size, to a
    # directory (lib64 -> lib, and one outside) neither counts nor is followed.
    (root / "bin" / "python").symlink_to("/usr/bin/env")
    (root / "bin" / "dangling").symlink_to(root / "nowhere")
    (root / "lib64").symlink_to("lib")
    (root / "escape").symlink_to(outside)
    size = dir_size(root)
    assert size == walk_size(root)
    links = sum(os.lstat(root / n).st_size for n in ("bin/python", "bin/dangling"))
    assert size == 1234 + 5000 + 302 + 777 + links


def test_a_path_that_is_gone_or_a_file_is_nothing(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"z" * 10)
    for path in (tmp_path / "missing", tmp_path / "file"):
        assert dir_size(path) == walk_size(path) == 0


def test_a_built_venv_sums_as_before(tmp_path: Path) -> None:
    """A real venv (this interpreter's, made by the stdlib's venv: its lib64 link and
    bin/python links included)."""
    import venv

    venv.create(tmp_path / "venv", with_pip=False, symlinks=True)
    assert dir_size(tmp_path / "venv") == walk_size(tmp_path / "venv") > 0
