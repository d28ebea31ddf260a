"""Read a pyinfra run's per-host result from its ``--json`` document; and the rollout's fallback engine, which runs
the deploy with ``pyinfra --json`` as a subprocess (:class:`Subprocess`) where pyinfra cannot run in the rollout's
own process (:mod:`gpufleet._pyinfra.inprocess`, which gives the same document). ``gpufleet drift`` runs
``pyinfra --dry --json`` with :func:`run_pyinfra` too.

pyinfra's own host order is a set, so the rollout decides the order and gives pyinfra one wave at a time
(``--limit`` per host). ``pyinfra --json`` prints the plan (``--dry``: the operations that would change each host)
or the results (per operation: hosts with success / error / no change, and the failed hosts, e.g. those it could
not connect to) on stdout; its log goes to stderr, where the reason of a host's failure is found.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from gpufleet.pyinfra_args import PyinfraArgs, match_limit, unmatched_error

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# pyinfra's log lines (stderr, default verbosity): a host connected, a host's deploy prepared
_CONNECTED = re.compile(r"^\s*\[([^\]\s]+)\] Connected", re.M)
_READY = re.compile(r"^\s*\[([^\]\s]+)\] Ready: ", re.M)


def pyinfra_executable() -> str:
    """The pyinfra next to this Python (the virtual environment gpufleet runs in), else the one on PATH."""
    here = Path(sys.executable).with_name("pyinfra")
    return str(here) if here.exists() else "pyinfra"


def pyinfra_command(inventory: str, deploy: str, hosts: list[str] | None, *, dry: bool,
                    args: PyinfraArgs | None = None) -> list[str]:
    """``pyinfra --json [-y | --dry] [ARGS] [--limit HOST ...] INVENTORY DEPLOY`` (argv, no shell); ``hosts``
    None: every host of the inventory; ``args``: the user's ``--data``, ``-v``, SSH options. An empty list is
    refused: without a ``--limit`` pyinfra would run on every host."""
    if hosts is not None and not hosts:
        raise ValueError("pyinfra_command: an empty host list (None means every host)")
    cmd = [pyinfra_executable(), "--json", "--dry" if dry else "-y", *(args.argv() if args else ())]
    for name in hosts or ():
        cmd += ["--limit", name]
    return [*cmd, inventory, deploy]


@dataclass
class HostOutcome:
    ok: bool
    changed: bool = False
    reason: str | None = None
    operations_changed: list[str] = field(default_factory=list)


@dataclass
class PyinfraRun:
    rc: int
    payload: dict[str, Any] | None
    stderr: str
    seconds: float = 0.0

    def executed(self) -> bool:
        """Whether pyinfra got as far as executing operations (its ``--> Beginning operation run`` log line): a
        run that stopped before (the deploy's validation or preflight raised while preparing) changed nothing."""
        return self.payload is not None or any(
            "Beginning operation run" in _ANSI.sub("", line) for line in self.stderr.splitlines())

    def error_text(self, lines: int = 15) -> str:
        """What went wrong, from pyinfra's log: from its ``--> pyinfra error`` line on (the deploy's validation and
        preflight errors follow it, one per line), else the host error lines, else the last lines."""
        text = [_ANSI.sub("", ln).rstrip() for ln in self.stderr.splitlines() if ln.strip()]
        start = next((i for i, ln in enumerate(text) if "pyinfra error" in ln.lower()), None)
        if start is not None:
            return "\n".join(text[start:start + lines])
        errors = [ln for ln in text if re.search(r"error|could not|failed", ln, re.IGNORECASE)]
        return "\n".join((errors or text)[-lines:])


def parse_json_stdout(stdout: str) -> dict[str, Any] | None:
    text = stdout.strip()
    if not text:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        # anything printed before the document (a deploy's print()) is not ours to read: take the last object
        start = text.rfind("\n{")
        if start < 0:
            return None
        try:
            data = json.loads(text[start + 1:])
        except json.JSONDecodeError:
            return None
    return data if isinstance(data, dict) else None


def host_log_reason(stderr: str, host: str) -> str | None:
    """The last error pyinfra logged for ``host`` (``[host] Error: ...``, ``[host] Could not connect ...``)."""
    prefix = f"[{host}] "
    found = None
    for line in stderr.splitlines():
        line = _ANSI.sub("", line).strip()
        if line.startswith(prefix):
            rest = line[len(prefix):]
            if re.search(r"error|could not|failed|refus|timed out|unreachable", rest, re.IGNORECASE):
                found = rest
    return found


def host_outcomes(run: PyinfraRun, hosts: list[str]) -> dict[str, HostOutcome]:
    """Per host of the wave: converged (changed or not) or failed with a reason, from pyinfra's JSON results."""
    results = (run.payload or {}).get("results")
    if not isinstance(results, dict):
        reason = f"pyinfra exited {run.rc} without results: " + (run.error_text(3).replace("\n", " | ") or "no output")
        return {h: HostOutcome(ok=False, reason=reason) for h in hosts}
    out = {h: HostOutcome(ok=True) for h in hosts}
    failed = set(results.get("failed_hosts") or [])
    for op in results.get("operations") or []:
        for h in op.get("success") or []:
            if h in out:
                out[h].changed = True
                out[h].operations_changed.append(op.get("name") or "?")
        for h in op.get("error") or []:
            if h in out and out[h].ok:
                out[h] = HostOutcome(ok=False, reason=f"operation failed: {op.get('name')}"
                                     + (f" ({r})" if (r := host_log_reason(run.stderr, h)) else ""))
    for h in failed & set(out):
        if out[h].ok:
            out[h] = HostOutcome(ok=False, reason=host_log_reason(run.stderr, h) or "pyinfra marked the host failed")
    return out


def run_pyinfra(inventory: str, deploy: str, hosts: list[str] | None, *, dry: bool, cwd: str | None = None,
                timeout: float | None = None, args: PyinfraArgs | None = None, log: TextIO | None = None
                ) -> PyinfraRun:
    """One ``pyinfra --json`` process (see :func:`pyinfra_command`); with ``args.verbosity`` its log is copied to
    ``log`` (the user asked for it with ``-v``). When this process is interrupted (a terminal's signal reaches the
    pyinfra child too), the child's own report of the hosts it had mid-change is attached to the exception
    (``child_report``)."""
    import time

    start = time.monotonic()
    proc = subprocess.Popen(pyinfra_command(inventory, deploy, hosts, dry=dry, args=args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, stdin=subprocess.DEVNULL)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except KeyboardInterrupt as error:
        error.child_report = _stop_child(proc, getattr(error, "signum", None))
        raise
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    if args and args.verbosity and log is not None:
        log.write(stderr)
        log.flush()
    return PyinfraRun(rc=proc.returncode, payload=parse_json_stdout(stdout), stderr=stderr,
                      seconds=time.monotonic() - start)


def _stop_child(proc: subprocess.Popen, signum: int | None, wait_s: float = 10.0) -> str | None:
    """The interrupted pyinfra child: passed the signal (a terminal sent it to both already; a ``kill`` to this
    process alone did not), given ``wait_s`` to exit, killed after; returns its ``gpufleet: interrupted`` report."""
    import signal

    try:
        if proc.poll() is None:
            proc.send_signal(signum or signal.SIGINT)
        _, stderr = proc.communicate(timeout=wait_s)
    except Exception:  # it did not end in time (or its pipes are gone): it must not outlive us
        proc.kill()
        return None
    text = _ANSI.sub("", stderr or "")
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("gpufleet: interrupted")), None)
    if start is None:
        return None
    report = "\n".join(lines[start:])
    if "before executing anything" in lines[start]:
        # still preparing (reading facts, no change yet): the hosts pyinfra had connected but not yet "Ready:"
        ready = set(_READY.findall(text))
        reading = [h for h in dict.fromkeys(_CONNECTED.findall(text)) if h not in ready]
        if reading:
            report += "\nHosts still being read (facts; nothing is changed before execution): " + ", ".join(reading)
    return report


