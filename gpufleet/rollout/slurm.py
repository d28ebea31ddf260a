"""``--drain slurm``: drain and resume nodes with Slurm's own client commands (``scontrol``, ``sinfo``) on the
machine that runs the rollout; ``--drain "slurm:PREFIX"`` runs them through PREFIX instead, e.g.
``slurm:ssh root@slurm-ctl`` where the rollout's machine is no Slurm client (PREFIX gets the command as one
shell-quoted argument, as ssh passes it to the remote shell). The Slurm node name is the inventory host name.

The drain reason names the rollout (``gpufleet rollout <id>``); that reason is the record of whose drain it is.
A node already drained (or draining) with another reason (an admin, or Slurm itself, e.g. a GRES mismatch) is
converged while it stays out of service, but never resumed by the rollout. A node that fails keeps its drain,
with the reason saying why. ``sinfo -h -n NODE -o "%T|%E|%u"`` is read, as ``scontrol`` 22.05 has no ``--json``;
``%T`` is ``drained`` once the node's jobs are gone and ``draining`` while a job still runs.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufleet import interruption

from .drain import Drainer, DrainError

Runner = Callable[[list[str]], subprocess.CompletedProcess]


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    """Run a Slurm command; a child that died of the signal stopping the rollout (a terminal's Ctrl-C reaches the
    whole process group: ssh exits 255 "Killed by signal 2.", or subprocess finds it gone: ProcessLookupError)
    raises :class:`gpufleet.interruption.Interrupted`, never a DrainError that would fail the node."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        interruption.check()
        raise DrainError(f"{' '.join(argv)}: {error}") from None
    if proc.returncode != 0:
        interruption.check()
    return proc


@dataclass(frozen=True)
class NodeStatus:
    state: str  # sinfo %T: idle, allocated, mixed, draining, drained, drained*, down, ...
    reason: str
    user: str

    @property
    def drain_set(self) -> bool:
        return self.state.rstrip("*~#!%$@^-") in ("draining", "drained", "drain") or "drain" in self.state

    @property
    def drained(self) -> bool:
        return self.state.rstrip("*~#!%$@^-") == "drained"


def parse_sinfo(text: str, node: str) -> NodeStatus:
    """One line of ``sinfo -h -n NODE -o "%T|%E|%u"``; the reason may contain spaces (and ``|``)."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    if not line:
        raise DrainError(f"sinfo knows no node {node!r}")
    state, _, rest = line.partition("|")
    reason, _, user = rest.rpartition("|")
    reason = reason.strip()
    return NodeStatus(state.strip().lower(), "" if reason == "none" else reason, user.strip())


def prefixed(prefix: list[str]) -> Runner:
    """A runner that runs each command through ``prefix`` (``ssh host``): the command as one quoted argument."""
    return lambda argv: _run([*prefix, shlex.join(argv)])


def parse_spec(spec: str, option: str = "--drain") -> list[str]:
    """``slurm`` -> [] (local commands); ``slurm:ssh root@ctl`` -> ["ssh", "root@ctl"]."""
    text = spec.split(":", 1)[1] if ":" in spec else ""
    try:
        prefix = shlex.split(text)
    except ValueError as error:
        raise DrainError(f"{option} {spec!r}: {error}") from None
    if ":" in spec and not prefix:
        raise DrainError(f"{option} {spec!r}: slurm: needs a command prefix, e.g. slurm:ssh root@slurm-ctl")
    return prefix


def command_line(prefix: list[str], argv: list[str]) -> list[str]:
    """What runs a Slurm command: ``argv`` itself, or ``prefix`` with the command as one shell-quoted argument (as
    :func:`prefixed` runs it)."""
    return [*prefix, shlex.join(argv)] if prefix else list(argv)


@dataclass
class SlurmDrainer(Drainer):
    rollout_id: str
    run: Runner = field(default=_run)
    name = "slurm"

    @classmethod
    def from_spec(cls, spec: str, rollout_id: str) -> SlurmDrainer:
        prefix = parse_spec(spec)
        return cls(rollout_id, run=prefixed(prefix) if prefix else _run)

    @property
    def marker(self) -> str:
        return f"gpufleet rollout {self.rollout_id}"

    def status(self, node: str) -> NodeStatus:
        proc = self.run(["sinfo", "-h", "-n", node, "-o", "%T|%E|%u"])
        if proc.returncode != 0:
            raise DrainError(f"sinfo -n {node} exited {proc.returncode}: {proc.stderr.strip()}")
        return parse_sinfo(proc.stdout, node)

    def ours(self, status: NodeStatus) -> bool:
        return status.drain_set and status.reason.startswith(self.marker)

    def _update(self, node: str, *args: str) -> None:
        argv = ["scontrol", "update", f"nodename={node}", *args]
        proc = self.run(argv)
        if proc.returncode != 0:
            raise DrainError(f"{' '.join(argv)} exited {proc.returncode}: "
                             f"{(proc.stderr or proc.stdout).strip()}")

    def drain(self, node: str, reason: str) -> bool:
        status = self.status(node)
        if self.ours(status):
            return True
        if status.drain_set:
            return False  # drained by someone else: stays out of service, and is theirs to resume
        self._update(node, "state=drain", f"reason={self.marker}")
        return True

    def is_drained(self, node: str) -> bool:
        return self.status(node).drained

    def resume(self, node: str) -> None:
        status = self.status(node)
        if not self.ours(status):
            return  # someone re-drained it meanwhile (or resumed it): not ours to touch
        self._update(node, "state=resume")

    def keep_drained(self, node: str, reason: str) -> None:
        if self.ours(self.status(node)):
            self._update(node, "state=drain", f"reason={self.marker}: {reason}"[:200])

    def drained_for_rollout(self, node: str) -> bool | None:
        try:
            return self.ours(self.status(node))
        except (DrainError, interruption.Interrupted):  # Slurm cannot be asked: the record says "may be drained"
            return None
