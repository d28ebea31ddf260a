"""The one Slurm client, shared by rollout's ``--drain slurm`` and verify's ``--via slurm``: Slurm's own commands
(``sinfo``, ``scontrol``, ``srun``, ``scancel``) built as argv and their output parsed, run on this machine (a Slurm
client) or through a prefix: ``slurm:PREFIX`` (e.g. ``slurm:ssh root@slurm-ctl``) runs each command through PREFIX,
with the command as one shell-quoted argument, as ssh passes it to the remote shell. The Slurm node name is the
inventory host name.

``sinfo`` is read with ``-o`` formats (``scontrol`` 22.05 has no ``--json``); ``%T`` is the node state in lower
case with its flag suffix (``drained``, ``idle*``: not responding, ...), ``%E`` the reason (may hold spaces and
``|``; ``none`` when there is none).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpufleet import interruption

IMMEDIATE_S = 30  # srun --immediate: give up when Slurm cannot start the job within this long
# sinfo %T states (without the flag suffixes) of a node that takes a new job now. Not "allocated" (every CPU is in a
# job): a job naming it would wait for those jobs.
USABLE_STATES = ("idle", "mixed", "planned")
BUSY_STATES = ("allocated", "completing")


class SlurmError(Exception):
    """A Slurm command could not run, or its answer or the ``slurm:PREFIX`` value makes no sense."""


# ------------------------------------------------------------------------------------------ where commands run


def parse_spec(spec: str, option: str = "--drain") -> list[str]:
    """``slurm`` -> [] (local commands); ``slurm:ssh root@ctl`` -> ["ssh", "root@ctl"]."""
    text = spec.split(":", 1)[1] if ":" in spec else ""
    try:
        prefix = shlex.split(text)
    except ValueError as error:
        raise SlurmError(f"{option} {spec!r}: {error}") from None
    if ":" in spec and not prefix:
        raise SlurmError(f"{option} {spec!r}: slurm: needs a command prefix, e.g. slurm:ssh root@slurm-ctl")
    return prefix


def command_line(prefix: list[str], argv: list[str]) -> list[str]:
    """What runs a Slurm command: ``argv`` itself, or ``prefix`` with the command as one shell-quoted argument."""
    return [*prefix, shlex.join(argv)] if prefix else list(argv)


# argv -> the finished command (rollout: short commands, the caller judges the exit status)
Runner = Callable[[list[str]], subprocess.CompletedProcess]
# (argv, stdin bytes, timeout seconds) -> (returncode or None when it timed out, stdout, stderr) (verify: long jobs)
BoundedRunner = Callable[[list[str], bytes | None, float], tuple[int | None, str, str]]


def run_command(argv: list[str]) -> subprocess.CompletedProcess:
    """Run a Slurm command; a child that died of the signal stopping gpufleet (a terminal's Ctrl-C reaches the
    whole process group: ssh exits 255 "Killed by signal 2.", or subprocess finds it gone: ProcessLookupError)
    raises :class:`gpufleet.interruption.Interrupted`, never a SlurmError that would fail the node."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        interruption.check()
        raise SlurmError(f"{' '.join(argv)}: {error}") from None
    if proc.returncode != 0:
        interruption.check()
    return proc


def prefixed(prefix: list[str]) -> Runner:
    """A runner that runs each command through ``prefix`` (``ssh host``): the command as one quoted argument."""
    return lambda argv: run_command(command_line(prefix, argv))


