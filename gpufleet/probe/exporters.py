"""Node side: scrape the node's own exporters once and count what they export per GPU (standard library only).

``collect_exporters()`` -> {"gpu": {...}, "node": {...}}, each ``{"url", "status": ok | error, "error",
"gpus": {metric: sorted gpu label values}}`` for the core metrics (dcgm-exporter's names, which gpufleet's NVML
exporter uses too); the GPU exporter's also ``"metrics"``: every metric name it answered with, and
``"configured"``: the fields of the dcgm-exporter counters file gpufleet writes (None where there is none). The checks
decide what is expected (gpufleet/verify/exporter_checks.py).

The exporters ask for basic auth (gpufleet's web configuration files): verify gives each endpoint's URL, user and
password on the probe's stdin (``--exporters-stdin``: never in a command line), :func:`read_endpoints`.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import urllib.request
from typing import Any

ENDPOINTS = {"gpu": "http://127.0.0.1:9400/metrics", "node": "http://127.0.0.1:9100/metrics"}
# gpufleet's counters file of dcgm-exporter (gpufleet/operations/exporters.py DCGM_COUNTERS)
DCGM_COUNTERS = "/etc/dcgm-exporter/gpufleet-counters.csv"
_TYPE_RE = re.compile(r"^# TYPE (\S+) ")
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


def metric_names(text: str) -> list[str]:
    """The metric names of an exposition text (its ``# TYPE`` lines)."""
    return sorted({m.group(1) for line in text.splitlines() if (m := _TYPE_RE.match(line))})


def configured_counters(path: str = DCGM_COUNTERS) -> list[str] | None:
    """The fields of a dcgm-exporter counters file that are exported as series (not ``label`` ones), None without
    the file."""
    try:
        with open(path, encoding="utf-8") as fh:
            rows = [line.split(",") for line in fh.read().splitlines() if line.strip() and not line.startswith("#")]
    except OSError:
        return None
    return [row[0].strip() for row in rows if len(row) == 3 and row[1].strip() != "label"]


def read_endpoints(stream) -> dict[str, dict[str, str]]:
    """``{name: {"url", "user", "password"}}`` from one JSON line of ``stream`` (verify writes it)."""
    data = json.loads(stream.readline() or "{}")
    if not isinstance(data, dict):
        raise ValueError("the exporters' endpoints: not a JSON object")
    return {str(k): dict(v) if isinstance(v, dict) else {"url": str(v)} for k, v in data.items()}


def _request(endpoint: dict[str, str] | str) -> urllib.request.Request:
    if isinstance(endpoint, str):
        return urllib.request.Request(endpoint)
    request = urllib.request.Request(endpoint["url"])
    if endpoint.get("user") is not None:
        token = base64.b64encode(f"{endpoint['user']}:{endpoint.get('password', '')}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    return request


def collect_exporters(endpoints: dict | None = None, timeout: float = 5.0) -> dict[str, Any]:
    """Scrape each endpoint once (``{name: URL}`` or ``{name: {"url", "user", "password"}}``). An https endpoint's
    certificate is not checked here: the probe asks whether the exporter answers, Prometheus checks its TLS."""
    out = {}
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    for name, endpoint in (endpoints or ENDPOINTS).items():
        request = _request(endpoint)
        entry: dict[str, Any] = {"url": request.full_url, "status": "ok", "error": None, "gpus": {}}
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=insecure) as response:
                text = response.read().decode("utf-8", "replace")
            entry["gpus"] = gpu_series(text) if name == "gpu" else {}
            if name == "gpu":
                entry.update(metrics=metric_names(text), configured=configured_counters())
        except Exception as exc:  # any failure to scrape is the finding
            entry.update(status="error", error=f"{type(exc).__name__}: {exc}")
        out[name] = entry
    return out
