"""Prometheus textfile (node_exporter textfile collector) with the verify results and bench figures.

Label names are dcgm-exporter's (``gpu``, ``UUID``, ``modelName``), so one set of rules and dashboards joins both;
every sample carries ``hostname``, the inventory name of the host verified. A check is 1 when it passed (pass or
warn), 0 when it failed; skipped checks are left out and several results of one check on one GPU collapse to the
worst. docs/verify.md lists the series. :func:`write_textfile` writes atomically, as the collector requires.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet.control_files import write_atomic
from gpufleet.results import VERDICTS, FleetResult

from ._common import as_report, epoch_seconds

_HELP = {
    "gpufleet_verify_check": "gpufleet verify check result: 1 passed (pass or warn), 0 failed (fail or unreachable).",
    "gpufleet_verify_checks": "Number of gpufleet verify checks per verdict.",
    "gpufleet_verify_host_up": "1 when gpufleet verify reached and probed the host.",
    "gpufleet_verify_last_run_timestamp_seconds": "Unix time of the gpufleet verify run.",
    "gpufleet_bench_tflops": "Matmul throughput measured by gpufleet verify, TFLOP/s (median).",
    "gpufleet_bench_tflops_peak_ratio": "Measured matmul TFLOP/s divided by the catalog's dense peak.",
    "gpufleet_bench_memory_bandwidth_gbs": "Device memory bandwidth measured by gpufleet verify, GB/s.",
    "gpufleet_bench_host_transfer_gbs": "Pinned host<->device bandwidth measured by gpufleet verify, GB/s.",
    "gpufleet_bench_nccl_busbw_gbs": "NCCL all-reduce bus bandwidth, max over message sizes, GB/s.",
}
_ORDER = list(_HELP)
_RANK = {"unreachable": 0, "fail": 1, "warn": 2, "pass": 3}


def _escape(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, Any]) -> str:
    return "{" + ",".join(f'{k}="{_escape("" if v is None else v)}"' for k, v in labels.items()) + "}"


def _value(v: float) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    return repr(float(v))


def render_prometheus(report: FleetResult | dict[str, Any], host: str | None = None) -> str:
    """The textfile for ``host`` (a node's own file), or for every host when None."""
    data = as_report(report)
    samples: dict[str, dict[str, float]] = {name: {} for name in _ORDER}
    stamp = epoch_seconds(data.get("generated_at"))
    for h in data["hosts"]:
        if host is not None and h["host"] != host:
            continue
        name = h["host"]
        worst: dict[tuple[str, str, str], str] = {}
        for c in h["checks"]:
            if c["verdict"] == "skip":
                continue
            key = ("" if c.get("gpu_index") is None else str(c["gpu_index"]), c.get("gpu_uuid") or "", c["check"])
            if key not in worst or _RANK[c["verdict"]] < _RANK[worst[key]]:
                worst[key] = c["verdict"]
        for (gpu, uuid, check), verdict in sorted(worst.items()):
            samples["gpufleet_verify_check"][_labels({"hostname": name, "gpu": gpu, "UUID": uuid, "check": check})] = (
                1 if verdict in ("pass", "warn") else 0)
        for verdict in VERDICTS:
            samples["gpufleet_verify_checks"][_labels({"hostname": name, "verdict": verdict})] = sum(
                1 for c in h["checks"] if c["verdict"] == verdict)
        samples["gpufleet_verify_host_up"][_labels({"hostname": name})] = 1 if h.get("status") == "ok" else 0
        if stamp is not None:
            samples["gpufleet_verify_last_run_timestamp_seconds"][_labels({"hostname": name})] = stamp
        for g in h.get("gpus") or []:
            base = {"hostname": name, "gpu": g.get("index"), "UUID": g.get("uuid") or ""}
            model = g.get("name") or g.get("model") or ""  # dcgm-exporter's modelName is the NVML name
            for precision, m in sorted((g.get("matmul") or {}).items()):
                if m.get("tflops") is None:
                    continue
                lab = _labels({**base, "modelName": model, "precision": precision})
                samples["gpufleet_bench_tflops"][lab] = m["tflops"]
                if m.get("fraction") is not None:
                    samples["gpufleet_bench_tflops_peak_ratio"][lab] = m["fraction"]
            if g.get("memory_bandwidth_gbs") is not None:
                samples["gpufleet_bench_memory_bandwidth_gbs"][_labels({**base, "modelName": model})] = (
                    g["memory_bandwidth_gbs"])
            for direction, key in (("h2d", "host_to_device_gbs"), ("d2h", "device_to_host_gbs")):
                if g.get(key) is not None:
                    samples["gpufleet_bench_host_transfer_gbs"][_labels({**base, "direction": direction})] = g[key]
        nccl = ((h.get("probe") or {}).get("bench") or {}).get("nccl_all_reduce") or {}
        if nccl.get("status") == "ok" and nccl.get("max_busbw_gbs") is not None:
            samples["gpufleet_bench_nccl_busbw_gbs"][_labels({"hostname": name})] = nccl["max_busbw_gbs"]
    lines = []
    for metric in _ORDER:
        if not samples[metric]:
            continue
        lines.append(f"# HELP {metric} {_HELP[metric]}")
        lines.append(f"# TYPE {metric} gauge")
        lines += [f"{metric}{labels} {_value(v)}" for labels, v in samples[metric].items()]
    return "\n".join(lines) + "\n" if lines else ""


def write_textfile(text: str, path: str | Path) -> Path:
    """Write ``text`` to ``path`` atomically (node_exporter must never read a half-written file)."""
    return write_atomic(path, text)
