"""Verify's exporter checks: the node's exporters answer and export one series per GPU (``check.exporters.*``).

Expected (from the same NodeConfig the deploy converges, stage ``exporters``): ``{"gpu": bool, "node": bool}``,
whether the GPU exporter and node_exporter must run. Observed: the probe's ``exporters`` section (the node
scraped its own exporters at their listen addresses with the ``exporters`` account's credentials, which verify
gives it on stdin: :func:`exporter_endpoints`, gpufleet/probe/exporters.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet import web_auth
from gpufleet.config import NodeConfig
from gpufleet.results import FAIL, PASS, SKIP

_ANY_ADDRESS = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]", "": "127.0.0.1"}
# exported for every GPU, MIG mode included (utilisation is not: NVML has none for a MIG-enabled GPU)
REQUIRED_METRICS = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE")


def expected_exporters(config: NodeConfig) -> dict[str, bool] | None:
    """What the exporters stage runs on this node; None when the stage is off (nothing to check)."""
    if not config.stage_enabled("exporters"):
        return None
    settings = config.exporters
    return {"gpu": settings.gpu != "none", "node": settings.node}


def exporter_endpoints(config: NodeConfig) -> dict[str, dict[str, str]] | None:
    """What the probe scrapes on the node (``{name: {"url", "user", "password"}}``): each exporter at its listen
    address (``0.0.0.0`` read as 127.0.0.1), over HTTPS where it serves TLS (its own certificate or the fleet CA's),
    as the ``exporters`` account (gpufleet.web_auth, generated on first
    use); None when the stage is off."""
    if not config.stage_enabled("exporters"):
        return None
    secret = web_auth.password("exporters")
    settings = config.exporters
    out = {}
    for name, listen, tls in (("gpu", settings.gpu_listen, settings.gpu_tls),
                              ("node", settings.node_listen, settings.node_tls)):
        address, port = listen.rsplit(":", 1)
        scheme = "https" if tls or settings.tls_fleet_ca else "http"  # as the exporters stage serves it
        out[name] = {"url": f"{scheme}://{_ANY_ADDRESS.get(address, address)}:{port}/metrics",
                     "user": web_auth.USER, "password": secret}
    return out


def check_gpu_counters(add, probe: Mapping[str, Any], entry: Mapping[str, Any]) -> None:
    """``config.exporter.gpu_counters``: where dcgm-exporter runs, it answers with the counters of gpufleet's file:
    none outside it (else it runs another file: a restart is pending, or the packaged default), and some of it (a
    field blank on every GPU, e.g. NVLink errors without NVLink, is left out of the answer as dcgm-exporter does)."""
    units = ((probe.get("services") or {}).get("units") or {})
    configured = entry.get("configured")
    if (units.get("nvidia-dcgm-exporter") or {}).get("active") != "active" or configured is None \
            or entry.get("metrics") is None:
        return
    answered = [m for m in entry["metrics"] if m.startswith("DCGM_FI_")]
    foreign = sorted(set(answered) - set(configured))
    blank = [field for field in configured if field not in answered]
    check = "config.exporter.gpu_counters"
    if foreign or not set(answered) & set(configured):
        add(check, FAIL, f"dcgm-exporter answers with {', '.join(foreign) or 'none of the configured counters'}, "
            f"not the counters of its file ({len(configured)})", "rerun the gpu_node deploy (stage exporters); "
            "systemctl restart nvidia-dcgm-exporter on the node", observed=answered, expected=configured)
    else:
        add(check, PASS, f"dcgm-exporter answers with {len(configured) - len(blank)} of the {len(configured)} "
            "configured counters" + (f" (blank on these GPUs: {', '.join(blank)})" if blank else ""),
            observed=answered, expected=configured)


def check_exporters(add, probe: Mapping[str, Any], expected: Mapping[str, Any] | None) -> None:
    """``add(check, verdict, message, remediation, observed=..., expected=...)`` for each expected exporter."""
    if not expected:
        return
    observed = probe.get("exporters")
    gpus = [g for g in probe.get("gpus") or [] if g.get("status") == "ok"]
    want_gpus = [str(g.get("index")) for g in gpus]
    # a GPU the driver reports lost may still stand in the exporter's last collection (dcgm-exporter serves what it
    # collected up to -c milliseconds ago): its series is neither required nor wrong
    unusable = {str(g.get("index")) for g in probe.get("gpus") or [] if g.get("status") != "ok"}
    for name in ("gpu", "node"):
        if not expected.get(name):
            continue
        check = f"config.exporter.{name}"
        if observed is None:
            add(check, SKIP, "the probe did not scrape the exporters (it was not given their addresses and "
                "credentials: an older probe)", "")
            continue
        entry = observed.get(name) or {}
        if entry.get("status") != "ok":
            add(check, FAIL, f"{name} exporter does not answer at {entry.get('url')}: {entry.get('error')}",
                "rerun the gpu_node deploy (stage exporters); systemctl status on the node",
                observed=entry.get("error"), expected="answering")
            continue
        if name == "node":
            add(check, PASS, f"node_exporter answers at {entry.get('url')}", observed="answering", expected="answering")
            continue
        seen_by_metric = entry.get("gpus") or {}
        wrong = {m: seen_by_metric.get(m, []) for m in REQUIRED_METRICS
                 if [gpu for gpu in seen_by_metric.get(m, []) if gpu not in unusable] != want_gpus}
        if wrong:
            metric, seen = sorted(wrong.items())[0]
            add(check, FAIL, f"GPU exporter exports {metric} for GPU(s) {seen or 'none'}, expected one series for "
                f"each of GPU(s) {want_gpus}", "check the GPU exporter's log on the node (journalctl -u ...)",
                observed=wrong, expected=want_gpus)
        else:
            add(check, PASS, f"GPU exporter exports one series per GPU ({len(want_gpus)}) for "
                f"{', '.join(REQUIRED_METRICS)}", observed=want_gpus, expected=want_gpus)
        check_gpu_counters(add, probe, entry)