def planned_changes(run: PyinfraRun) -> dict[str, list[str]]:
    """From a ``--dry --json`` run: {host: [operations that would change it]} (conditional changes included)."""
    out: dict[str, list[str]] = {}
    for op in (run.payload or {}).get("plan") or []:
        for h in [*(op.get("hosts_with_change") or []), *(op.get("hosts_with_conditional_change") or [])]:
            out.setdefault(h, []).append(op.get("name") or "?")
    return out


def inventory_order(inventory: str, *, cwd: str | None = None, args: PyinfraArgs | None = None
                    ) -> tuple[list[str], str | None]:
    """The hosts of the inventory in pyinfra's order (``pyinfra --json INVENTORY debug-inventory``), those
    ``args.limit`` selects, or an error."""
    from gpufleet import interruption  # (the rollout layer sits above it; imported where used)

    data_args = args.argv(verbose=False) if args else []  # the hosts' data as the runs will see it
    try:
        proc = subprocess.run([pyinfra_executable(), "--json", *data_args, inventory, "debug-inventory"],
                              capture_output=True, text=True, cwd=cwd, check=False, stdin=subprocess.DEVNULL)
    except OSError:
        interruption.check()  # ProcessLookupError: the child died of the signal that interrupts us
        raise
    data = None
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pass
    if proc.returncode != 0 or not isinstance(data, list):
        run = PyinfraRun(rc=proc.returncode, payload=None, stderr=proc.stderr)
        return [], f"cannot load the inventory {inventory}:\n{run.error_text()}"
    hosts = [_Listed(h["name"], h.get("groups") or []) for h in data]
    if args and args.patterns:
        chosen, unmatched = match_limit(hosts, args.patterns)
        if unmatched:
            return [], unmatched_error(unmatched, inventory, hosts)
        hosts = [h for h in hosts if h in chosen]  # pyinfra's order, not the patterns'
    return [h.name for h in hosts], None


@dataclass(frozen=True)
class _Listed:
    """A host as ``debug-inventory`` lists it."""

    name: str
    groups: list[str]


class Subprocess:
    """The rollout's runs as ``pyinfra --json`` processes: the order from ``pyinfra debug-inventory``, each pass and
    wave a process of its own (the same interface as :class:`gpufleet._pyinfra.inprocess.Session`)."""

    name = "subprocess"
    interruption = None  # the pyinfra process reports its hosts mid-change itself

    def __init__(self, inventory: str, deploy: str, args: PyinfraArgs | None = None, log: TextIO | None = None
                 ) -> None:
        self.inventory, self.deploy, self.args, self.log = inventory, deploy, args, log

    def order(self) -> tuple[list[str], str | None]:
        return inventory_order(self.inventory, args=self.args)

    def run(self, hosts: list[str] | None, *, plan: bool, keep_plan: bool = False, refresh: bool = True
            ) -> PyinfraRun:
        """``keep_plan`` and ``refresh`` are for the in-process engine: every wave here is a pyinfra process that
        plans anew on facts read then."""
        return run_pyinfra(self.inventory, self.deploy, hosts, dry=plan, args=self.args, log=self.log)

    def close(self) -> None:
        return None
