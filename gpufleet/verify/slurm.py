"""``gpufleet verify --via slurm``: the probe runs on every node as ONE Slurm job, and its results go through the same
checks and reports as over SSH.

``sinfo`` first leaves out (as ``unreachable``, with Slurm's reason) the nodes that cannot take a job now, since a
job naming them would wait or be refused. One bounded ``srun`` then broadcasts the probe bundle and the exporters'
credentials on its stdin: no shared filesystem is assumed, nothing is left on the nodes, and the password is on no
command line, environment, Slurm record or file. ``--label`` and per-node markers take the interleaved output apart
(:func:`split_tasks`). A node whose slurmd died unnoticed aborts the whole step, so the others run once more without
it. The Slurm commands run here or through ``slurm:PREFIX``, as rollout's drain (:mod:`gpufleet.slurm`).
docs/verify.md describes the job.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
import secrets
import shlex
import tarfile
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from gpufleet.config import NodeConfig
from gpufleet.results import HostResult
from gpufleet.slurm import (
    IMMEDIATE_S,
    BoundedRunner,
    NodeState,
    SlurmError,
    launch_failures,
    node_messages,
    parse_sinfo_nodes,
    parse_spec,
    scancel_argv,
    sinfo_nodes_argv,
    srun_argv,
)

from .bundle import ProbeBundle, VerifyError
from .checks import evaluate_host, probe_failed_host, unreachable_host
from .expected import expected_state
from .remote import PROBE_TIMEOUT_S, TEXTFILE_NAME, ProbeFailed, parse_script_output, probe_document, probe_script

NODE_MARK = "@@gpufleet-slurm"
JOB_PREFIX = "gpufleet-verify"
SLACK_S = 60  # on top of --time and --immediate before the srun command itself is killed
RETRY_WAIT_S = 90  # before the second job: Slurm releasing the nodes of an aborted job (SlurmdTimeout and more)
REMEDIATION = ("Slurm cannot run a job on this node: see its state and reason (sinfo -n NODE), fix and resume it, "
               "then rerun verify (the other nodes were verified)")


def parse_via(via: str) -> list[str] | None:
    """``ssh`` -> None; ``slurm`` -> [] (local Slurm commands); ``slurm:PREFIX`` -> PREFIX as argv."""
    if via == "ssh":
        return None
    if via == "slurm" or via.startswith("slurm:"):
        try:
            return parse_spec(via, option="--via")
        except SlurmError as error:
            raise VerifyError(str(error)) from None
    raise VerifyError(f"--via {via!r}: allowed: ssh, slurm, slurm:PREFIX (e.g. slurm:ssh root@slurm-ctl)")


# ------------------------------------------------------------------------------------------ which nodes


# ------------------------------------------------------------------------------------------ the job


def bundle_archive(bundle: ProbeBundle) -> bytes:
    """The probe bundle as one tar.gz (flat: the file names of the probe directory), the job's stdin."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for f in bundle.files:
            info = tar.gettarinfo(f.path, arcname=f.name)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            info.mode = 0o644
            with open(f.path, "rb") as handle:
                tar.addfile(info, handle)
    return buffer.getvalue()


def python_assignment(pythons: Mapping[str, str]) -> str:
    """Shell code setting ``py`` to the node's Python: one for all nodes, else a ``case`` on ``$SLURMD_NODENAME``
    (the job is the same command on every node)."""
    values = sorted(set(pythons.values())) or ["python3"]
    common = max(values, key=lambda v: sum(1 for p in pythons.values() if p == v))
    if len(values) == 1:
        return f"py={shlex.quote(common)}"
    arms = " ".join(f"{shlex.quote(node)}) py={shlex.quote(py)};;" for node, py in sorted(pythons.items())
                    if py != common)
    return f'case "$SLURMD_NODENAME" in {arms} *) py={shlex.quote(common)};; esac'


EXPORTERS_MARK = f"{NODE_MARK} exporters"
EXPORTERS_END = f"{NODE_MARK} exporters-end"


