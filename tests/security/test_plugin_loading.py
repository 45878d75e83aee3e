"""Loading plugins by import path where it is allowed (the user's own process): a hostile or
broken module costs a ``PluginNotFound`` naming the field, never the process.

Threat: ``SystemExit`` (or ``KeyboardInterrupt``) raised while a module is imported ends the
process that imports it (once, the whole Jupyter server); a class that cannot be constructed
gave a 500. The embedded agent keeps importing by path (the user already runs their own code
there); requests to the server may not (``test_hostile_bodies``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.errors import PluginNotFound, SpecError
from jupyter_runtimeenv.plugins import PluginRegistry, RuntimeEnvPlugin, load_plugin
from jupyter_runtimeenv.spec import TRUSTED, SpecPolicy, parse
from tests.security.hostile import PACKAGE

FRIENDLY = f"{PACKAGE}.friendly.Friendly"


@pytest.mark.parametrize(
    ("path", "marker", "says"),
    [
        (f"{PACKAGE}.exits_on_import.Plugin", "exits_on_import", "SystemExit: 3"),
        (f"{PACKAGE}.prints_on_import.Plugin", "prints_on_import", "has no 'Plugin'"),
        (f"{PACKAGE}.needs_args.NeedsArgs", "needs_args", "cannot create plugin"),
        ("this.Plugin", None, "has no 'Plugin'"),
        ("this", None, "not an import path"),
        ("no_such_module_xyz.Plugin", None, "ModuleNotFoundError"),
        ("os.sep", None, "not a RuntimeEnvPlugin"),
    ],
)
def test_a_failing_plugin_is_a_plugin_not_found_naming_the_field(
    markers: Path, path: str, marker: str | None, says: str
) -> None:
    with pytest.raises(PluginNotFound) as info:
        parse({"plugins": {path: {}}})
    assert info.value.field == f"plugins.{path}"
    assert says in info.value.reason
    if marker is not None:  # trusted: the import did happen, and the process lives on
        assert (markers / f"imported-{marker}").exists()


def test_keyboard_interrupt_from_an_import_passes_only_in_the_main_thread(markers: Path) -> None:
    path = f"{PACKAGE}.interrupts_on_import.Plugin"
    caught: list[BaseException] = []

    def in_a_thread() -> None:  # where the server and the agents parse
        try:
            load_plugin(path)
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert len(caught) == 1
    assert isinstance(caught[0], PluginNotFound)
    assert "KeyboardInterrupt" in caught[0].reason
    # In the main thread (a CLI), Ctrl-C must still stop the command.
    with pytest.raises(KeyboardInterrupt):
        load_plugin(path)


class Buggy(RuntimeEnvPlugin):
    name = "buggy"

    def validate(self, value: Any) -> Any:
        return value["missing"]  # a plugin bug: KeyError on a string


def test_a_plugin_bug_in_validate_is_a_spec_error_naming_the_field() -> None:
    registry = PluginRegistry([Buggy()])
    with pytest.raises(SpecError) as info:
        parse({"buggy": "x"}, registry=registry)
    assert info.value.field == "buggy"
    assert "TypeError" in info.value.reason


async def test_the_embedded_agent_still_imports_plugins_by_path(
    markers: Path, make_agent: Callable[..., Any]
) -> None:
    agent = await make_agent()  # the default policy: TRUSTED, the user's own process
    assert agent.policy == TRUSTED
    ctx = await agent.get_or_create({"plugins": {FRIENDLY: "hello"}}, "h")
    assert ctx.env_vars["FRIENDLY"] == "hello"
    assert (markers / "imported-friendly").exists()


def test_an_untrusted_policy_refuses_before_importing_and_the_operator_can_allow(
    markers: Path,
) -> None:
    with pytest.raises(PluginNotFound) as info:
        parse({"plugins": {FRIENDLY: "x"}}, policy=SpecPolicy.untrusted())
    assert info.value.field == f"plugins.{FRIENDLY}"
    assert "allowed_plugins" in info.value.reason
    assert not (markers / "imported-friendly").exists()
    allowed = SpecPolicy.untrusted(allowed_plugins=[FRIENDLY])
    assert parse({"plugins": {FRIENDLY: "x"}}, policy=allowed).plugins == {FRIENDLY: "x"}


def test_registered_plugins_may_be_named_by_their_import_path_when_untrusted() -> None:
    path = "jupyter_runtimeenv.plugins.env_vars.EnvVarsPlugin"
    for given in (path, path.replace(".EnvVarsPlugin", ":EnvVarsPlugin")):
        spec = parse({"plugins": {given: {"A": "1"}}}, policy=SpecPolicy.untrusted())
        assert spec.plugins == {given: {"A": "1"}}
