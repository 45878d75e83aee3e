"""The state machine alone: no processes, no files, no loop."""

from __future__ import annotations

import pytest

from jupyter_runtimeenv.agent.state import EnvState, EnvStateMachine, InvalidTransition


def test_first_request_builds_later_ones_wait() -> None:
    machine = EnvStateMachine()
    record, build, transitions = machine.request("e", {}, "a", now=0)
    assert build
    assert [t.new for t in transitions] == [EnvState.PENDING]
    _, build_again, _ = machine.request("e", {}, "b", now=1)
    assert not build_again
    assert record.holders == {"a", "b"}


def test_happy_path() -> None:
    machine = EnvStateMachine()
    machine.request("e", {}, "a", now=0)
    assert machine.start("e", now=1).new is EnvState.BUILDING
    transition = machine.succeed("e", {"python": "p"}, now=2)
    assert (transition.old, transition.new) == (EnvState.BUILDING, EnvState.READY)
    record = machine.get("e")
    assert record is not None
    assert record.context == {"python": "p"}
    assert record.updated == 2


def test_failure_is_remembered_until_ttl_or_retry() -> None:
    machine = EnvStateMachine(failure_ttl=10)
    machine.request("e", {}, "a", now=0)
    machine.start("e", now=0)
    machine.fail("e", {"message": "boom"}, now=1)
    record = machine.get("e")
    assert record is not None
    assert record.holders == set()
    _, build, _ = machine.request("e", {}, "a", now=5)
    assert not build
    assert record.state is EnvState.FAILED
    _, build, transitions = machine.request("e", {}, "a", now=5, retry=True)
    assert build
    assert transitions[0].new is EnvState.PENDING
    assert record.error is None


def test_failure_expires() -> None:
    machine = EnvStateMachine(failure_ttl=10)
    machine.request("e", {}, "a", now=0)
    machine.start("e", now=0)
    machine.fail("e", {}, now=1)
    _, build, _ = machine.request("e", {}, "a", now=11)
    assert build


@pytest.mark.parametrize(
    "steps",
    [
        ["succeed"],  # PENDING -> READY skips BUILDING
        ["start", "start"],
        ["start", "succeed", "fail"],  # READY stays READY
        ["start", "succeed", "start"],
    ],
)
def test_invalid_transitions_raise(steps: list[str]) -> None:
    machine = EnvStateMachine()
    machine.request("e", {}, "a", now=0)
    actions = {
        "start": lambda: machine.start("e", now=1),
        "succeed": lambda: machine.succeed("e", {}, now=1),
        "fail": lambda: machine.fail("e", {}, now=1),
    }
    for step in steps[:-1]:
        actions[step]()
    with pytest.raises(InvalidTransition):
        actions[steps[-1]]()


def test_release_and_steps() -> None:
    machine = EnvStateMachine()
    machine.request("e", {}, "a", now=0)
    assert machine.release("e", "a")
    assert not machine.release("e", "a")
    assert not machine.release("missing", "a")
    assert machine.step("e", "pip", status="running") == {"status": "running"}
    assert machine.step("e", "pip", status="done", bytes=3) == {"status": "done", "bytes": 3}
    assert machine.get("e").to_json()["steps"] == {"pip": {"status": "done", "bytes": 3}}  # type: ignore[union-attr]
