"""A notebook's lock (issue 21 item 3): the versions of its envs saved as PEP 751
``pylock.toml``, installed again by Declare, ``--upgrade`` resolving anew, the badge's check.

A real Jupyter server, real kernels, real uv installs from the tests' wheelhouse: "a year
later" is the wheelhouse gaining alpha 2.0 after the notebook was saved with alpha 1.0.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import tomllib

from tests.kernels.test_kernels import run, start_kernel
from tests.server.test_panel import call, refused
from tests.wheelhouse import make_wheelhouse, offline_installers


@pytest.fixture
def extension_config() -> dict[str, Any]:
    return {"kernel_sweep_interval": 0.2}


VERSION = """
from jupyter_runtimeenv import remote

@remote
def version():
    import alpha
    return alpha.__version__

print("version", version.remote().result(timeout=120))
"""


async def declared(jp_fetch: Any, kernel_id: str, count: int) -> dict[str | None, str]:
    """The kernel's reported ``{name: env_id}`` once it declares ``count`` envs (bounded)."""
    for _ in range(300):
        kernels = (await call(jp_fetch, "GET", "kernels"))["kernels"]
        mine = [k for k in kernels if k["kernel_id"] == kernel_id]
        if mine and len(mine[0]["declared"]) == count:
            return {d["name"]: d["env_id"] for d in mine[0]["declared"]}
        await asyncio.sleep(0.1)
    raise AssertionError(f"kernel {kernel_id} never reported {count} declared envs")


def versions(lock: str) -> dict[str, str]:
    data = tomllib.loads(lock)
    assert data["lock-version"] == "1.0"
    return {p["name"]: p["version"] for p in data["packages"]}


