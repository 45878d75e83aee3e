"""Threat: reads at parse time that never end.

A spec may name a FIFO (``open`` waits for a writer), a character device (``/dev/zero`` never
ends) or a pseudo-file (``/proc``: "regular", size 0, content without end) as a requirements
file, an environment file, an archive or a member of a ``working_dir``. Each such request
held a thread of the server's shared executor forever: a handful of them and every route
that uses a thread stopped answering, and the server could not shut down (the interpreter
joins those threads at exit).

Rules under test (``spec/files.py``, ``agent/parsing.py``): only regular files are read,
checked on the opened descriptor (opened ``O_NONBLOCK``), for at most the size they report;
parses run in daemon threads of their own, bounded in number, and a request waits for its
parse at most ``parse_timeout`` seconds; the server's shutdown never waits for a parse.
The server runs in its own process; every wait here is bounded.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from jupyter_process import API, JupyterProcess

from tests.security.conftest import ServerFactory, answers_within, request_within

BLOCKING = "tests.security.hostile.blocking.Blocking"


def _hostile_specs(root: Path) -> list[tuple[dict[str, Any], str]]:
    """(spec, the field its 400 must name): every way a spec names a file that is read."""
    hostile = root / "hostile"
    hostile.mkdir()
    for name in ("reqs.txt", "env.yml", "app.zip", "mod.py", "inc.txt"):
        os.mkfifo(hostile / name)
    tree = hostile / "tree"
    tree.mkdir()
    (tree / "ok.py").write_text("x = 1\n")
    (tree / "status").symlink_to("/proc/self/status")  # "regular", size 0, never empty
    return [
        ({"pip": str(hostile / "reqs.txt")}, "pip"),
        ({"pip": {"packages": "/dev/zero"}}, "pip.packages"),
        ({"pip": [f"-r {hostile / 'inc.txt'}"]}, "pip.0"),
        ({"conda": str(hostile / "env.yml")}, "conda"),
        ({"working_dir": str(hostile / "app.zip")}, "working_dir"),
        ({"working_dir": f"file://{hostile / 'app.zip'}"}, "working_dir"),
        ({"working_dir": str(tree)}, "working_dir"),
        ({"py_modules": [str(hostile / "mod.py")]}, "py_modules.0"),
    ]


@pytest.mark.timeout(300)
def test_fifos_devices_and_pseudo_files_are_refused_and_the_server_keeps_answering(
    server_process: JupyterProcess,
) -> None:
    specs = _hostile_specs(server_process.root)
    answers: dict[int, Any] = {}

    def post(i: int, spec: dict[str, Any]) -> None:
        try:
            answers[i] = request_within(server_process, "POST", API + "envs", spec, seconds=90)
        except AssertionError as exc:
            answers[i] = exc

    # All at once: more than the threads of the server's default executor (6 on 2 cores).
    threads = [
        threading.Thread(target=post, args=(i, spec), daemon=True)
        for i, (spec, _) in enumerate(specs)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for i, (spec, field) in enumerate(specs):
        answer = answers.get(i)
        assert isinstance(answer, tuple), (spec, answer)
        code, body = answer
        assert code == 400, (spec, body)
        assert body["field"] == field, (spec, body)
        assert "\n" not in body["message"]
    # ... and every route that uses a thread still answers.
    assert answers_within(server_process, API + "envs", 20) == 200
    assert answers_within(server_process, "api/contents", 20) == 200
    assert answers_within(server_process, "api/status", 20) == 200


@pytest.mark.timeout(300)
def test_a_parse_that_hangs_times_out_and_does_not_hold_the_shutdown(
    make_server_process: ServerFactory, tmp_path: Path
) -> None:
    server = make_server_process(
        f"--RuntimeEnvExtension.allowed_plugins={BLOCKING}",
        "--RuntimeEnvExtension.parse_timeout=3",
        "--RuntimeEnvExtension.max_concurrent_parses=2",
    )
    fifo = tmp_path / "never-written"
    os.mkfifo(fifo)
    spec = {"plugins": {BLOCKING: {"fifo": str(fifo)}}}
    # Four parses that never end (a file system that does not answer): each request gets a
    # 400 at its deadline (the last two waited for a slot), and the server answers meanwhile.
    answers: list[Any] = []

    def post() -> None:
        try:
            answers.append(request_within(server, "POST", API + "envs", spec, seconds=60))
        except AssertionError as exc:
            answers.append(exc)

    threads = [threading.Thread(target=post, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    assert answers_within(server, API + "status", 20) == 200
    assert answers_within(server, "api/kernels", 20) == 200
    for thread in threads:
        thread.join(90)
    assert len(answers) == 4
    for answer in answers:
        assert isinstance(answer, tuple), answer
        assert answer[0] == 400, answer
        assert "took longer than 3 s" in answer[1]["message"], answer
    # Two parse threads are still blocked in open(); SIGTERM ends the server anyway.
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(60)
    except Exception:
        pytest.fail(f"the server did not exit within 60 s of SIGTERM ({server.log_path})")


def test_the_dask_driver_refuses_what_it_cannot_read_naming_the_field(tmp_path: Path) -> None:
    # The Dask executor hashes a spec's local files on the driver (dask/manifest.py): a FIFO
    # or a pseudo-file there is the same one-line SpecError, never a hang.
    from jupyter_runtimeenv.dask.manifest import build_manifest
    from jupyter_runtimeenv.errors import SpecError
    from jupyter_runtimeenv.spec import parse

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "ok.py").write_text("x = 1\n")
    spec = parse({"working_dir": str(tree)})
    (tree / "status").symlink_to("/proc/self/status")
    with pytest.raises(SpecError) as info:
        build_manifest(spec, tmp_path / "store")
    assert info.value.field == "working_dir"
    assert "longer than its size" in info.value.reason