def exporters_header(endpoints: Mapping[str, Mapping[str, Any] | None]) -> bytes:
    """The lines before the bundle on the job's stdin: what each node's probe scrapes (``{node: {name: {"url",
    "user", "password"}}}``, None: the exporters stage is off), one JSON line per distinct value: the most common
    one for every node (``*``), the others by node name; then :data:`EXPORTERS_END`. The password is the same on
    every node (one ``exporters`` account), so a node reading the others' lines learns nothing more."""
    values = {node: json.dumps(dict(value or {}), sort_keys=True, separators=(",", ":"))
              for node, value in endpoints.items()}
    common = max(sorted(set(values.values())), key=list(values.values()).count) if values else "{}"
    lines = [f"{EXPORTERS_MARK} * {common}"]
    lines += [f"{EXPORTERS_MARK} {node} {value}" for node, value in sorted(values.items()) if value != common]
    return ("\n".join([*lines, EXPORTERS_END]) + "\n").encode("utf-8")


# Reads the header line by line (the shell's ``read`` takes one byte at a time from a pipe: ``tar`` gets the
# stream from the bundle's first byte): ``gfx`` holds the node's JSON line, in the shell's memory only (not
# exported: no process's environment or arguments show it); a node named on no line gets the ``*`` line.
_READ_EXPORTERS = (
    "gfd='{}'; gfn=; while IFS= read -r gfl; do case \"$gfl\" in "
    f'"{EXPORTERS_END}") break;; '
    f'"{EXPORTERS_MARK} * "*) gfd=${{gfl#"{EXPORTERS_MARK} * "}};; '
    f'"{EXPORTERS_MARK} $SLURMD_NODENAME "*) gfn=${{gfl#"{EXPORTERS_MARK} $SLURMD_NODENAME "}};; '
    'esac; done; gfx=${gfn:-$gfd}'
)


def task_script(bundle: ProbeBundle, pythons: Mapping[str, str], bench: str) -> str:
    """What each task runs (``sh -c``): markers, the exporters' endpoints from stdin (:func:`exporters_header`),
    the bundle from stdin into a temporary directory, the SSH engine's probe script there (``check_bundle=False``:
    the bundle was just unpacked), its probe given the node's endpoints on its stdin as over SSH
    (``--exporters-stdin``) through a pipe from the shell's ``printf`` builtin: no file, no command line."""
    script = probe_script(bundle, python="$py", bench=bench, remote_dir=".", check_bundle=False, exporters=True)
    script = script.replace(shlex.quote("$py"), '"$py"')  # probe_script quotes the word: the shell expands it here
    # (``gfdir``: the PCI section's sysfs loop uses ``d``)
    # The output goes through gzip | base64: srun cuts long lines (a probe document is one) into separately
    # labelled pieces, base64 lines are short; and 1000 nodes' output stays small.
    return (
        f'exec 2>&1; echo "{NODE_MARK} begin $SLURMD_NODENAME"; {{ {python_assignment(pythons)}; '
        f"{_READ_EXPORTERS}; "
        'gfdir=$(mktemp -d "${TMPDIR:-/tmp}/gpufleet-probe.XXXXXX") || exit 1; '
        'if tar -xzf - -C "$gfdir"; then cd "$gfdir" && { printf \'%s\\n\' "$gfx" | { ' + script + "; }; }; "
        f'else echo "{NODE_MARK} bundle-failed"; fi; '
        'cd /; rm -rf "$gfdir"; } 2>&1 | gzip -c | base64; '
        f'echo "{NODE_MARK} end $SLURMD_NODENAME"'
    )


# ------------------------------------------------------------------------------------------ the output

_LABEL_RE = re.compile(r"^\s*(\d+): ?(.*)$")


@dataclass
class TaskOutput:
    node: str | None = None
    encoded: list[str] = field(default_factory=list)  # base64 of the gzip of what the task printed
    ended: bool = False

    @cached_property
    def lines(self) -> list[str]:
        """What the task printed: as much as decodes (a task cut short leaves a truncated stream); lines that are
        not our encoding as they came."""
        text = "".join(line.strip() for line in self.encoded)
        try:
            raw = base64.b64decode(text[: len(text) - len(text) % 4], validate=True)
            data = zlib.decompressobj(wbits=31).decompress(raw)
        except (binascii.Error, ValueError, zlib.error):
            return list(self.encoded)
        return data.decode("utf-8", "replace").splitlines()

    @property
    def bundle_failed(self) -> bool:
        return f"{NODE_MARK} bundle-failed" in self.lines