def bounded_runner(prefix: list[str]) -> BoundedRunner:
    """Run a Slurm command here (or through ``prefix``), bounded; on timeout, what it printed until then."""

    def run(argv: list[str], stdin: bytes | None, timeout: float) -> tuple[int | None, str, str]:
        line = command_line(prefix, argv)
        try:
            proc = subprocess.Popen(line, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as error:
            return 127, "", f"{shlex.join(line)}: {error}"
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
            code: int | None = proc.returncode
        except KeyboardInterrupt:  # verify (or the rollout) is interrupted: the job step ends with it (srun cancels
            # its step on SIGTERM); in its own session, it did not get the terminal's signal
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            raise
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its children too: they hold the output pipes open
            out, err = proc.communicate()
            code = None
        return code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    return run


# ------------------------------------------------------------------------------------------ sinfo: one node


def sinfo_node_argv(node: str) -> list[str]:
    """State, reason and the user who set it, of one node."""
    return ["sinfo", "-h", "-n", node, "-o", "%T|%E|%u"]


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
        """Drained and its jobs gone (``draining`` while a job still runs)."""
        return self.state.rstrip("*~#!%$@^-") == "drained"


def parse_sinfo(text: str, node: str) -> NodeStatus:
    """One line of :func:`sinfo_node_argv`'s output; the reason may contain spaces (and ``|``)."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    if not line:
        raise SlurmError(f"sinfo knows no node {node!r}")
    state, _, rest = line.partition("|")
    reason, _, user = rest.rpartition("|")
    reason = reason.strip()
    return NodeStatus(state.strip().lower(), "" if reason == "none" else reason, user.strip())


# ------------------------------------------------------------------------------------------ sinfo: many nodes


def sinfo_nodes_argv(nodes: Sequence[str]) -> list[str]:
    """Name, state and reason of each node of ``nodes`` (one line each)."""
    return ["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%T|%E"]


@dataclass(frozen=True)
class NodeState:
    state: str  # sinfo %T, lower case, with its flag suffix (idle, drained, idle*, ...)
    reason: str

    @property
    def usable(self) -> bool:
        """Whether the node takes a new job now: not down, drained, draining, failing or not responding."""
        base = self.state.rstrip("*~#!%$@^-+")
        return base in USABLE_STATES and not self.state.endswith("*")

    def why(self) -> str:
        state = self.state.rstrip("*")
        text = f"{state}, not responding" if self.state.endswith("*") else state
        if state.rstrip("~#!%$@^-+") in BUSY_STATES and not self.reason:
            return f"Slurm node state {text} (every CPU is in a job: verify through Slurm does not wait for them)"
        return f"Slurm node state {text}" + (f" (reason: {self.reason})" if self.reason else "")


def parse_sinfo_nodes(text: str) -> dict[str, NodeState]:
    """Lines of :func:`sinfo_nodes_argv`'s output -> {node: state}; the reason may hold spaces and ``|``."""
    nodes = {}
    for line in text.splitlines():
        name, sep, rest = line.strip().partition("|")
        if not sep or not name:
            continue
        state, _, reason = rest.partition("|")
        reason = reason.strip()
        nodes[name] = NodeState(state.strip().lower(), "" if reason == "none" else reason)
    return nodes


# ------------------------------------------------------------------------------------------ scontrol, scancel


def scontrol_update_argv(node: str, *settings: str) -> list[str]:
    """``scontrol update nodename=NODE state=drain reason=...`` and the like."""
    return ["scontrol", "update", f"nodename={node}", *settings]


def scancel_argv(job_name: str) -> list[str]:
    """Cancel the jobs named ``job_name``."""
    return ["scancel", f"--name={job_name}"]


# ------------------------------------------------------------------------------------------ srun


def time_limit(seconds: int) -> str:
    """srun ``--time`` as ``MINUTES:SECONDS``."""
    return f"{seconds // 60}:{seconds % 60:02d}"


def srun_argv(nodes: Sequence[str], job_name: str, time_s: int, script: str, immediate_s: int = IMMEDIATE_S
              ) -> list[str]:
    """One task on each node of ``nodes`` running ``sh -c script``, bounded by ``time_s`` and by ``immediate_s``
    to start, every output line labelled with its task number; one failing task does not end the others; srun's
    stdin broadcast to every task (``--input=all``: srun's default, named so that a ``SLURM_STDINMODE`` in the
    caller's environment cannot change it; a command-line option overrides the variable)."""
    return ["srun", f"--job-name={job_name}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
            "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", f"--time={time_limit(time_s)}",
            f"--immediate={immediate_s}", "--label", "--kill-on-bad-exit=0", "--input=all", "sh", "-c", script]


def node_messages(stderr: str, node: str) -> list[str]:
    """srun's own lines (stderr) that name ``node``."""
    pattern = re.compile(rf"(?<![\w.-]){re.escape(node)}(?![\w.-])")
    return [line.strip() for line in stderr.splitlines() if pattern.search(line)]


_LAUNCH_FAILED_RE = re.compile(r"Task launch for \S+ failed on node ([^\s:]+)")


def launch_failures(stderr: str) -> set[str]:
    """Nodes on which srun says the job step could not be launched (it then aborts the step on every node)."""
    return set(_LAUNCH_FAILED_RE.findall(stderr))
