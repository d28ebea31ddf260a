"""Helpers shared by the renderers: every renderer takes the JSON report dict (or a FleetResult)."""

from __future__ import annotations

import calendar
import time
from typing import Any

from gpufleet.verify.model import VERDICTS, FleetResult, check_report_schema

VERDICT_ORDER = {"unreachable": 0, "fail": 1, "warn": 2, "skip": 3, "pass": 4}


def as_report(report: FleetResult | dict[str, Any]) -> dict[str, Any]:
    """The report dict of a FleetResult, or the dict itself after a schema check."""
    if isinstance(report, FleetResult):
        return report.to_dict()
    check_report_schema(report)
    return report


def gpu_label(check: dict[str, Any]) -> str:
    if check.get("gpu_index") is None:
        return ""
    return f"gpu{check['gpu_index']}" + (f" ({check['gpu_uuid']})" if check.get("gpu_uuid") else "")


def sorted_checks(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Worst first, then host, GPU, check id: a stable order for every renderer."""
    return sorted(checks, key=lambda c: (VERDICT_ORDER.get(c["verdict"], 9), c["host"],
                                         -1 if c.get("gpu_index") is None else c["gpu_index"], c["check"]))


def epoch_seconds(stamp: str | None) -> float | None:
    """``2026-05-01T12:00:00.123Z`` -> seconds since the epoch."""
    if not stamp:
        return None
    text = stamp.rstrip("Z")
    whole, _, frac = text.partition(".")
    try:
        seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
    return seconds + (float("0." + frac) if frac.isdigit() else 0.0)


def host_facts(host: dict[str, Any]) -> str:
    """One line about a host: driver, CUDA, GPUs."""
    probe = host.get("probe") or {}
    if host.get("status") != "ok":
        return host.get("error") or host.get("status") or ""
    if probe.get("nvml_error"):
        return f"NVML error: {probe['nvml_error']}"
    names: dict[str, int] = {}
    for g in host.get("gpus") or []:
        names[g.get("name") or "?"] = names.get(g.get("name") or "?", 0) + 1
    gpus = ", ".join(f"{n}x {name}" for name, n in names.items()) or "no GPU"
    return f"driver {probe.get('driver_version')} · CUDA {probe.get('cuda_driver_version')} · {gpus}"


def bench_precisions(report: dict[str, Any]) -> list[str]:
    """Precisions with at least one measured figure, in the bench's order."""
    order = ("bf16", "fp16", "tf32", "fp32", "fp8")
    seen = {p for h in report.get("hosts", []) for g in h.get("gpus") or []
            for p, m in (g.get("matmul") or {}).items() if m.get("tflops") is not None}
    return [p for p in order if p in seen] + sorted(seen - set(order))


def fmt(value: Any, digits: int = 1, none: str = "–") -> str:
    if value is None:
        return none
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


__all__ = ["VERDICTS", "VERDICT_ORDER", "as_report", "bench_precisions", "epoch_seconds", "fmt", "gpu_label",
           "host_facts", "sorted_checks"]