async def test_a_saved_lock_installs_its_versions_later_and_upgrade_resolves_anew(
    jp_fetch: Any,
    jp_serverapp: Any,
    jp_root_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    full = make_wheelhouse(tmp_path / "wheelhouse")
    then = tmp_path / "then"  # the index when the notebook was saved: alpha 1.0 only
    then.mkdir()
    shutil.copy(full / "alpha-1.0-py3-none-any.whl", then)
    offline_installers(monkeypatch, then)
    (jp_root_dir / "nb").mkdir()
    chdir = f"import os\nos.chdir({str(jp_root_dir / 'nb')!r})\n"

    kernel_id = await start_kernel(jp_fetch, "python3")
    await run(
        jp_serverapp,
        kernel_id,
        chdir + "get_ipython().run_line_magic('load_ext', 'jupyter_runtimeenv')\n"
        "get_ipython().run_line_magic('runtime_env', '--pip alpha --no-widget')\n"
        "get_ipython().run_cell_magic('runtime_env', '--name side --no-widget',"
        " 'pip: [alpha]\\nenv_vars: {SIDE: \"1\"}')\n",
    )
    ids = await declared(jp_fetch, kernel_id, 2)
    meta = await call(
        jp_fetch, "GET", "kernels", kernel_id, "notebook_env", params={"path": "nb/a.ipynb"}
    )
    # Saved with the versions each env has, in PEP 751's format, from uv.
    assert meta["spec"]["pip"]["packages"] == ["alpha"]
    assert versions(meta["lock"]) == {"alpha": "1.0"}
    assert versions(meta["named"]["side"]["lock"]) == {"alpha": "1.0"}
    assert meta["env_id"] == ids[None]
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")

    # A year later on another machine: alpha 2.0 is out and no env of the notebook is built.
    offline_installers(monkeypatch, full)
    for _ in range(300):
        unheld = await call(jp_fetch, "GET", "gc", "unreferenced")
        if {ids[None], ids["side"]} <= {e["env_id"] for e in unheld["envs"]}:
            break
        await asyncio.sleep(0.1)
    gone = await call(
        jp_fetch, "POST", "gc", "unreferenced", body={"env_ids": [ids[None], ids["side"]]}
    )
    assert sorted(gone["removed"]) == sorted([ids[None], ids["side"]])
    notebook = {"path": "nb/a.ipynb", "runtime_env": meta}
    assert (await call(jp_fetch, "POST", "notebook_env", body=notebook))["state"] == "missing"

    kernel_id = await start_kernel(jp_fetch, "python3")
    locks = {"": meta["lock"], "side": meta["named"]["side"]["lock"]}
    declare = (
        chdir + "from jupyter_runtimeenv.notebook_meta import declare\n"
        f"declare({meta['spec']!r}, named={{'side': {meta['named']['side']['spec']!r}}},"
        f" locks={locks!r})\n"
    )
    await run(jp_serverapp, kernel_id, declare)
    # Declare installed the lock's version, not the newest the spec allows.
    assert "version 1.0" in await run(jp_serverapp, kernel_id, VERSION)
    await declared(jp_fetch, kernel_id, 2)
    status = await call(jp_fetch, "POST", "notebook_env", body={**notebook, "kernel_id": kernel_id})
    assert status["state"] == "cached"
    assert status["default"]["lock"] == "matches"
    assert status["lock_differences"] == []

    # --upgrade resolves the spec as written: the newest alpha; the badge says what differs.
    before = (await declared(jp_fetch, kernel_id, 2))[None]
    await run(
        jp_serverapp,
        kernel_id,
        "get_ipython().run_line_magic('runtime_env', '--upgrade --no-widget')\n",
    )
    assert "version 2.0" in await run(jp_serverapp, kernel_id, VERSION)
    for _ in range(300):
        now = await declared(jp_fetch, kernel_id, 2)
        if now[None] != before:
            break
        await asyncio.sleep(0.1)
    status = await call(jp_fetch, "POST", "notebook_env", body={**notebook, "kernel_id": kernel_id})
    assert status["default"]["lock"] == "differs"
    assert status["default"]["lock_differences"] == ["alpha: 1.0 in the lock, 2.0 in the env"]
    assert status["named"][0]["lock"] == "matches"  # 'side' is still the locked one
    assert status["lock_differences"] == ["alpha: 1.0 in the lock, 2.0 in the env"]
    # Without the kernel: the env this server has for the locked spec, which matches.
    status = await call(jp_fetch, "POST", "notebook_env", body=notebook)
    assert status["default"]["lock"] == "matches"

    # Declare's upgrade: every env resolves anew.
    await run(
        jp_serverapp,
        kernel_id,
        declare.replace("locks=", "upgrade=True, locks="),
    )
    for _ in range(300):
        status = await call(
            jp_fetch, "POST", "notebook_env", body={**notebook, "kernel_id": kernel_id}
        )
        if status["named"][0]["lock"] == "differs":
            break
        await asyncio.sleep(0.1)
    assert status["named"][0]["lock_differences"] == ["alpha: 1.0 in the lock, 2.0 in the env"]
    assert status["lock_differences"] == [
        "alpha: 1.0 in the lock, 2.0 in the env",
        "side: alpha: 1.0 in the lock, 2.0 in the env",
    ]


async def test_a_bad_lock_is_refused_naming_it_and_declares_nothing(
    jp_fetch: Any, jp_serverapp: Any, jp_root_dir: Path
) -> None:
    meta = {"version": 1, "spec": {"pip": ["alpha"]}, "lock": "lock-version = [1"}
    code, body = await refused(
        jp_fetch, "POST", "notebook_env", body={"path": "a.ipynb", "runtime_env": meta}
    )
    assert (code, body["field"]) == (400, "lock")
    assert "not a pylock.toml" in body["message"]
    meta["lock"] = 'lock-version = "2.0"\n'
    code, body = await refused(
        jp_fetch, "POST", "notebook_env", body={"path": "a.ipynb", "runtime_env": meta}
    )
    assert (code, body["field"]) == (400, "lock")
    assert "expected 1.x" in body["message"]

    kernel_id = await start_kernel(jp_fetch, "python3")
    bad = json.dumps({"side": "[[packages]]\nversion = '1'\n"})
    out = await run(
        jp_serverapp,
        kernel_id,
        "from jupyter_runtimeenv.notebook_meta import declare\n"
        "from jupyter_runtimeenv.errors import SpecError\n"
        "import json\n"
        "try:\n"
        f"    declare({{'env_vars': {{'A': '1'}}}}, named={{'side': {{'pip': ['alpha']}}}},"
        f" locks=json.loads({bad!r}))\n"
        "except SpecError as exc:\n"
        "    print('refused', exc)\n"
        "from jupyter_runtimeenv.session import default_runtime_env\n"
        "print('default', default_runtime_env())\n",
    )
    assert "refused named.side.lock" in out
    assert "default None" in out  # the good default was not declared either


async def test_an_env_uv_cannot_lock_is_saved_without_a_lock_saying_why(
    jp_fetch: Any,
    jp_serverapp: Any,
    jp_root_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    offline_installers(monkeypatch, make_wheelhouse(tmp_path / "wheelhouse"))
    kernel_id = await start_kernel(jp_fetch, "python3")
    await run(
        jp_serverapp,
        kernel_id,
        "get_ipython().run_line_magic('load_ext', 'jupyter_runtimeenv')\n"
        "get_ipython().run_line_magic('runtime_env', '--pip alpha --no-widget')\n",
    )
    await declared(jp_fetch, kernel_id, 1)
    # The index is gone by the time the notebook is saved: uv cannot write the files' hashes.
    empty = tmp_path / "empty"
    empty.mkdir()
    offline_installers(monkeypatch, empty)
    meta = await call(
        jp_fetch, "GET", "kernels", kernel_id, "notebook_env", params={"path": "a.ipynb"}
    )
    assert "lock" not in meta
    assert meta["lock_error"].startswith("pip compile failed:"), meta["lock_error"]
    assert "alpha" in meta["lock_error"]
