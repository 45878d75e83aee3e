"""The environments' state machine: plain data, no I/O.

    PENDING ──start──▶ BUILDING ──succeed──▶ READY
                          │                    │
                          └──fail──▶ FAILED ◀──┘ (never: READY stays READY until removed)
                                      │
                                      └──retry──▶ PENDING

The agent asks the machine what to do (``request`` answers whether a build must start) and
reports what happened; the machine answers with the events to publish. Tested alone.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class EnvState(str, enum.Enum):
    PENDING = "PENDING"
    BUILDING = "BUILDING"
    READY = "READY"
    FAILED = "FAILED"


_ALLOWED = {
    EnvState.PENDING: {EnvState.BUILDING, EnvState.FAILED},
    EnvState.BUILDING: {EnvState.READY, EnvState.FAILED},
    EnvState.READY: set(),
    EnvState.FAILED: {EnvState.PENDING},
}


class InvalidTransition(RuntimeError):
    """A bug: the agent asked for a transition the machine does not allow."""


@dataclass
class EnvRecord:
    env_id: str
    spec: dict[str, Any]
    state: EnvState = EnvState.PENDING
    holders: set[str] = field(default_factory=set)
    context: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    created: float = 0.0
    updated: float = 0.0
    failed_at: float | None = None
    #: step name -> {"status": "running"|"done"|"failed"|"cached", "started", "ended", "bytes"}
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "state": self.state.value,
            "spec": self.spec,
            "context": self.context,
            "error": self.error,
            "holders": sorted(self.holders),
            "steps": {k: dict(v) for k, v in self.steps.items()},
            "created": self.created,
            "updated": self.updated,
        }


@dataclass(frozen=True)
class Transition:
    env_id: str
    old: EnvState | None
    new: EnvState


class EnvStateMachine:
    """All environments an agent knows, and the rules for changing them."""

    def __init__(self, failure_ttl: float = 30.0) -> None:
        #: How long a failure is remembered: requests within it get the same error.
        self.failure_ttl = failure_ttl
        self.records: dict[str, EnvRecord] = {}

    def get(self, env_id: str) -> EnvRecord | None:
        return self.records.get(env_id)

    def request(
        self, env_id: str, spec: dict[str, Any], holder: str, now: float, *, retry: bool = False
    ) -> tuple[EnvRecord, bool, list[Transition]]:
        """A holder asks for an env. Returns the record, whether a build must start, and the
        transitions made. A remembered failure is returned as is unless it expired or
        ``retry`` is asked; then the env goes back to PENDING and is rebuilt."""
        record = self.records.get(env_id)
        transitions: list[Transition] = []
        if record is None:
            record = EnvRecord(env_id, spec, created=now, updated=now)
            self.records[env_id] = record
            transitions.append(Transition(env_id, None, EnvState.PENDING))
            must_build = True
        elif record.state is EnvState.FAILED:
            expired = record.failed_at is not None and now - record.failed_at >= self.failure_ttl
            must_build = retry or expired
            if must_build:
                transitions.append(self._move(record, EnvState.PENDING, now))
                record.error = None
                record.steps = {}
        else:
            must_build = False
        record.holders.add(holder)
        return record, must_build, transitions

    def adopt(
        self, env_id: str, spec: dict[str, Any], context: dict[str, Any], now: float
    ) -> EnvRecord:
        """An env found complete in the persistent cache becomes READY without a build."""
        record = EnvRecord(env_id, spec, EnvState.READY, context=context, created=now, updated=now)
        self.records[env_id] = record
        return record

    def start(self, env_id: str, now: float) -> Transition:
        return self._move(self.records[env_id], EnvState.BUILDING, now)

    def succeed(self, env_id: str, context: dict[str, Any], now: float) -> Transition:
        record = self.records[env_id]
        record.context = context
        return self._move(record, EnvState.READY, now)

    def fail(self, env_id: str, error: dict[str, Any], now: float) -> Transition:
        record = self.records[env_id]
        record.error = error
        record.failed_at = now
        # A holder of a failed env holds nothing; they ask again to retry.
        record.holders.clear()
        return self._move(record, EnvState.FAILED, now)

    def release(self, env_id: str, holder: str) -> bool:
        """Drop ``holder``'s reference; True if it held one."""
        record = self.records.get(env_id)
        if record is None or holder not in record.holders:
            return False
        record.holders.discard(holder)
        return True

    def forget(self, env_id: str) -> EnvRecord | None:
        return self.records.pop(env_id, None)

    def step(self, env_id: str, name: str, **info: Any) -> dict[str, Any]:
        record = self.records[env_id]
        entry = record.steps.setdefault(name, {})
        entry.update(info)
        return dict(entry)

    def _move(self, record: EnvRecord, new: EnvState, now: float) -> Transition:
        old = record.state
        if new not in _ALLOWED[old]:
            raise InvalidTransition(f"{record.env_id}: {old.value} -> {new.value}")
        record.state = new
        record.updated = now
        return Transition(record.env_id, old, new)
