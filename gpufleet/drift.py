"""``gpufleet drift INVENTORY [DEPLOY]``: what the deploy would change on every host, without changing anything.

It is the deploy itself run by ``pyinfra --dry --json`` (the same validation, preflight, facts and operations a
converge goes through; each operation decides from the host's facts whether it has something to do), summarised
per setting (operation) and per host. Exit code: 0 no drift, 1 drift, 2 could not tell (bad input, a host that
could not be reached).
"""

from __future__ import annotations

import json
import re
import signal
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

from gpufleet import interruption, pyinfra_args
from gpufleet.pyinfra_args import PyinfraArgs
from gpufleet.rollout import converge
from gpufleet.rollout.report import abbreviated

EXIT_IN_SYNC, EXIT_DRIFT, EXIT_UNKNOWN = 0, 1, 2
DEFAULT_DEPLOY = pyinfra_args.DEFAULT_DEPLOY


def setting_name(operation: str) -> str:
    """``gpufleet: GPU node | GPU power limits`` -> ``GPU power limits`` (the operation's own name)."""
    return operation.split(" | ", 1)[-1]


@dataclass
class Drift:
    hosts: list[str]
    settings: dict[str, list[str]] = field(default_factory=dict)  # setting -> hosts that would change
    maybe: dict[str, list[str]] = field(default_factory=dict)  # setting -> hosts that might change (conditional)
    unreachable: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    def by_host(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {h: [] for h in self.hosts}
        for setting, names in self.settings.items():
            for h in names:
                out.setdefault(h, []).append(setting)
        return out

    @property
    def exit_code(self) -> int:
        if self.error or self.unreachable:
            return EXIT_UNKNOWN
        return EXIT_DRIFT if any(self.settings.values()) or any(self.maybe.values()) else EXIT_IN_SYNC

    def to_dict(self) -> dict[str, Any]:
        by_host = self.by_host()
        return {"schema": "gpufleet.drift", "schema_version": 1, "exit_code": self.exit_code, "error": self.error,
                "hosts": by_host, "settings": {k: v for k, v in self.settings.items() if v},
                "conditional": {k: v for k, v in self.maybe.items() if v},
                "in_sync": [h for h in self.hosts if not by_host.get(h) and h not in self.unreachable],
                "unreachable": self.unreachable}


def drift_from_run(run: converge.PyinfraRun, hosts: list[str]) -> Drift:
    """The Drift of a ``pyinfra --dry --json`` run over ``hosts``."""
    if run.rc != 0 or run.payload is None:
        return Drift(hosts, error="the deploy could not plan (nothing was changed):\n" + run.error_text(40))
    drift = Drift(hosts)
    for op in run.payload.get("plan") or []:
        name = setting_name(op.get("name") or "?")
        drift.settings[name] = list(op.get("hosts_with_change") or [])
        drift.maybe[name] = list(op.get("hosts_with_conditional_change") or [])
    for h in hosts:
        reason = converge.host_log_reason(run.stderr, h)
        if reason and re.search(r"could not connect|connect|timed out|refused", reason, re.IGNORECASE):
            drift.unreachable[h] = reason
    return drift


def text(drift: Drift) -> str:
    if drift.error:
        return f"gpufleet drift: {drift.error}"
    data = drift.to_dict()
    drifted = [h for h, s in data["hosts"].items() if s]
    lines = [f"gpufleet drift: {len(drifted)} of {len(drift.hosts)} host(s) differ from the configuration"
             + (f", {len(drift.unreachable)} unreachable" if drift.unreachable else "")]
    if data["settings"] or data["conditional"]:
        lines.append("by setting:")
        for setting, names in data["settings"].items():
            lines.append(f"  {setting}: {', '.join(names)}")
        for setting, names in data["conditional"].items():
            lines.append(f"  {setting} (may change): {', '.join(names)}")
        lines.append("by host:")
        for h in drifted:
            lines.append(f"  {h}: {'; '.join(data['hosts'][h])}")
    for h, why in drift.unreachable.items():
        lines.append(f"  {h}: UNREACHABLE ({why})")
    if data["in_sync"]:
        lines.append(f"in sync: {abbreviated(data['in_sync'])}")
    return "\n".join(lines)


def _stderr(text: str) -> None:
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except OSError:  # the terminal is gone (SIGHUP)
        pass


def run_drift(inventory: str, deploy: str = DEFAULT_DEPLOY, args: PyinfraArgs | None = None,
              log: TextIO | None = None, jobs: int = 1) -> Drift:
    """The drift of the hosts ``args.limit`` selects (every host without), pyinfra run with the user's ``--data``,
    ``-v`` and SSH options (its log to ``log`` with ``-v``); with ``jobs`` > 1 in as many worker processes, each
    on a slice of the hosts (:mod:`gpufleet.apply`: the same plan, merged)."""
    problem = pyinfra_args.check_deploy(deploy)
    if problem:
        return Drift([], error=problem)
    if jobs > 1:
        return _drift_over_workers(inventory, deploy, args, jobs)
    hosts, error = converge.inventory_order(inventory, args=args)
    if error:
        return Drift([], error=error)
    chosen = hosts if args and args.patterns else None
    return drift_from_run(converge.run_pyinfra(inventory, deploy, chosen, dry=True, args=args, log=log), hosts)


def _drift_over_workers(inventory: str, deploy: str, args: PyinfraArgs | None, jobs: int) -> Drift:
    from gpufleet import apply

    planned = apply.plan(inventory, deploy, jobs, args)
    if planned.interrupted:
        raise _Stopped(planned.exit_code, planned.interrupted)
    if planned.exit_code == apply.EXIT_USAGE:
        return Drift([], error=planned.log.strip())
    run = converge.PyinfraRun(rc=planned.exit_code, payload=planned.payload, stderr=planned.log)
    return drift_from_run(run, planned.hosts)


class _Stopped(KeyboardInterrupt):
    """The workers were stopped by a signal (their coordinator said where)."""

    def __init__(self, status: int, report: str) -> None:
        super().__init__(report)
        self.signum = status - 128
        self.child_report = report


def main(inventory: str, deploy: str = DEFAULT_DEPLOY, *, as_json: bool = False, echo=print,
         args: PyinfraArgs | None = None, log: TextIO | None = None, jobs: int = 1) -> int:
    try:
        drift = run_drift(inventory, deploy, args, log if log is not None else sys.stderr, jobs=jobs)
    except KeyboardInterrupt as error:  # SIGINT, SIGTERM, SIGHUP (gpufleet.interruption.catch_signals)
        status = interruption.status_of(error)
        report = getattr(error, "child_report", None)  # pyinfra's own: the hosts it was reading
        _stderr(f"gpufleet drift: interrupted by {signal.Signals(status - 128).name} (exit {status}); nothing was "
                "changed (drift only reads); run it again for the answer"
                + (f"\n{report}" if report else ""))
        return status
    echo(json.dumps(drift.to_dict(), indent=1) if as_json else text(drift))
    return drift.exit_code
