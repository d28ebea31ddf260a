"""Control side of verify: the result model, the checks and the thresholds.

    from gpufleet.verify import ExpectedState, evaluate_host, unreachable_host, build_fleet_result
    host = evaluate_host("gpu01", probe_doc, ExpectedState(driver_branch="570", power_limits_w={uuid: 600}))
    fleet = build_fleet_result([host, unreachable_host("gpu02", "ssh: connection refused")])
    fleet.to_dict()   # the versioned JSON report; gpufleet.report renders it
"""

from __future__ import annotations

import json
from typing import Any

from gpufleet.results import (
    EXIT_COULD_NOT_RUN,
    EXIT_FAILED,
    EXIT_OK,
    FAIL,
    PASS,
    REPORT_SCHEMA,
    REPORT_SCHEMA_VERSION,
    SKIP,
    UNREACHABLE,
    VERDICTS,
    WARN,
    CheckResult,
    FleetResult,
    HostResult,
    ReportSchemaError,
    exit_code,
    worst_verdict,
)

from .checks import (
    ExpectedState,
    build_fleet_result,
    evaluate,
    evaluate_host,
    fleet_checks,
    gpu_summary,
    probe_failed_host,
    unreachable_host,
)
from .thresholds import Thresholds, ThresholdsError, default_thresholds
from .xid import XidEvent, parse_xid_lines


class ProbeOutputError(ValueError):
    """The probe's stdout is not a probe document."""


def parse_probe_output(text: str) -> dict[str, Any]:
    """The probe document in a probe run's stdout (the last line that is a JSON object)."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict) and doc.get("schema") == "gpufleet.probe":
            return doc
    try:  # pretty-printed (--indent) output
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and doc.get("schema") == "gpufleet.probe":
        return doc
    tail = text.strip().splitlines()[-1:] or ["(empty)"]
    raise ProbeOutputError(f"no gpufleet probe document in the probe's output: {tail[0][:200]}")


__all__ = [
    "EXIT_COULD_NOT_RUN", "EXIT_FAILED", "EXIT_OK", "FAIL", "PASS", "REPORT_SCHEMA", "REPORT_SCHEMA_VERSION",
    "SKIP", "UNREACHABLE", "VERDICTS", "WARN", "CheckResult", "ExpectedState", "FleetResult", "HostResult",
    "ProbeOutputError", "ReportSchemaError", "Thresholds", "ThresholdsError", "XidEvent", "build_fleet_result",
    "default_thresholds", "evaluate", "evaluate_host", "exit_code", "fleet_checks", "gpu_summary",
    "parse_probe_output", "parse_xid_lines", "probe_failed_host", "unreachable_host", "worst_verdict",
]
