"""Closures, lambdas and classes defined in ``__main__``: a real script in a subprocess.

The script uses the default path end to end (``get_client()``'s embedded agent, the
session's own ``LocalExecutor``) and exits *without* shutting anything down: the atexit
handlers must leave no worker behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.workers.helpers import wait_gone

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import jupyter_runtimeenv as jre

    jre.init(runtime_env={"env_vars": {"GREETING": "hi"}})
    offset = 10

    def make_adder(n):
        def adder(x):
            return x + n + offset
        return adder

    class Boom(Exception):
        pass

    class Point:
        def __init__(self, x, y):
            self.x, self.y = x, y

    def explode():
        raise Boom("from main")

    def norm(p):
        return Point(p.x * 2, p.y * 2)

    add5 = jre.remote(make_adder(5))
    greet = jre.remote(lambda name: os.environ["GREETING"] + " " + name)
    out = {}
    out["closure"] = jre.get([add5.remote(i) for i in range(3)])
    out["lambda"] = jre.get(greet.remote("there"))
    out["lambda_arg"] = jre.get(jre.remote(lambda f, v: f(v)).remote(lambda v: v * 3, 4))
    p = jre.get(jre.remote(norm).remote(Point(1, 2)))
    out["class_roundtrip"] = [type(p) is Point, p.x, p.y]
    try:
        jre.get(jre.remote(explode).remote())
    except Boom as exc:
        out["custom_exception"] = [type(exc.cause) is Boom, str(exc.cause)]
    out["worker_pid"] = jre.get(jre.remote(os.getpid).remote())
    print("RESULT " + json.dumps(out), flush=True)
    # No shutdown: atexit must clean up.
    """
)


def test_main_module_functions_and_exit_cleanup(tmp_path: Path) -> None:
    script = tmp_path / "notebook_like.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line[len("RESULT ") :])
    assert out["closure"] == [15, 16, 17]
    assert out["lambda"] == "hi there"
    assert out["lambda_arg"] == 12
    assert out["class_roundtrip"] == [True, 2, 4]
    assert out["custom_exception"] == [True, "from main"]
    wait_gone([out["worker_pid"]], timeout=5)
