"""Taking nodes out of service around their change: ``--drain none | command:CMD | slurm | slurm:PREFIX``.

A drainer answers four questions per node: drain it (returns whether this rollout drained it: a node already
drained by someone else is never ours to resume), is it drained yet (its jobs finished), resume it, and why not.
``command:CMD`` calls a hook for any scheduler (argv, no shell); ``slurm`` uses Slurm's own client commands
(:mod:`gpufleet.slurm`), here or through ``slurm:PREFIX``. With Slurm, the drain reason naming the rollout is the
record of whose drain it is; a failed node keeps its drain, with the reason. docs/rollout.md has the commands.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass, field

from gpufleet import interruption, slurm
from gpufleet.masking import mask_urls


class DrainError(Exception):
    pass


class Drainer:
    name = "none"

    def drain(self, node: str, reason: str) -> bool:
        """Take ``node`` out of service; True when this call drained it (False: nothing to do or not ours)."""
        return False

    def is_drained(self, node: str) -> bool:
        return True

    def resume(self, node: str) -> None:
        return None

    def keep_drained(self, node: str, reason: str) -> None:
        """A node that failed stays drained: record why (where the scheduler keeps a reason)."""
        return None

    def drained_for_rollout(self, node: str) -> bool | None:
        """Asked again after an interruption, whose signal may have cut a drain or resume command off: whether
        ``node`` is drained by this rollout now; None when the drainer cannot tell (the record stands)."""
        return None


@dataclass
class CommandDrainer(Drainer):
    argv: list[str]
    timeout: float = 300.0
    name = "command"

    @classmethod
    def parse(cls, spec: str) -> CommandDrainer:
        text = spec.split(":", 1)[1] if ":" in spec else ""
        try:
            argv = shlex.split(text)
        except ValueError as error:
            raise DrainError(f"--drain {spec!r}: {error}") from None
        if not argv:
            raise DrainError(f"--drain {spec!r}: command: needs a command, e.g. command:/usr/local/bin/drain-hook")
        return cls(argv)

    def _shown(self, action: str, node: str) -> str:
        """The hook as messages (and so the state file and reports) name it: its program only, never its arguments,
        which may hold a token."""
        return f"{shlex.quote(os.path.basename(self.argv[0]))} … {shlex.join([action, node])}"

    def _call(self, action: str, node: str, env_reason: str | None = None) -> subprocess.CompletedProcess:
        env = dict(os.environ, GPUFLEET_ROLLOUT_ACTION=action, GPUFLEET_NODE=node)
        if env_reason:
            env["GPUFLEET_ROLLOUT_REASON"] = env_reason
        try:
            proc = subprocess.run([*self.argv, action, node], capture_output=True, text=True, timeout=self.timeout,
                                  check=False, env=env, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as error:
            interruption.check()  # e.g. ProcessLookupError: the hook died of the signal that stops the rollout
            raise DrainError(f"{self._shown(action, node)}: {mask_urls(str(error))}") from None
        if proc.returncode != 0:
            interruption.check()  # it died of the terminal's signal with the rollout: not the node's failure
        return proc

    def _check(self, proc: subprocess.CompletedProcess, action: str, node: str) -> None:
        if proc.returncode != 0:
            out = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-3:]
            raise DrainError(f"{self._shown(action, node)} exited {proc.returncode}"
                             + (f": {mask_urls(' | '.join(out))}" if out else ""))

    def drain(self, node: str, reason: str) -> bool:
        self._check(self._call("drain", node, reason), "drain", node)
        return True

    def is_drained(self, node: str) -> bool:
        return self._call("drained", node).returncode == 0

    def resume(self, node: str) -> None:
        self._check(self._call("resume", node), "resume", node)

    def keep_drained(self, node: str, reason: str) -> None:
        self._call("failed", node, reason)

    def drained_for_rollout(self, node: str) -> bool | None:
        return None  # the hook says whether a node is drained, not by whom: a cut-off drain may have happened


@dataclass
class SlurmDrainer(Drainer):
    rollout_id: str
    run: slurm.Runner = field(default=slurm.run_command)
    name = "slurm"

    @classmethod
    def from_spec(cls, spec: str, rollout_id: str) -> SlurmDrainer:
        try:
            prefix = slurm.parse_spec(spec)
        except slurm.SlurmError as error:
            raise DrainError(str(error)) from None
        return cls(rollout_id, run=slurm.prefixed(prefix) if prefix else slurm.run_command)

    @property
    def marker(self) -> str:
        return f"gpufleet rollout {self.rollout_id}"

    def _call(self, argv: list[str]) -> subprocess.CompletedProcess:
        try:
            return self.run(argv)
        except slurm.SlurmError as error:  # the command could not run: the node's drain failed
            raise DrainError(str(error)) from None

    def status(self, node: str) -> slurm.NodeStatus:
        proc = self._call(slurm.sinfo_node_argv(node))
        if proc.returncode != 0:
            raise DrainError(f"sinfo -n {node} exited {proc.returncode}: {proc.stderr.strip()}")
        try:
            return slurm.parse_sinfo(proc.stdout, node)
        except slurm.SlurmError as error:
            raise DrainError(str(error)) from None

    def ours(self, status: slurm.NodeStatus) -> bool:
        return status.drain_set and status.reason.startswith(self.marker)

    def _update(self, node: str, *settings: str) -> None:
        argv = slurm.scontrol_update_argv(node, *settings)
        proc = self._call(argv)
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


def make_drainer(spec: str, rollout_id: str) -> Drainer:
    if spec == "none":
        return Drainer()
    if spec.startswith("command:"):
        return CommandDrainer.parse(spec)
    if spec == "slurm" or spec.startswith("slurm:"):
        return SlurmDrainer.from_spec(spec, rollout_id)
    raise DrainError(f"--drain {spec!r}: allowed: none, slurm, slurm:PREFIX, command:CMD")
