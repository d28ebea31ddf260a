"""Helpers shared by the renderers: every renderer takes the JSON report dict (or a FleetResult)."""

from __future__ import annotations

import calendar
import time
from typing import Any

from gpufleet.results import VERDICTS, FleetResult, check_report_schema

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


# The headline of a fleet: a failed check outranks an unreachable host (the fleet has a real problem to fix, and one
# host that could not be asked does not hide it); every counted verdict is then named next to it.
HEADLINE_ORDER = ("fail", "unreachable", "warn", "pass", "skip")


def host_verdict(host: dict[str, Any]) -> str:
    return host.get("verdict") or "skip"


def hosts_worst_first(hosts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Failing hosts first, then unreachable, warn, pass, skip; by name within a verdict."""
    rank = {v: i for i, v in enumerate(HEADLINE_ORDER)}
    return sorted(hosts, key=lambda h: (rank.get(host_verdict(h), 9), h["host"]))


def hosts_by_verdict(hosts: list[dict[str, Any]]) -> dict[str, int]:
    """{verdict: host count} in headline order, verdicts with no host left out."""
    counts: dict[str, int] = {}
    for h in hosts:
        counts[host_verdict(h)] = counts.get(host_verdict(h), 0) + 1
    return {v: counts[v] for v in HEADLINE_ORDER if v in counts}


def fleet_headline(report: dict[str, Any]) -> tuple[str, str]:
    """(verdict, text): ``("fail", "FAIL: 18 hosts fail, 1 unreachable, 981 pass (1000 hosts)")``."""
    counts = hosts_by_verdict(report["hosts"])
    verdict = next(iter(counts), "skip")
    parts = [f"{n} host{'s' if n != 1 else ''} {v}" if i == 0 else f"{n} {v}"
             for i, (v, n) in enumerate(counts.items())]
    total = len(report["hosts"])
    return verdict, f"{verdict.upper()}: {', '.join(parts) or 'no host'} ({total} host{'s' if total != 1 else ''})"


def host_model(host: dict[str, Any]) -> str:
    """The host's GPU model: its GPUs' name, ``mixed: A, B`` when they differ, ``no GPU data`` without any."""
    # A GPU fallen off the bus has no name: the host still counts under its other GPUs' model.
    names = sorted({g["name"] for g in host.get("gpus") or [] if g.get("name")})
    return names[0] if len(names) == 1 else ("mixed: " + ", ".join(names) if names else "no GPU data")


def problem_groups(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Non-passing checks grouped by (check, verdict), worst and widest first: each group with its hosts, the
    number of GPUs it hit, the hosts it hit per GPU model ({model: hosts}, most first), an example message and
    the remediation."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for host in report["hosts"]:
        model = host_model(host)
        for c in host["checks"]:
            if c["verdict"] not in ("fail", "unreachable", "warn"):
                continue
            g = groups.setdefault((c["check"], c["verdict"]), {
                "check": c["check"], "verdict": c["verdict"], "hosts": [], "gpus": 0, "models": {},
                "example": c["message"], "example_host": c["host"], "remediation": c.get("remediation") or ""})
            if not g["hosts"] or g["hosts"][-1] != c["host"]:
                g["hosts"].append(c["host"])
                g["models"][model] = g["models"].get(model, 0) + 1
            if c.get("gpu_index") is not None:
                g["gpus"] += 1
    for g in groups.values():
        g["models"] = dict(sorted(g["models"].items(), key=lambda kv: (-kv[1], kv[0])))
    rank = {v: i for i, v in enumerate(HEADLINE_ORDER)}
    return sorted(groups.values(), key=lambda g: (rank[g["verdict"]], -len(g["hosts"]), g["check"]))


def model_groups(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Hosts grouped by GPU model (the GPUs' names; ``mixed`` / ``none`` where not one model):
    [{model, hosts, gpus, verdicts: {verdict: hosts}}]."""
    groups: dict[str, dict[str, Any]] = {}
    for host in report["hosts"]:
        model = host_model(host)
        g = groups.setdefault(model, {"model": model, "hosts": 0, "gpus": 0, "verdicts": {}})
        g["hosts"] += 1
        g["gpus"] += len(host.get("gpus") or [])
        g["verdicts"][host_verdict(host)] = g["verdicts"].get(host_verdict(host), 0) + 1
    return sorted(groups.values(), key=lambda g: (-g["hosts"], g["model"]))


def mig_layouts(host: dict[str, Any]) -> dict[int, str]:
    """{GPU index: ``MIG on: 1x 3g.20gb, 1x 2g.10gb``} for the host's GPUs that report a MIG mode, from the probe."""
    out: dict[int, str] = {}
    for gpu in (host.get("probe") or {}).get("gpus") or []:
        mig = gpu.get("mig") or {}
        if mig.get("mode_current") is None or gpu.get("index") is None:
            continue
        if not mig["mode_current"]:
            out[gpu["index"]] = "MIG off" + (" (on pending reset)" if mig.get("mode_pending") else "")
            continue
        counts: dict[str, int] = {}
        for gi in mig.get("gpu_instances") or []:
            name = gi.get("profile_name") or f"profile {gi.get('profile_id')}"
            counts[name] = counts.get(name, 0) + 1
        layout = ", ".join(f"{n}x {p}" for p, n in sorted(counts.items())) or "no instances"
        out[gpu["index"]] = f"MIG on: {layout}" + ("" if mig.get("mode_pending", True) else " (off pending reset)")
    return out


def mig_summary(host: dict[str, Any]) -> str:
    """The host's MIG layout in one line, GPUs with the same layout together: ``gpu0-1: MIG on: 1x 3g.20gb``;
    empty when no GPU reports a MIG mode."""
    by_layout: dict[str, list[int]] = {}
    for index, layout in sorted(mig_layouts(host).items()):
        by_layout.setdefault(layout, []).append(index)
    return "; ".join(f"{_index_ranges(indexes)}: {layout}" for layout, indexes in by_layout.items())


def _index_ranges(indexes: list[int]) -> str:
    """[0, 1, 2, 5] -> ``gpu0-2,5``."""
    parts: list[str] = []
    start = prev = indexes[0]
    for i in [*indexes[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return "gpu" + ",".join(parts)


__all__ = ["HEADLINE_ORDER", "VERDICTS", "VERDICT_ORDER", "as_report", "bench_precisions", "epoch_seconds",
           "fleet_headline", "fmt", "gpu_label", "host_facts", "host_verdict", "hosts_by_verdict",
           "host_model", "hosts_worst_first", "mig_layouts", "mig_summary", "model_groups", "problem_groups",
           "sorted_checks"]
