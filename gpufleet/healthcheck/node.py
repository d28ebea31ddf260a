"""``gpufleet-healthcheck``: Slurm's ``HealthCheckProgram`` on a GPU node (runs ON the node, as root).

Reads the node's plan (``/etc/gpufleet/healthcheck.json``, written by the ``slurm`` stage), probes the GPUs
(:mod:`gpufleet.probe`: NVML and the kernel log, nothing from the network, no GPU setting changed), judges them
with verify's own checks and thresholds (:func:`gpufleet.verify.checks.evaluate`) for the check groups the plan
enables, then acts through Slurm's client as rollout does (:mod:`gpufleet.slurm`):

* a check fails: drain the node with ``Reason="<prefix>: <check>: GPU <index> <uuid>: <detail>"``; a node already
  drained for another reason (an admin's, a rollout's, Slurm's own) is left as it is;
* every check passes: resume the node only where its reason starts with ``<prefix>:`` (a health drain);
* the probe cannot run (no NVML, no plan): report it (exit 2), change nothing: no drain is resumed.

``--dry`` says what it would do and does nothing. Exit status: 0 healthy, 1 unhealthy, 2 could not check.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from gpufleet import slurm
from gpufleet.probe.probe import collect
from gpufleet.results import FAIL, PASS, CheckResult
from gpufleet.verify.checks import ExpectedState, evaluate
from gpufleet.verify.expected import FABRICMANAGER, PERSISTENCED

PLAN_PATH = "/etc/gpufleet/healthcheck.json"
SLURM_TIMEOUT_S = 15  # Slurm kills the program after 60 s (slurm.conf.5, HealthCheckProgram)
REASON_MAX = 200
# check group (the gpufleet_health_checks setting) -> verify's check ids
GROUP_CHECKS = {
    "gpus": ("health.gpu_count", "health.gpu_model", "health.gpu_status"),
    "persistence": ("config.persistence", "config.service.nvidia-persistenced"),
    "xid": ("health.xid", "health.recovery_action"),
    "memory": ("health.ecc", "health.row_remap"),
    "nvlink": ("health.nvlink",),
    "throttle": ("health.clock_events", "health.temperature"),
    "fabricmanager": ("config.service.nvidia-fabricmanager",),
    "mig": ("config.mig",),
}
SERVICES = (PERSISTENCED, FABRICMANAGER)


def expected_state(plan: dict[str, Any]) -> ExpectedState:
    """verify's ExpectedState from the node's plan document (the health-relevant part of the node plan)."""
    mig = plan.get("mig")
    services = {PERSISTENCED: "active"} if plan.get("persistence") is not None else {}
    if plan.get("nvswitch"):
        services[FABRICMANAGER] = "active"
    return ExpectedState(persistence=plan.get("persistence"), gpu_count=plan.get("gpu_count"),
                         gpu_model=plan.get("gpu_model"),
                         mig=None if mig is None else {int(i): layout for i, layout in mig.items()},
                         services=services)


def failures(results: Sequence[CheckResult], groups: Sequence[str]) -> list[CheckResult]:
    """The failed checks of the enabled groups, in verify's order."""
    ids = {check for group in groups for check in GROUP_CHECKS[group]}
    return [r for r in results if r.verdict == FAIL and r.check in ids]


def reason(prefix: str, failed: CheckResult) -> str:
    """``<prefix>: <check>: GPU <index> <uuid>: <detail>`` (one line, at most 200 characters)."""
    where = f"GPU {failed.gpu_index} {failed.gpu_uuid or ''}".rstrip() if failed.gpu_index is not None else "node"
    text = f"{prefix}: {failed.check}: {where}: {failed.message}"
    return " ".join(text.split())[:REASON_MAX]


def decide(status: slurm.NodeStatus, prefix: str, drain_reason: str | None) -> list[str] | None:
    """The ``scontrol update`` settings for this node (None: nothing to do). ``drain_reason``: the reason of the
    first failed check, None when the node is healthy."""
    ours = status.drain_set and status.reason.startswith(prefix + ":")
    if drain_reason is not None:
        if not status.drain_set or (ours and status.reason != drain_reason):
            return ["state=drain", f"reason={drain_reason}"]
        return None  # drained already: by this check for the same reason, or by someone else (theirs to resume)
    return ["state=resume"] if ours else None


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S, check=False,
                          stdin=subprocess.DEVNULL)


def node_status(node: str) -> slurm.NodeStatus:
    proc = _run(slurm.sinfo_node_argv(node))
    if proc.returncode != 0:
        raise slurm.SlurmError(f"sinfo -n {node} exited {proc.returncode}: {proc.stderr.strip()}")
    return slurm.parse_sinfo(proc.stdout, node)


def check(plan: dict[str, Any], probe: dict[str, Any] | None = None) -> tuple[list[CheckResult], str | None]:
    """(failed checks, why the node could not be checked or None)."""
    probe = probe if probe is not None else collect(services=SERVICES, hostname=plan["node"])
    results = evaluate(probe, expected_state(plan), bench={}, host=plan["node"])
    cannot = [r for r in results if r.check == "host.probe" and r.verdict != PASS]
    if cannot:
        return [], f"{cannot[0].check}: {cannot[0].message}"
    return failures(results, plan["checks"]), None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpufleet-healthcheck", description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", default=PLAN_PATH, help=f"the node's plan (default {PLAN_PATH})")
    parser.add_argument("--dry", action="store_true", help="say what would be done, do nothing")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        with open(args.plan, encoding="utf-8") as fh:
            plan = json.load(fh)
        failed, cannot = check(plan)
    except (OSError, ValueError, KeyError) as error:
        print(f"gpufleet-healthcheck: cannot check this node: {error}; its Slurm state is left as it is",
              file=sys.stderr)
        return 2
    node, prefix = plan["node"], plan["reason_prefix"]
    if cannot:
        print(f"gpufleet-healthcheck: {node}: cannot check: {cannot}; its Slurm state is left as it is",
              file=sys.stderr)
        return 2
    for result in failed:
        print(f"{node}: FAIL {reason(prefix, result)[len(prefix) + 2:]}")
    drain_reason = reason(prefix, failed[0]) if failed else None
    try:
        status = node_status(node)
        settings = decide(status, prefix, drain_reason)
        shown = f"scontrol update nodename={node} " + " ".join(settings) if settings else None
        if settings and not args.dry:
            proc = _run(slurm.scontrol_update_argv(node, *settings))
            if proc.returncode != 0:
                raise slurm.SlurmError(f"{shown}: exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()}")
    except (OSError, subprocess.TimeoutExpired, slurm.SlurmError) as error:
        print(f"gpufleet-healthcheck: {node}: Slurm: {error}", file=sys.stderr)
        return 2
    state = f"Slurm: {status.state}" + (f" ({status.reason})" if status.reason else "")
    action = ("would run: " if args.dry else "ran: ") + shown if shown else "nothing to change"
    print(f"{node}: {'unhealthy' if failed else 'healthy'}; {state}; {action}; "
          f"{time.monotonic() - started:.2f} s")
    return 1 if failed else 0
