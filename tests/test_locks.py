"""``locks``: reading PEP 751 locks, pinning a spec to one, and saying how an env differs.
The uv side (a lock from a real venv) is in tests/server/test_notebook_lock.py."""

from __future__ import annotations

import pytest

from jupyter_runtimeenv.errors import SpecError
from jupyter_runtimeenv.locks import differences, locked_spec, locked_versions, pip_field

LOCK = """
lock-version = "1.0"
created-by = "uv"

[[packages]]
name = "Alpha_Pkg"
version = "1.0"
wheels = [{ url = "https://example.org/alpha_pkg-1.0-py3-none-any.whl" }]

[[packages]]
name = "winonly"
version = "2.1"
marker = "sys_platform == 'win32'"

[[packages]]
name = "local"
archive = { url = "https://example.org/local-src.tar.gz", hashes = { sha256 = "00" } }

[[packages]]
name = "wheelfile"
version = "1.0"
archive = { path = "/data/wheels/wheelfile-1.0-py3-none-any.whl" }

[[packages]]
name = "mypk"
directory = { path = "/src/mypk" }

[[packages]]
name = "fromgit"
version = "0.1"
vcs = { type = "git", url = "https://example.org/fromgit.git", commit-id = "abc123" }
"""

PINS = [
    "Alpha_Pkg==1.0",
    "winonly==2.1 ; sys_platform == 'win32'",
    "local @ https://example.org/local-src.tar.gz",
    # Installed from a file, a directory or git: from there again, not from an index.
    "wheelfile @ file:///data/wheels/wheelfile-1.0-py3-none-any.whl",
    "mypk @ file:///src/mypk",
    "fromgit @ git+https://example.org/fromgit.git@abc123",
]


def test_a_spec_is_pinned_to_the_locks_versions_keeping_its_other_keys() -> None:
    spec = {
        "pip": {"packages": ["alpha-pkg>=1"], "install_options": ["--no-index"], "pip_check": True},
        "env_vars": {"A": "1"},
    }
    out = locked_spec(spec, LOCK, "lock")
    assert out["pip"] == {"packages": PINS, "install_options": ["--no-index"], "pip_check": True}
    assert out["env_vars"] == {"A": "1"}
    assert spec["pip"]["packages"] == ["alpha-pkg>=1"]  # not changed in place
    assert locked_spec({"uv": ["x"]}, LOCK, "lock")["uv"] == PINS
    # An editable install is in no lock: it stays as asked.
    assert locked_spec({"pip": ["-e /src/dev", "x"]}, LOCK, "lock")["pip"] == [*PINS, "-e /src/dev"]
    # Nothing to pin: the spec as it is (the lock is not even read).
    assert locked_spec({"env_vars": {"A": "1"}}, "garbage", "lock") == {"env_vars": {"A": "1"}}
    assert pip_field({"pip": {"packages": []}, "uv": ["x"]}) == "uv"
    assert pip_field({"pip": []}) is None


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("lock-version = [", "lock", "not a pylock.toml"),
        ('lock-version = "2.0"\n', "lock", "expected 1.x"),
        ('lock-version = "1.0"\n', "lock", "no [[packages]]"),
        ('lock-version = "1.0"\n[[packages]]\nversion = "1"\n', "lock.packages[0]", "a name"),
        ('lock-version = "1.0"\n[[packages]]\nname = "x"\n', "lock.packages[0]", "neither"),
    ],
)
def test_a_lock_that_cannot_be_followed_is_refused_naming_where(
    text: str, field: str, reason: str
) -> None:
    with pytest.raises(SpecError) as info:
        locked_spec({"pip": ["x"]}, text, "lock")
    assert info.value.field == field
    assert reason in info.value.reason


def test_differences_name_each_package_and_both_versions() -> None:
    lock = locked_versions(LOCK, "lock")
    # winonly is not for this platform
    assert lock == {
        "alpha-pkg": "1.0",
        "local": "",
        "wheelfile": "1.0",
        "mypk": "",
        "fromgit": "0.1",
    }
    env = {"alpha-pkg": "2.0", "local": "0.3", "extra": "5", "wheelfile": "1.0", "mypk": "0.3"}
    env["fromgit"] = "0.1"
    assert differences(lock, env) == [
        "alpha-pkg: 1.0 in the lock, 2.0 in the env",
        "extra: 5 in the env, not in the lock",
    ]
    assert differences({"a": "1"}, {}) == ["a: 1 in the lock, not in the env"]
    assert differences({"a": "1"}, {"a": "1"}) == []
