"""Threat: file contents leak through spec errors.

Naming a file outside the server's root as a requirements file made the 400 quote its first
line that is not a requirement (tried on ``/etc/shadow``), and lines that look like
requirements (tokens) were stored in the spec and served back by ``GET envs/{id}``; a
``-c`` constraints file outside the root was read by the installer, whose error quoted it
into the build log the sender can read.

Rules under test (``SpecPolicy.files_root``/``quote_files``): over REST, requirements,
constraints and environment files are read only below the server's root, and no error
quotes what a file holds (it names the line); the trusted local path (the user's own
process) is unchanged. Against a real server (pytest-jupyter), as an authorized client.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.errors import SpecError
from jupyter_runtimeenv.spec import parse
from tests.security.conftest import Raw

SECRET = "s3cr3t-T0KEN-4711"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside the server's root, with files a sender must not read through us."""
    where = tmp_path / "outside"
    where.mkdir()
    (where / "shadow").write_text(f"root:$6${SECRET}:19000:0:99999:7:::\n")
    (where / "tokens.txt").write_text(f"{SECRET}\n")  # looks like a requirement
    (where / "env.yml").write_text(f"dependencies: [python]\nname: {SECRET}\n")
    return where


def _refusals(outside: Path, root: Path) -> list[tuple[dict[str, Any], str]]:
    (root / "includes.txt").write_text(f"six\n-r {outside / 'tokens.txt'}\n")
    return [
        ({"pip": str(outside / "shadow")}, "pip"),
        ({"pip": str(outside / "tokens.txt")}, "pip"),
        ({"pip": {"packages": str(outside / "tokens.txt")}}, "pip.packages"),
        ({"pip": str(root / "includes.txt")}, "pip.1"),
        ({"pip": [f"-r {outside / 'tokens.txt'}"]}, "pip.0"),
        ({"pip": [f"-c {outside / 'shadow'}", "six"]}, "pip.0"),
        ({"pip": [f"--constraint={outside / 'shadow'}", "six"]}, "pip.0"),
        ({"pip": {"packages": ["six"], "install_options": ["-c", str(outside / "shadow")]}},
         "pip.install_options"),
        ({"uv": {"packages": ["six"], "uv_pip_install_options": [f"--override={outside}/shadow"]}},
         "uv.uv_pip_install_options"),
        ({"pip": f"file://{outside / 'tokens.txt'}"}, "pip"),
        ({"conda": str(outside / "env.yml")}, "conda"),
        ({"conda": f"file://{outside / 'env.yml'}"}, "conda"),
    ]  # fmt: skip


async def test_files_outside_the_root_are_not_read_for_requests(
    raw: Raw, alive: Callable[[], Awaitable[None]], outside: Path, jp_root_dir: Path
) -> None:
    for spec, field in _refusals(outside, jp_root_dir):
        code, body = await raw("POST", "envs", body=spec)
        assert code == 400, (spec, body)
        assert body["field"] == field, (spec, body)
        assert "outside the server's root" in body["message"], (spec, body)
        assert SECRET not in json.dumps(body), (spec, body)
    # A symlink inside the root to a file outside is outside too.
    (jp_root_dir / "link.txt").symlink_to(outside / "tokens.txt")
    code, body = await raw("POST", "envs", body={"pip": str(jp_root_dir / "link.txt")})
    assert (code, body["field"]) == (400, "pip"), body
    assert SECRET not in json.dumps(body)
    await alive()


async def test_errors_name_the_line_of_a_file_and_never_quote_it(
    raw: Raw, alive: Callable[[], Awaitable[None]], jp_root_dir: Path
) -> None:
    (jp_root_dir / "reqs.txt").write_text(f"six\n# fine\nroot:$6${SECRET}:19000\n")
    (jp_root_dir / "pickle.txt").write_text(f"cloudpickle<1  # {SECRET}\n")
    (jp_root_dir / "env.yml").write_text(f"dependencies: [python]\n  {SECRET}: [\n")
    cases = [
        ({"pip": str(jp_root_dir / "reqs.txt")}, "pip.2", "line 3 of"),
        ({"pip": str(jp_root_dir / "pickle.txt")}, "pip.0", "line 1 of"),
        ({"conda": str(jp_root_dir / "env.yml")}, "conda", "at line 2"),
    ]
    for spec, field, words in cases:
        code, body = await raw("POST", "envs", body=spec)
        assert code == 400, (spec, body)
        assert body["field"] == field, (spec, body)
        assert words in body["message"], (spec, body)
        assert SECRET not in json.dumps(body), (spec, body)
        assert "root:$6$" not in json.dumps(body), (spec, body)
    await alive()


def test_the_trusted_local_path_reads_and_quotes_as_before(outside: Path) -> None:
    # The user's own process (embedded agent, CLI): any file, and errors that quote it.
    assert parse({"pip": str(outside / "tokens.txt")}).fields["pip"]["packages"] == [SECRET.lower()]
    with pytest.raises(SpecError) as info:
        parse({"pip": str(outside / "shadow")})
    assert SECRET in str(info.value)
