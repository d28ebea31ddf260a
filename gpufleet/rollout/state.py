"""The per-node state machine of a rollout and its state file.

pending → draining → drained → converging → verifying → returning → done, and from any active state to
failed(reason); ``skipped`` when a drain timed out and the policy says to leave the node as it was. The state file
is JSON, written atomically (a temporary file, then ``os.replace``) after every phase of every wave, so an
interrupted or stopped rollout (SIGINT, crash, controller reboot, too many failures) resumes from it: ``done`` nodes
are never touched again; ``failed`` and ``skipped`` nodes are tried again;
a node caught in the middle of a phase starts that node over (converging again is idempotent) and keeps the
record that this rollout drained it, so it is resumed in the scheduler once it passes.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.control_files import write_atomic

STATE_SCHEMA = "gpufleet.rollout.state"
STATE_SCHEMA_VERSION = 1

PENDING, DRAINING, DRAINED, CONVERGING, VERIFYING, RETURNING, DONE, FAILED, SKIPPED = (
    "pending", "draining", "drained", "converging", "verifying", "returning", "done", "failed", "skipped")
ACTIVE = (DRAINING, DRAINED, CONVERGING, VERIFYING, RETURNING)
FINAL = (DONE, FAILED, SKIPPED)

# The moves the state machine allows; anything else is a bug in the controller.
TRANSITIONS: dict[str, tuple[str, ...]] = {
    PENDING: (DRAINING, DONE, FAILED, SKIPPED),
    DRAINING: (DRAINED, FAILED, SKIPPED, PENDING),
    DRAINED: (CONVERGING, FAILED, SKIPPED, PENDING, RETURNING),
    CONVERGING: (VERIFYING, RETURNING, FAILED, PENDING),
    VERIFYING: (RETURNING, FAILED, PENDING),
    RETURNING: (DONE, FAILED, PENDING),
    DONE: (),
    FAILED: (),
    SKIPPED: (),
}


class StateError(Exception):
    """A state file that cannot be used (another schema, another inventory/deploy, unreadable)."""


class BadTransition(RuntimeError):
    pass


@dataclass
class NodeRecord:
    name: str
    state: str = PENDING
    reason: str | None = None
    wave: int | None = None
    changed: bool | None = None  # whether the converge changed something on the node
    drained_by_rollout: bool = False  # drained by this rollout and not resumed yet
    # a drain (or resume) command cut off by an interruption, and the scheduler could not be asked whether it
    # happened: the node may be drained by this rollout (--resume drains it again, then resumes it)
    drain_uncertain: bool = False
    not_drained: str | None = None  # a failed node that is NOT drained (it failed before its drain ran): why
    phases: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    history: list[list[Any]] = field(default_factory=list)  # [state, unix time]

    def retry(self) -> None:
        """A failed or skipped node back to pending on ``--resume`` (its drain record is kept)."""
        if self.state not in (FAILED, SKIPPED):
            raise BadTransition(f"{self.name}: only a failed or skipped node is retried, not a {self.state} one")
        self.state, self.reason = PENDING, None
        self.history.append([PENDING, round(time.time(), 3)])

    def move(self, new: str, reason: str | None = None) -> None:
        if new not in TRANSITIONS[self.state]:
            raise BadTransition(f"{self.name}: {self.state} -> {new} is not a rollout transition")
        self.state = new
        if new == FAILED or new == SKIPPED:
            self.reason = reason
        self.history.append([new, round(time.time(), 3)])


@dataclass
class RolloutState:
    rollout_id: str
    inventory: str
    deploy: str
    options: dict[str, Any]
    order: list[str]
    nodes: dict[str, NodeRecord]
    waves: list[dict[str, Any]] = field(default_factory=list)
    status: str = "running"  # running, interrupted, stopped, finished
    started_at: float = field(default_factory=time.time)
    # the whole-fleet validation + preflight passes before any change: [{"hosts": n (None: every), "seconds": s}]
    preflight: list[dict[str, Any]] = field(default_factory=list)
    # the signal that stopped the rollout: {"signal": "SIGINT", "at": unix time, "mid_change": [hosts]}
    interruption: dict[str, Any] | None = None

    @classmethod
    def new(cls, rollout_id: str, inventory: str, deploy: str, options: dict[str, Any], order: list[str]
            ) -> RolloutState:
        return cls(rollout_id=rollout_id, inventory=inventory, deploy=deploy, options=options, order=list(order),
                   nodes={n: NodeRecord(n) for n in order})

    def by_state(self, *states: str) -> list[str]:
        return [n for n in self.order if self.nodes[n].state in states]

    def drained_now(self) -> list[str]:
        return [n for n in self.order if self.nodes[n].drained_by_rollout]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": STATE_SCHEMA, "schema_version": STATE_SCHEMA_VERSION, "rollout_id": self.rollout_id,
                "inventory": self.inventory, "deploy": self.deploy, "options": self.options, "order": self.order,
                "status": self.status, "started_at": self.started_at, "waves": self.waves,
                "preflight": self.preflight, "interruption": self.interruption,
                "nodes": {n: asdict(self.nodes[n]) for n in self.order}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutState:
        if not isinstance(data, dict) or data.get("schema") != STATE_SCHEMA:
            raise StateError(f"not a gpufleet rollout state file (schema {STATE_SCHEMA!r} expected)")
        if data.get("schema_version") != STATE_SCHEMA_VERSION:
            raise StateError(f"state file schema_version {data.get('schema_version')!r} is not supported "
                             f"(this gpufleet reads {STATE_SCHEMA_VERSION})")
        nodes = {n: NodeRecord(**rec) for n, rec in data["nodes"].items()}
        return cls(rollout_id=data["rollout_id"], inventory=data["inventory"], deploy=data["deploy"],
                   options=data["options"], order=list(data["order"]), nodes=nodes, waves=list(data["waves"]),
                   status=data.get("status", "running"), started_at=data.get("started_at", time.time()),
                   preflight=list(data.get("preflight") or []), interruption=data.get("interruption"))


@contextmanager
def signals_held():
    """SIGINT, SIGTERM and SIGHUP wait (blocked, then delivered at the end of the block) while the rollout writes a
    file: a signal between the temporary file's creation and its rename or removal left the temporary file beside
    the state file. Main thread only (where Python runs signal handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def save(state: RolloutState, path: str | Path) -> None:
    """Write the state file atomically: a reader (or a crash) sees the old file or the new one, never half; a signal
    waits for the write (:func:`signals_held`)."""
    text = json.dumps(state.to_dict(), indent=1)
    with signals_held():
        write_atomic(path, text)  # tempfile beside it + os.replace, fsync'd


def load(path: str | Path) -> RolloutState:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise StateError(f"{path}: cannot read the rollout state: {error}") from None
    try:
        return RolloutState.from_dict(data)
    except (KeyError, TypeError) as error:
        raise StateError(f"{path}: damaged rollout state ({error})") from None
