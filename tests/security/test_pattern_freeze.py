"""Threat: one authenticated POST froze the whole Jupyter server.

``excludes`` (and ``.gitignore``) patterns were compiled to Python regular expressions;
``*a*a*a*a*a*a*a*a*a*a*a*a*b`` against a file named ``aaaa...a`` backtracks for longer than
anyone waits, inside one C call that holds the GIL: every route of the server (the core
``/api/status`` and ``/api/kernels`` too) stopped answering and SIGTERM was ignored.

Rule under test (``spec/patterns.py``): patterns are matched without regular expressions,
in time linear in the path, and their number and length are bounded at parse time. The
server runs in its own process (a frozen server in the test's process would freeze the
test); the hostile request and the probes are real HTTP requests with bounded waits.
"""

from __future__ import annotations

import json
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from jupyter_process import API, JupyterProcess

from tests.security.conftest import answers_within

#: Twelve stars: with a backtracking regex, days against a 250-character name.
HOSTILE = "*a" * 12 + "*b"
LONG_NAME = "a" * 250


def _post(server: JupyterProcess, body: Any, out: dict[str, Any]) -> None:
    request = urllib.request.Request(
        server.url + API + "envs?wait=1",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"token {server.token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            out["status"], out["body"] = response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        out["status"], out["body"] = exc.code, json.loads(exc.read() or b"null")
    except OSError as exc:
        out["error"] = exc


def _tree(root: Path, gitignore: bool) -> Path:
    tree = root / ("tree-gitignore" if gitignore else "tree-excludes")
    tree.mkdir()
    (tree / LONG_NAME).write_text("dropped\n")
    (tree / "kept.txt").write_text("kept\n")
    if gitignore:
        (tree / ".gitignore").write_text(HOSTILE + "\n")
    return tree


@pytest.mark.timeout(300)
@pytest.mark.parametrize("source", ["excludes", "gitignore"])
def test_a_hostile_pattern_does_not_freeze_the_server(
    server_process: JupyterProcess, source: str
) -> None:
    tree = _tree(server_process.root, gitignore=source == "gitignore")
    spec: dict[str, Any] = {"working_dir": str(tree), "env_vars": {"ONE": "1"}}
    if source == "excludes":
        spec["excludes"] = [HOSTILE]
    answer: dict[str, Any] = {}
    poster = threading.Thread(target=_post, args=(server_process, spec, answer), daemon=True)
    poster.start()
    # While (or after) the hostile spec is parsed, the whole server keeps answering.
    for _ in range(5):
        assert answers_within(server_process, "api/status", 20) == 200
        assert answers_within(server_process, "api/kernels", 20) == 200
        assert answers_within(server_process, API + "status", 20) == 200
    poster.join(120)
    assert not poster.is_alive(), "the hostile POST got no answer within 120 s"
    assert answer.get("status") == 201, answer
    assert answer["body"]["state"] == "READY", answer
    # Matching still means what git says: the long name does not end in "b", so it is kept.
    cwd = Path(answer["body"]["context"]["cwd"])
    assert sorted(p.name for p in cwd.iterdir() if p.name != ".gitignore") == sorted(
        [LONG_NAME, "kept.txt"]
    )


@pytest.mark.timeout(300)
def test_sigterm_stops_the_server_after_hostile_patterns(server_process: JupyterProcess) -> None:
    tree = _tree(server_process.root, gitignore=True)
    answer: dict[str, Any] = {}
    _post(server_process, {"working_dir": str(tree), "excludes": [HOSTILE, "*" * 1024]}, answer)
    assert answer.get("status") == 201, answer
    server_process.proc.send_signal(signal.SIGTERM)
    assert server_process.proc.wait(60) is not None


def test_patterns_past_their_bounds_are_refused_naming_the_field(tmp_path: Path) -> None:
    from jupyter_runtimeenv.errors import SpecError
    from jupyter_runtimeenv.spec import parse

    cases = [
        ({"excludes": ["x"] * 1001}, "excludes", "at most 1000"),
        ({"excludes": ["ok", "*" * 1025]}, "excludes.1", "at most 1024"),
        ({"excludes": ["ok", ""]}, "excludes.1", "non-empty pattern"),
    ]
    for spec, field, words in cases:
        with pytest.raises(SpecError) as info:
            parse(spec)
        assert info.value.field == field
        assert words in str(info.value)
        assert "\n" not in str(info.value)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / ".gitignore").write_text("\n".join(f"p{i}" for i in range(10_001)))
    with pytest.raises(SpecError) as info:
        parse({"working_dir": str(tree)})
    assert info.value.field == "working_dir"
    assert "more than 10000" in str(info.value)
