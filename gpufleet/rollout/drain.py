"""Taking nodes out of service around their change: ``--drain none | command:CMD | slurm``.

A drainer answers four questions per node: drain it (returns whether this rollout drained it: a node already
drained by someone else is never ours to resume), is it drained yet (its jobs finished), resume it, and why not.

``command:CMD`` is the generic hook for any scheduler: gpufleet runs ``CMD drain NODE``, ``CMD drained NODE``
(exit 0 once the node runs no job; polled while ``--wait-for-jobs`` lasts) and ``CMD resume NODE`` (argv, no
shell; CMD is split like a shell would). A non-zero exit of ``drain`` / ``resume`` fails the node with the hook's
output as the reason.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass

from gpufleet import interruption
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


def make_drainer(spec: str, rollout_id: str) -> Drainer:
    if spec == "none":
        return Drainer()
    if spec.startswith("command:"):
        return CommandDrainer.parse(spec)
    if spec == "slurm" or spec.startswith("slurm:"):
        from .slurm import SlurmDrainer  # noqa: PLC0415

        return SlurmDrainer.from_spec(spec, rollout_id)
    raise DrainError(f"--drain {spec!r}: allowed: none, slurm, slurm:PREFIX, command:CMD")
