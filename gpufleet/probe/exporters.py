"""Node side: scrape the node's own exporters once and count what they export per GPU (standard library only).

``collect_exporters()`` -> {"gpu": {...}, "node": {...}}, each ``{"url", "status": ok | error, "error",
"gpus": {metric: sorted gpu label values}}`` for the core metrics (dcgm-exporter's names, which gpufleet's NVML
exporter uses too). The checks decide what is expected (gpufleet/verify/exporter_checks.py).
"""

from __future__ import annotations

import re
import urllib.request
from typing import Any

ENDPOINTS = {"gpu": "http://127.0.0.1:9400/metrics", "node": "http://127.0.0.1:9100/metrics"}
CORE_METRICS = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED")
_SAMPLE_RE = re.compile(r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\{(?P<labels>[^}]*)\}\s')
_GPU_RE = re.compile(r'(?:^|,)gpu="([^"]*)"')


def gpu_series(text: str) -> dict[str, list[str]]:
    """{core metric: sorted gpu label values} of an exposition text."""
    found: dict[str, set[str]] = {m: set() for m in CORE_METRICS}
    for line in text.splitlines():
        m = _SAMPLE_RE.match(line)
        if m and m.group("name") in found:
            gpu = _GPU_RE.search(m.group("labels"))
            if gpu:
                found[m.group("name")].add(gpu.group(1))
    return {name: sorted(values, key=lambda v: (len(v), v)) for name, values in found.items()}


def collect_exporters(endpoints: dict[str, str] | None = None, timeout: float = 5.0) -> dict[str, Any]:
    out = {}
    for name, url in (endpoints or ENDPOINTS).items():
        entry: dict[str, Any] = {"url": url, "status": "ok", "error": None, "gpus": {}}
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                text = response.read().decode("utf-8", "replace")
            entry["gpus"] = gpu_series(text) if name == "gpu" else {}
        except Exception as exc:  # noqa: BLE001 - any failure to scrape is the finding
            entry.update(status="error", error=f"{type(exc).__name__}: {exc}")
        out[name] = entry
    return out
