"""Regressions against the previous report: checks that went from pass/warn to fail, hosts that became
unreachable, and benchmark figures that dropped by more than ``drop_pct`` percent.

GPUs are matched by UUID (indexes can change at boot), falling back to the index when a UUID is unknown.
"""

from __future__ import annotations

from typing import Any

from gpufleet.results import FAIL, UNREACHABLE, FleetResult

from ._common import as_report

DEFAULT_DROP_PCT = 10.0
_OK = ("pass", "warn")


def _gpu_key(uuid: str | None, index: Any) -> str:
    return uuid or f"index:{index}"


def _check_map(report: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    result = {}
    for host in report.get("hosts", []):
        for c in host.get("checks", []):
            gpu = "" if c.get("gpu_index") is None else _gpu_key(c.get("gpu_uuid"), c.get("gpu_index"))
            key = (c["host"], gpu, c["check"])
            # Several checks may share a key (host-level Xid per PCI address): keep the worst.
            if key not in result or (result[key]["verdict"] in _OK and c["verdict"] not in _OK):
                result[key] = c
    return result


def _figures(report: dict[str, Any]) -> dict[tuple[str, str, str], tuple[float, dict[str, Any]]]:
    """(host, gpu key, metric) -> (value, gpu row) for every measured bench figure."""
    result: dict[tuple[str, str, str], tuple[float, dict[str, Any]]] = {}
    for host in report.get("hosts", []):
        for g in host.get("gpus") or []:
            key = _gpu_key(g.get("uuid"), g.get("index"))
            for precision, m in (g.get("matmul") or {}).items():
                if m.get("tflops") is not None:
                    result[(host["host"], key, f"matmul.{precision}.tflops")] = (m["tflops"], g)
            for metric in ("memory_bandwidth_gbs", "host_to_device_gbs", "device_to_host_gbs"):
                if g.get(metric) is not None:
                    result[(host["host"], key, metric)] = (g[metric], g)
        nccl = ((host.get("probe") or {}).get("bench") or {}).get("nccl_all_reduce") or {}
        if nccl.get("status") == "ok" and nccl.get("max_busbw_gbs") is not None:
            result[(host["host"], "", "nccl_all_reduce.max_busbw_gbs")] = (nccl["max_busbw_gbs"], {})
    return result


def compare(current: FleetResult | dict[str, Any], previous: FleetResult | dict[str, Any], *,
            drop_pct: float = DEFAULT_DROP_PCT) -> list[dict[str, Any]]:
    """The regressions of ``current`` against ``previous``, worst kinds first."""
    cur, prev = as_report(current), as_report(previous)
    regressions: list[dict[str, Any]] = []
    prev_hosts = {h["host"]: h for h in prev.get("hosts", [])}
    for host in cur.get("hosts", []):
        before = prev_hosts.get(host["host"])
        if before and before.get("status") == "ok" and host.get("status") != "ok":
            regressions.append({"kind": "host", "host": host["host"], "gpu_index": None, "gpu_uuid": None,
                                "check": "host.reachable" if host.get("status") == "unreachable" else "host.probe",
                                "before": before.get("status"), "after": host.get("status"),
                                "message": f"host was verified before, now {host.get('status')}: {host.get('error')}"})
    prev_checks = _check_map(prev)
    for key, c in sorted(_check_map(cur).items()):
        old = prev_checks.get(key)
        if old and old["verdict"] in _OK and c["verdict"] in (FAIL, UNREACHABLE):
            regressions.append({"kind": "check", "host": c["host"], "gpu_index": c.get("gpu_index"),
                                "gpu_uuid": c.get("gpu_uuid"), "check": c["check"], "before": old["verdict"],
                                "after": c["verdict"], "message": c.get("message", "")})
    prev_fig = _figures(prev)
    for key, (value, row) in sorted(_figures(cur).items(), key=lambda kv: kv[0]):
        old = prev_fig.get(key)
        if not old or not old[0]:
            continue
        drop = (old[0] - value) / old[0] * 100.0
        if drop > drop_pct:
            regressions.append({"kind": "bench", "host": key[0], "gpu_index": row.get("index"),
                                "gpu_uuid": row.get("uuid"), "check": key[2], "before": old[0], "after": value,
                                "drop_pct": round(drop, 2),
                                "message": f"{key[2]} dropped {drop:.1f}% ({old[0]:g} -> {value:g})"})
    return regressions


def attach_regressions(fleet: FleetResult, previous: FleetResult | dict[str, Any] | None, *,
                       drop_pct: float = DEFAULT_DROP_PCT) -> list[dict[str, Any]]:
    """Compare ``fleet`` with ``previous`` (nothing when None) and store the result in ``fleet.regressions``."""
    fleet.regressions = [] if previous is None else compare(fleet, previous, drop_pct=drop_pct)
    if previous is not None:
        prev = as_report(previous)
        fleet.meta["previous_report"] = {"generated_at": prev.get("generated_at"), "drop_pct": drop_pct}
    return fleet.regressions