def split_tasks(stdout: str) -> dict[str, TaskOutput]:
    """srun ``--label`` output -> {node: its task's lines between the begin and end markers}. Lines without a task
    label (srun's own) and tasks that never named their node are left out."""
    tasks: dict[int, TaskOutput] = {}
    for raw in stdout.splitlines():
        match = _LABEL_RE.match(raw)
        if not match:
            continue
        task = tasks.setdefault(int(match.group(1)), TaskOutput())
        line = match.group(2)
        if line.startswith(f"{NODE_MARK} "):
            word, _, rest = line[len(NODE_MARK) + 1:].partition(" ")
            if word == "begin" and task.node is None:
                task.node = rest.strip()
            elif word == "end":
                task.ended = True
            continue
        if task.node is not None and not task.ended:
            task.encoded.append(line)
    return {t.node: t for t in tasks.values() if t.node}


def _tail(text: str, n: int = 2) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-n:])[-300:]


@dataclass
class NodeResult:
    """A node's outcome: a probe document with its PCI fact, or why not (``unreachable`` / ``probe_failed``)."""

    node: str
    probe: dict[str, Any] | None = None
    pci: dict[str, Any] | None = None
    unreachable: str | None = None
    probe_failed: str | None = None


def gather(nodes: Sequence[str], code: int | None, stdout: str, stderr: str, *, time_s: int) -> dict[str, NodeResult]:
    """Each node's result from one srun's exit status and output (``code`` None: srun was killed after the bound)."""
    tasks = split_tasks(stdout)
    results = {}
    for node in nodes:
        result = NodeResult(node)
        task = tasks.get(node)
        if task is None:
            said = node_messages(stderr, node)
            if code is None:
                why = f"no output from its Slurm task before srun was stopped ({time_s} s job limit passed)"
            else:
                why = "no output from its Slurm task"
            detail = " | ".join(said[-2:]) if said else _tail(stderr)
            result.unreachable = why + (f": {detail}" if detail else f" (srun exit status {code})")
        elif task.bundle_failed:
            unpacked = _tail(chr(10).join(task.lines))
            result.probe_failed = f"the probe bundle could not be unpacked on the node: {unpacked}"
        else:
            out = parse_script_output(task.lines)
            lines, rc = out.probe_lines, out.probe_rc
            try:
                if not task.ended or (lines is not None and rc is None):
                    raise ProbeFailed(f"cut short by the Slurm job's end (time limit {time_s} s): "
                                      f"{_tail(chr(10).join(task.lines)) or 'no output'}")
                result.probe, result.pci = probe_document(lines, rc), out.pci
            except ProbeFailed as error:
                result.probe_failed = str(error)
        results[node] = result
    return results


def host_result(result: NodeResult, config: NodeConfig) -> HostResult:
    """The same checks as over SSH (:func:`gpufleet.verify.checks.evaluate_host` against the host's expected
    state)."""
    if result.unreachable is not None:
        return slurm_unreachable(result.node, result.unreachable)
    if result.probe_failed is not None or result.probe is None:
        return probe_failed_host(result.node, result.probe_failed or "no probe document")
    try:
        return evaluate_host(result.node, result.probe, expected_state(config, result.probe, pci=result.pci))
    except Exception as exc:  # one host's surprise must not stop the fleet's verify (as over SSH)
        return probe_failed_host(result.node, f"{type(exc).__name__}: {exc}")


def slurm_unreachable(node: str, reason: str) -> HostResult:
    host = unreachable_host(node, reason)
    for check in host.checks:
        check.remediation = REMEDIATION
    return host


# ------------------------------------------------------------------------------------------ the run


