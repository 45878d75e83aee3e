"""Relative paths in ``pip`` values become absolute at parse time, against the spec file
(or the requirements file naming them); URLs stay as they are."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_runtimeenv import parse


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    proj = tmp_path / "proj"
    (proj / "reqs").mkdir(parents=True)
    (proj / "reqs" / "requirements.txt").write_text(
        "--find-links ./wheels-a\n"
        "-f=../wheels-c\n"
        "--index-url https://example.invalid/simple\n"
        "-e git+https://example.invalid/x.git#egg=x\n"
        "-c constraints.txt\n"
        "alpha==2.0\n"
    )
    (proj / "env.yaml").write_text(
        "pip:\n"
        "  packages: reqs/requirements.txt\n"
        "  install_options:\n"
        "    - --find-links\n"
        "    - wheels-b\n"
        "    - --find-links=./wheels-d\n"
        "    - --constraint more.txt\n"
        "    - --no-index\n"
        "    - --extra-index-url=file:///srv/simple\n"
    )
    monkeypatch.chdir(tmp_path)  # another cwd than the spec's directory
    return proj


def test_every_relative_path_is_made_absolute_against_its_file(project: Path) -> None:
    value = parse(project / "env.yaml").fields["pip"]
    reqs = project / "reqs"
    assert value["packages"] == [
        f"--find-links {reqs / 'wheels-a'}",
        f"-f={project / 'wheels-c'}",
        "--index-url https://example.invalid/simple",
        "-e git+https://example.invalid/x.git#egg=x",
        f"-c {reqs / 'constraints.txt'}",
        "alpha==2.0",
    ]
    assert value["install_options"] == [
        "--find-links",
        str(project / "wheels-b"),
        f"--find-links={project / 'wheels-d'}",
        f"--constraint {project / 'more.txt'}",
        "--no-index",
        "--extra-index-url=file:///srv/simple",
    ]


def test_an_inline_spec_resolves_against_the_cwd(tmp_path: Path, project: Path) -> None:
    value = parse({"pip": {"packages": ["alpha"], "install_options": ["-f", "w"]}}).fields["pip"]
    assert value["install_options"] == ["-f", str(tmp_path / "w")]