@dataclass
class SlurmVerify:
    """One ``--via slurm`` run: the node states, the job, each node's result."""

    run: BoundedRunner
    job_name: str = field(default_factory=lambda: f"{JOB_PREFIX}-{secrets.token_hex(4)}")
    immediate_s: int = IMMEDIATE_S
    time_s: int | None = None  # default: the probe's own timeout for the bench profile
    states: dict[str, NodeState] = field(default_factory=dict)
    job_seconds: float = 0.0

    def node_states(self, nodes: Sequence[str]) -> dict[str, NodeState]:
        code, out, err = self.run(sinfo_nodes_argv(nodes), None, 60)
        if code != 0:
            what = "did not answer within 60 s" if code is None else f"exited {code}"
            raise VerifyError(f"sinfo {what}: {_tail(err or out) or 'no output'} (is this a Slurm client? "
                              "--via slurm:PREFIX runs the Slurm commands through PREFIX)")
        return parse_sinfo_nodes(out)

    def probe(self, nodes: Sequence[str], bundle: ProbeBundle, pythons: Mapping[str, str], bench: str,
              exporters: Mapping[str, Mapping[str, Any] | None] | None = None) -> dict[str, NodeResult]:
        """Every node's result: Slurm's state first, then one srun over the nodes that can take it. ``exporters``:
        each node's exporter endpoints with their credentials (:func:`~.exporter_checks.exporter_endpoints`), sent
        on the job's stdin before the bundle (:func:`exporters_header`)."""
        self.states = self.node_states(nodes)
        results: dict[str, NodeResult] = {}
        usable = []
        for node in nodes:
            state = self.states.get(node)
            if state is None:
                results[node] = NodeResult(node, unreachable="not a node of this Slurm cluster (sinfo does not list "
                                                             "it; the Slurm node name is the inventory host name)")
            elif not state.usable:
                results[node] = NodeResult(node, unreachable=state.why())
            else:
                usable.append(node)
        time_s = self.time_s or PROBE_TIMEOUT_S[bench]
        script = task_script(bundle, pythons, bench)
        stdin = exporters_header({n: (exporters or {}).get(n) for n in usable}) + bundle_archive(bundle)
        start = time.monotonic()
        # A node whose slurmd does not take the task (dead, and Slurm has not noticed yet) aborts the whole job
        # step, the other nodes' tasks with it: once, the nodes without a result run again without it.
        for attempt in range(2):
            if not usable:
                break
            if attempt:  # the aborted job still holds the nodes until Slurm has cleaned it up
                self.cancel()
                self.wait_until_usable(usable, RETRY_WAIT_S)
            argv = srun_argv(usable, self.job_name, time_s, script, self.immediate_s)
            code, out, err = self.run(argv, stdin, time_s + self.immediate_s + SLACK_S)
            if code is None:
                self.cancel()
            found = gather(usable, code, out, err, time_s=time_s)
            results.update(found)
            failed = launch_failures(err)
            usable = [n for n in usable if failed and n not in failed and found[n].probe is None]
        self.job_seconds = time.monotonic() - start
        return {node: results[node] for node in nodes}

    def wait_until_usable(self, nodes: Sequence[str], bound_s: float) -> None:
        """Until Slurm lists every node of ``nodes`` as able to take a job, at most ``bound_s`` (then the job runs
        anyway and ``--immediate`` decides)."""
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            states = self.node_states(nodes)
            if all(n in states and states[n].usable for n in nodes):
                return
            time.sleep(1)

    def cancel(self) -> None:
        """The job outlived its bound: cancel it (srun was killed here; the job may still hold the nodes)."""
        self.run(scancel_argv(self.job_name), None, 30)

    def write_textfiles(self, files: Mapping[str, tuple[str, str]]) -> dict[str, str]:
        """Each node's Prometheus textfile into its directory (``{node: (directory, text)}``), atomically, by a
        second srun; returns {node: error} for the nodes where it was not written."""
        if not files:
            return {}
        nodes = list(files)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for node, (directory, prom) in files.items():
                for name, text in ((f"{node}.prom", prom), (f"{node}.dir", directory)):
                    raw = text.encode("utf-8")
                    info = tarfile.TarInfo(name)
                    info.size, info.mode = len(raw), 0o644
                    tar.addfile(info, io.BytesIO(raw))
        script = (
            f'exec 2>&1; echo "{NODE_MARK} begin $SLURMD_NODENAME"; {{ d=$(mktemp -d) || exit 1; '
            'if tar -xzf - -C "$d" && t=$(cat "$d/$SLURMD_NODENAME.dir") && mkdir -p "$t" '
            f'&& cp "$d/$SLURMD_NODENAME.prom" "$t/.{TEXTFILE_NAME}.tmp" && chmod 0644 "$t/.{TEXTFILE_NAME}.tmp" '
            f'&& mv -f "$t/.{TEXTFILE_NAME}.tmp" "$t/{TEXTFILE_NAME}"; then echo ok; else echo failed; fi; '
            f'rm -rf "$d"; }} 2>&1 | gzip -c | base64; echo "{NODE_MARK} end $SLURMD_NODENAME"'
        )
        argv = srun_argv(nodes, f"{self.job_name}-textfile", 120, script, self.immediate_s)
        code, out, err = self.run(argv, buffer.getvalue(), 120 + self.immediate_s + SLACK_S)
        if code is None:
            self.cancel()
        tasks = split_tasks(out)
        errors = {}
        for node in nodes:
            task = tasks.get(node)
            if task is None or task.lines[-1:] != ["ok"]:
                errors[node] = (" | ".join(task.lines[-2:]) if task else "") or _tail(err) or "no output"
        return errors
