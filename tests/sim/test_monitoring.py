"""Monitoring end to end on ONE simulated fleet: a GPU-less monitoring host, an HGX H100 on the dcgm path and a
GeForce RTX 4090 on the nvml path. Both deploys converge, scrape targets come up, faults injected into the
simulated GPUs raise alerts that reach Alertmanager (checked through its API) and resolve, a second run of both
deploys changes nothing, and bad input is refused before any host changes.

Judged by the simulator's own state (GPU counts and temperatures of ``hw/gpus.state``), the live Prometheus and
Alertmanager of the fleet, and the real files on the hosts. Intervals are shortened through the test inventory's
data (scrape/evaluation every 2 s, ``for`` 4 s on the alerts tested).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import bcrypt
import pytest
from conftest import BIN, REPO, bring_up, gpufleet, grand_total, save_deb_cache, ssh

from gpufleet import fleet_ca, web_auth
from gpufleet.exporter.xid_err_msg import err_msg
from gpufleet.facts.grafana import openpgp_fingerprints
from gpufleet.monitoring import render
from gpufleet.monitoring.config import seconds
from gpufleet.sim import faults, hosts, repo
from gpufleet.sim.gpu import state as simstate

PROFILES = ["cpu-only", "h100-sxm-8", "rtx4090-1"]
MON, DCGM_HOST, NVML_HOST = "node01", "node02", "node03"
SCRAPE = "2s"
EVALUATION = "2s"
ALERT_FOR = "4s"

POWER_W = 600  # the DCGM host's desired power limit (H100 SXM: default 700 W): the desired-state textfile has it

MONITORING_DATA = {
    "gpufleet_stages": [],
    "gpufleet_monitoring_scrape_interval": SCRAPE,
    "gpufleet_monitoring_evaluation_interval": EVALUATION,
    "gpufleet_monitoring_alert_for": {"GpuOverheating": ALERT_FOR, "GpuMissing": ALERT_FOR,
                                      "GpuExporterDown": ALERT_FOR, "NodeDown": ALERT_FOR,
                                      "GpuPowerLimitDrift": ALERT_FOR, "NodeExporterDown": ALERT_FOR,
                                      "GpuTemperatureHigh": ALERT_FOR},
    "gpufleet_monitoring_group_wait": "1s",
    "gpufleet_monitoring_grafana_admin_password": "e2e-grafana-admin-1",  # Grafana from the simulator's repository
    "gpufleet_monitoring_receivers": [{"name": "ops", "type": "webhook", "url": "http://127.0.0.1:9999/alerts"}],
}

INVENTORY = '''\
import runpy
_sim = runpy.run_path({sim!r})
_hosts = {{name: data for key, group in _sim.items() if key.startswith("sim_") for name, data in group}}
monitoring = [({mon!r}, {{**_hosts[{mon!r}], **{monitoring}}})]
gpu_nodes = [({dcgm!r}, {{**_hosts[{dcgm!r}], "gpufleet_exporters_gpu": "dcgm", "gpufleet_monitoring_cluster": "lab",
                          "gpufleet_monitoring_gpu_model": "h100-sxm", "gpufleet_power_limit": {power},
                          "gpufleet_monitoring_scrape_interval": {scrape!r}, **{dcgm_extra}}}),
             ({nvml!r}, {{**_hosts[{nvml!r}], "gpufleet_monitoring_cluster": "lab", **{nvml_extra}}})]
'''


def write_inventory(path: Path, sim_inventory: Path, monitoring: dict | None = None, dcgm_extra: dict | None = None,
                    nvml_extra: dict | None = None):
    path.write_text(INVENTORY.format(sim=str(sim_inventory), mon=MON, dcgm=DCGM_HOST, nvml=NVML_HOST, power=POWER_W,
                                     scrape=SCRAPE,
                                     monitoring=repr(monitoring if monitoring is not None else MONITORING_DATA),
                                     dcgm_extra=repr(dcgm_extra or {}), nvml_extra=repr(nvml_extra or {})))
    return path


def run_pyinfra(inventory: Path, deploy: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([str(BIN / "pyinfra"), "-y", str(inventory), deploy], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=900, cwd=REPO)
    if check and result.returncode != 0:
        raise AssertionError(f"pyinfra {deploy} failed:\n{result.stdout}")
    return result


@pytest.fixture(scope="module")
def mon(tmp_path_factory):
    started = time.monotonic()
    fleet = bring_up(tmp_path_factory, PROFILES, driver="preinstalled")
    fleet.test_inventory = write_inventory(fleet.inventory.with_name("monitoring_inventory.py"), fleet.inventory)
    try:
        fleet.first_gpu_node = run_pyinfra(fleet.test_inventory, "deploys/gpu_node.py")
        fleet.first_monitoring = run_pyinfra(fleet.test_inventory, "deploys/monitoring.py")
        save_deb_cache(fleet)
        fleet.converged_after_s = time.monotonic() - started
        yield fleet
    finally:
        hosts.down(log=lambda *_: None)


# ------------------------------------------------------------------------------------------------ helpers


ACCOUNT_OF_PORT = {9090: "prometheus", 9093: "alertmanager", 9100: "exporters", 9400: "exporters"}


def authorization(account: str, password: str | None = None) -> str:
    token = base64.b64encode(f"{web_auth.USER}:{password or web_auth.password(account)}".encode()).decode()
    return f"Basic {token}"


def api(fleet, port: int, path: str, **params) -> dict | list:
    """GET on the monitoring host's Prometheus (9090) or Alertmanager (9093) with its account's credentials."""
    address = fleet.host(MON).address
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    request = urllib.request.Request(f"http://{address}:{port}{path}{query}",
                                     headers={"Authorization": authorization(ACCOUNT_OF_PORT[port])})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def promql(fleet, query: str) -> list[dict]:
    data = api(fleet, 9090, "/api/v1/query", query=query)
    assert data["status"] == "success", data
    return data["data"]["result"]


def active_alerts(fleet, name: str) -> list[dict]:
    return [a for a in api(fleet, 9093, "/api/v2/alerts", active="true", inhibited="true", silenced="true")
            if a["labels"].get("alertname") == name]


def wait_for(what: str, predicate, timeout: float = 90.0, step: float = 0.25):
    """Poll ``predicate`` until it returns something truthy (the event), or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(step)


def sim_state(fleet, name: str) -> dict[str, str]:
    return simstate.read_state(str(fleet.host(name).dir / "hw/gpus.state"))


def targets_up(fleet) -> dict[tuple[str, str], str]:
    return {(t["labels"]["job"], t["labels"].get("host", "")): t["health"]
            for t in api(fleet, 9090, "/api/v1/targets")["data"]["activeTargets"]}


EXPECTED_TARGETS = {("gpu", DCGM_HOST), ("gpu", NVML_HOST), ("node", DCGM_HOST), ("node", NVML_HOST),
                    ("prometheus", "")}


def wait_all_up(fleet) -> None:
    wait_for("every scrape target up", lambda: targets_up(fleet) == dict.fromkeys(EXPECTED_TARGETS, "up"))


# ------------------------------------------------------------------------------------------------ tests


def test_every_target_up_with_inventory_labels(mon):
    wait_all_up(mon)
    labels = {t["labels"]["host"]: t["labels"] for t in api(mon, 9090, "/api/v1/targets")["data"]["activeTargets"]
              if t["labels"]["job"] == "gpu"}
    assert labels[DCGM_HOST]["cluster"] == "lab" and labels[DCGM_HOST]["gpu_model"] == "h100-sxm"
    assert labels[DCGM_HOST]["group"] == "gpu_nodes"
    # not set in the inventory: the catalog key of the GPUs the node reports
    assert labels[NVML_HOST]["gpu_model"] == "rtx4090"
    assert labels[NVML_HOST]["group"] == "gpu_nodes" and labels[NVML_HOST]["cluster"] == "lab"


def test_one_series_per_gpu_from_both_exporters(mon):
    wait_all_up(mon)
    for metric in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED",
                   "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"):
        for host in (DCGM_HOST, NVML_HOST):
            state = sim_state(mon, host)
            result = wait_for(f"{metric} of {host}", lambda m=metric, h=host: promql(mon, f'{m}{{host="{h}"}}'))
            assert sorted(int(r["metric"]["gpu"]) for r in result) == list(range(simstate.gpu_count(state))), metric
    result = promql(mon, f'DCGM_FI_DEV_GPU_TEMP{{host="{DCGM_HOST}"}}')
    temps = {r["metric"]["gpu"]: float(r["value"][1]) for r in result}
    state = sim_state(mon, DCGM_HOST)
    assert temps == {str(i): float(simstate.gpu(state, i)["temp.gpu"]) for i in range(8)}
    # both exporters label as dcgm-exporter does
    for host, model in ((DCGM_HOST, "NVIDIA H100 80GB HBM3"), (NVML_HOST, "NVIDIA GeForce RTX 4090")):
        metric = promql(mon, f'DCGM_FI_DEV_GPU_TEMP{{host="{host}",gpu="0"}}')[0]["metric"]
        assert metric["modelName"] == model and metric["UUID"] == simstate.gpu(sim_state(mon, host), 0)["uuid"]
        # released dcgm-exporter labels Hostname; with -r it is the host engine's host (localhost)
        assert metric["Hostname"] == ("localhost" if host == DCGM_HOST else host) and "hostname" not in metric
        assert metric["pci_bus_id"] and metric["device"] == "nvidia0"


def test_overheat_alert_reaches_alertmanager_and_resolves(mon):
    wait_all_up(mon)
    gpufleet("sim", "fault", DCGM_HOST, "overheat", "--gpu", "3")
    injected = time.monotonic()
    try:
        alerts = wait_for("GpuOverheating in Alertmanager", lambda: [
            a for a in active_alerts(mon, "GpuOverheating") if a["labels"].get("host") == DCGM_HOST])
        latency = time.monotonic() - injected
        mon.overheat_latency_s = latency
        print(f"\nGpuOverheating reached Alertmanager {latency:.1f} s after the fault "
              f"(for {ALERT_FOR}, scrape/evaluation {SCRAPE})")
        assert [a["labels"]["gpu"] for a in alerts] == ["3"]
        assert alerts[0]["annotations"]["summary"].startswith(f"{DCGM_HOST} GPU 3: overheating at ")
        assert alerts[0]["labels"]["severity"] == "critical"
        # for + 2 scrape intervals, plus one rule evaluation interval: Prometheus evaluates on its own clock
        assert latency <= seconds(ALERT_FOR) + 2 * seconds(SCRAPE) + seconds(EVALUATION)
    finally:
        gpufleet("sim", "fault", DCGM_HOST, "clear")
    wait_for("GpuOverheating resolved", lambda: not [
        a for a in active_alerts(mon, "GpuOverheating") if a["labels"].get("host") == DCGM_HOST])


def _firing(fleet, name: str, host: str) -> list[dict]:
    return [a for a in active_alerts(fleet, name) if a["labels"].get("host") == host]


def test_xid_raises_the_critical_xid_alert_on_both_exporter_paths(mon):
    """An Xid reaches Alertmanager through DCGM's last-Xid field and through gpufleet's exporter's NVML events;
    the driver's kernel line is where verify reads it. A critical Xid stays until the GPU is reset: the fault's
    clear plays the repair and, on the nvml host, the exporter's restart that a GPU reset implies (every NVML
    client must stop), which forgets the Xid it saw."""
    wait_all_up(mon)
    wait_for("the NVML exporter registered for Xid events", lambda: promql(
        mon, f'gpufleet_gpu_exporter_xid_events_supported{{host="{NVML_HOST}"}} == 1'))
    state = sim_state(mon, DCGM_HOST)
    for host, gpu in ((DCGM_HOST, "2"), (NVML_HOST, "0")):
        gpufleet("sim", "fault", host, "xid", "--gpu", gpu, "--code", "79")
    try:
        for host, gpu in ((DCGM_HOST, "2"), (NVML_HOST, "0")):
            alerts = wait_for(f"GpuXidCritical of {host} in Alertmanager",
                              lambda h=host: _firing(mon, "GpuXidCritical", h))
            assert [a["labels"]["gpu"] for a in alerts] == [gpu], host
            assert alerts[0]["annotations"]["summary"] == f"{host} GPU {gpu}: critical Xid 79"
        assert promql(mon, f'gpufleet_gpu_xid_errors_total{{host="{NVML_HOST}",xid="79"}}')[0]["value"][1] == "1"
        bus = simstate.gpu(state, 2)["pci.bus_id"]
        # where verify's probe reads Xids (journalctl -k over SSH): the same GPU's line
        kernel_log = ssh(mon, DCGM_HOST, "journalctl -k -b --no-pager -q").stdout
        assert f"NVRM: Xid (PCI:{bus[4:14].lower()}): 79, " in kernel_log
    finally:
        for host in (DCGM_HOST, NVML_HOST):
            gpufleet("sim", "fault", host, "clear")
        ssh(mon, NVML_HOST, "systemctl restart gpufleet-exporter.service")
    for host in (DCGM_HOST, NVML_HOST):
        wait_for(f"GpuXidCritical of {host} resolved", lambda h=host: not _firing(mon, "GpuXidCritical", h))


def test_power_limit_drift_on_the_dcgm_path_alerts_until_restored(mon):
    """The desired limit comes from the node plan (node_exporter's textfile), the current one from DCGM."""
    wait_all_up(mon)
    desired = wait_for("the desired power limits in Prometheus", lambda: promql(
        mon, f'gpufleet_gpu_power_limit_desired_watts{{host="{DCGM_HOST}"}}'))
    assert sorted((r["metric"]["gpu"], r["value"][1]) for r in desired) == [(str(i), str(POWER_W)) for i in range(8)]
    assert promql(mon, "ALERTS{alertname=\"GpuPowerLimitDrift\"}") == []
    ssh(mon, DCGM_HOST, "nvidia-smi -i 1 -pl 500")
    try:
        assert simstate.gpu(sim_state(mon, DCGM_HOST), 1)["power.limit_mw"] == "500000"
        alerts = wait_for("GpuPowerLimitDrift in Alertmanager", lambda: _firing(mon, "GpuPowerLimitDrift", DCGM_HOST))
        assert [a["labels"]["gpu"] for a in alerts] == ["1"]
        assert alerts[0]["annotations"]["description"].endswith(f"by {POWER_W - 500} W.")
    finally:
        ssh(mon, DCGM_HOST, f"nvidia-smi -i 1 -pl {POWER_W}")
    wait_for("GpuPowerLimitDrift resolved", lambda: not _firing(mon, "GpuPowerLimitDrift", DCGM_HOST))


def test_lost_gpu_raises_gpu_missing(mon):
    wait_all_up(mon)
    gpufleet("sim", "fault", DCGM_HOST, "lost", "--gpu", "5")
    try:
        alerts = wait_for("GpuMissing in Alertmanager", lambda: [
            a for a in active_alerts(mon, "GpuMissing") if a["labels"].get("host") == DCGM_HOST])
        assert "expected" in alerts[0]["annotations"]["description"]
        assert "gpu" not in alerts[0]["labels"]
        assert sorted(r["metric"]["gpu"] for r in promql(mon, f'DCGM_FI_DEV_GPU_TEMP{{host="{DCGM_HOST}"}}')) == [
            "0", "1", "2", "3", "4", "6", "7"]
    finally:
        gpufleet("sim", "fault", DCGM_HOST, "clear")
    wait_for("GpuMissing resolved", lambda: not [
        a for a in active_alerts(mon, "GpuMissing") if a["labels"].get("host") == DCGM_HOST])


def test_stopped_exporter_raises_exporter_down(mon):
    wait_all_up(mon)
    ssh(mon, NVML_HOST, "systemctl stop gpufleet-exporter.service")
    try:
        alerts = wait_for("GpuExporterDown in Alertmanager", lambda: [
            a for a in active_alerts(mon, "GpuExporterDown") if a["labels"].get("host") == NVML_HOST])
        assert alerts[0]["annotations"]["summary"] == f"{NVML_HOST}: GPU exporter down"
    finally:
        ssh(mon, NVML_HOST, "systemctl start gpufleet-exporter.service")
    wait_for("GpuExporterDown resolved", lambda: not [
        a for a in active_alerts(mon, "GpuExporterDown") if a["labels"].get("host") == NVML_HOST])


def test_node_down_inhibits_the_gpu_alerts_of_that_host(mon):
    """No exporter of the host answers: the host is down, and NodeDown inhibits the host's other alerts (the
    exporter-down ones included)."""
    wait_all_up(mon)
    ssh(mon, NVML_HOST, "systemctl stop prometheus-node-exporter.service gpufleet-exporter.service")
    try:
        wait_for("NodeDown in Alertmanager", lambda: [
            a for a in active_alerts(mon, "NodeDown") if a["labels"].get("host") == NVML_HOST])
        for name in ("GpuExporterDown", "NodeExporterDown"):
            suppressed = wait_for(f"{name} inhibited", lambda n=name: [
                a for a in _firing(mon, n, NVML_HOST) if a["status"]["inhibitedBy"]])
            assert suppressed[0]["status"]["state"] == "suppressed"
    finally:
        ssh(mon, NVML_HOST, "systemctl start prometheus-node-exporter.service gpufleet-exporter.service")
    wait_for("NodeDown resolved", lambda: not [
        a for a in active_alerts(mon, "NodeDown") if a["labels"].get("host") == NVML_HOST])


# ------------------------------------------------------------------------------------------------ alerts that mean
# what they say (issue 19): label shapes of both exporters, one temperature decision with verify, Xids and the
# recovery action by NVIDIA's tables, an exporter down alone, Prometheus' retention


def prometheus_alerts(fleet, name: str, host: str) -> list[dict]:
    """Prometheus' own ALERTS series (pending or firing) of one alert and host."""
    return promql(fleet, f'ALERTS{{alertname="{name}",host="{host}"}}')


def test_xid_13_raises_gpu_xid_error_and_no_critical_alert_on_both_exporter_paths(mon):
    """Xid 13 (RESTART_APP in NVIDIA's catalog) through dcgm-exporter's label shape (a series per Xid, err_code and
    err_msg labels) and through gpufleet's exporter: GpuXidError on the GPU it hit, no GpuXidCritical."""
    wait_all_up(mon)
    wait_for("the NVML exporter registered for Xid events", lambda: promql(
        mon, f'gpufleet_gpu_exporter_xid_events_supported{{host="{NVML_HOST}"}} == 1'))
    hit = ((DCGM_HOST, "1"), (NVML_HOST, "0"))
    for host, gpu in hit:
        gpufleet("sim", "fault", host, "xid", "--gpu", gpu, "--code", "13")
    try:
        for host, gpu in hit:
            alerts = wait_for(f"GpuXidError of {host} in Alertmanager", lambda h=host: _firing(mon, "GpuXidError", h))
            assert [a["labels"]["gpu"] for a in alerts] == [gpu], host
            assert alerts[0]["labels"]["severity"] == "warning"
            assert alerts[0]["annotations"]["summary"] == f"{host} GPU {gpu}: Xid 13"
            assert prometheus_alerts(mon, "GpuXidCritical", host) == []
        # released dcgm-exporter's shape on the dcgm path: the alert carries the Xid's code and a text for it
        dcgm_alert = _firing(mon, "GpuXidError", DCGM_HOST)[0]["labels"]
        assert dcgm_alert["err_code"] == "13" and dcgm_alert["err_msg"]
    finally:
        for host, _gpu in hit:
            gpufleet("sim", "fault", host, "clear")
        ssh(mon, NVML_HOST, "systemctl restart gpufleet-exporter.service")
    for host, _gpu in hit:
        wait_for(f"GpuXidError of {host} resolved", lambda h=host: not _firing(mon, "GpuXidError", h))


def test_a_stopped_node_exporter_raises_only_its_own_alert_and_hides_no_gpu_alert(mon):
    """node_exporter stopped on a live host: NodeExporterDown, not NodeDown, and an overheated GPU of the same host
    still reaches Alertmanager uninhibited."""
    wait_all_up(mon)
    ssh(mon, NVML_HOST, "systemctl stop prometheus-node-exporter.service")
    gpufleet("sim", "fault", NVML_HOST, "overheat", "--gpu", "0")
    try:
        alerts = wait_for("NodeExporterDown in Alertmanager", lambda: _firing(mon, "NodeExporterDown", NVML_HOST))
        assert alerts[0]["status"]["state"] == "active" and alerts[0]["labels"]["severity"] == "warning"
        # NodeDown shares NodeExporterDown's `for` and rule group: it would be pending or firing by now
        assert prometheus_alerts(mon, "NodeDown", NVML_HOST) == []
        hot = wait_for("GpuOverheating of the same host in Alertmanager", lambda: _firing(mon, "GpuOverheating",
                                                                                           NVML_HOST))
        assert [a["labels"]["gpu"] for a in hot] == ["0"]
        assert hot[0]["status"]["state"] == "active" and hot[0]["status"]["inhibitedBy"] == []
        assert not _firing(mon, "NodeDown", NVML_HOST)
    finally:
        gpufleet("sim", "fault", NVML_HOST, "clear")
        ssh(mon, NVML_HOST, "systemctl start prometheus-node-exporter.service")
    for name in ("NodeExporterDown", "GpuOverheating"):
        wait_for(f"{name} resolved", lambda n=name: not _firing(mon, n, NVML_HOST))


def _set_gpu_state(fleet, host: str, values: dict[int, dict[str, str]]) -> dict[int, dict[str, str | None]]:
    """Set simulated GPU fields (the hardware's side: a temperature, the driver's recovery action); return what was
    there before (None: absent) for restoring."""
    before: dict[int, dict[str, str | None]] = {}
    with simstate.locked(str(fleet.host(host).dir / "hw/gpus.state")) as state:
        for gpu, fields in values.items():
            for key, value in fields.items():
                before.setdefault(gpu, {})[key] = state.get(f"gpu.{gpu}.{key}")
                if value is None:
                    state.pop(f"gpu.{gpu}.{key}", None)
                else:
                    state[f"gpu.{gpu}.{key}"] = value
    return before


def test_alerts_and_verify_judge_each_gpu_alike(mon, tmp_path):
    """Each GPU by its own slowdown temperature on both exporter paths (H100 at its slowdown 89 °C: critical, where
    the old fallback of 90 °C said nothing; RTX 4090 1 °C under its slowdown: a warning, where the fallback said
    critical), and the driver's recovery action (reset: critical, drain P2P: warning): the alerts fire as verify
    judges the same GPUs."""
    wait_all_up(mon)
    dcgm, nvml = sim_state(mon, DCGM_HOST), sim_state(mon, NVML_HOST)
    dcgm_slowdown, nvml_slowdown = (int(simstate.gpu(s, g)["temp.slowdown"]) for s, g in ((dcgm, 5), (nvml, 0)))
    changes = {DCGM_HOST: {5: {"temp.gpu": str(dcgm_slowdown)}, 6: {"recovery_action": "1"}},
               NVML_HOST: {0: {"temp.gpu": str(nvml_slowdown - 1), "recovery_action": "3"}}}
    saved = {host: _set_gpu_state(mon, host, values) for host, values in changes.items()}
    try:
        expected = {("GpuOverheating", DCGM_HOST): ["5"], ("GpuTemperatureHigh", NVML_HOST): ["0"],
                    ("GpuRecoveryActionRequired", DCGM_HOST): ["6"], ("GpuRecoveryActionDrain", NVML_HOST): ["0"]}
        for (name, host), gpus in expected.items():
            alerts = wait_for(f"{name} of {host} in Alertmanager", lambda n=name, h=host: _firing(mon, n, h))
            assert sorted(a["labels"]["gpu"] for a in alerts) == gpus, (name, host)
        assert [a["labels"]["action"] for a in _firing(mon, "GpuRecoveryActionRequired", DCGM_HOST)] == ["gpu_reset"]
        # the RTX 4090 one degree under its own slowdown temperature is not overheating (the fallback's 90 °C would)
        assert prometheus_alerts(mon, "GpuOverheating", NVML_HOST) == []
        proc = subprocess.run([str(BIN / "gpufleet"), "verify", str(mon.test_inventory), "--limit", "gpu_nodes",
                               "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300)
        report = json.loads((tmp_path / "report.json").read_text())
        verdicts = {(h["host"], c["check"], c.get("gpu_index")): c["verdict"] for h in report["hosts"]
                    for c in h["checks"]}
        assert verdicts[(DCGM_HOST, "health.temperature", 5)] == "fail", proc.stdout + proc.stderr
        assert verdicts[(NVML_HOST, "health.temperature", 0)] == "warn"
        assert verdicts[(DCGM_HOST, "health.recovery_action", 6)] == "fail"
        assert verdicts[(NVML_HOST, "health.recovery_action", 0)] == "warn"
        assert verdicts[(DCGM_HOST, "health.recovery_action", 0)] == "pass"
    finally:
        for host, values in saved.items():
            _set_gpu_state(mon, host, values)
    for (name, host) in expected:
        wait_for(f"{name} of {host} resolved", lambda n=name, h=host: not _firing(mon, n, h))


def test_prometheus_keeps_data_as_long_as_the_longest_rule_reads(mon):
    """gpufleet_monitoring_retention (default 35d) reaches Prometheus through /etc/default/prometheus."""
    wait_all_up(mon)
    flags = api(mon, 9090, "/api/v1/status/flags")["data"]
    assert seconds(flags["storage.tsdb.retention.time"]) == 35 * 86400  # Prometheus shows it as 5w
    assert "--storage.tsdb.retention.time=35d" in ssh(mon, MON, "cat /etc/default/prometheus").stdout


def test_every_dashboard_panel_query_returns_data(mon):
    wait_all_up(mon)
    rss = promql(mon, 'process_resident_memory_bytes{job="prometheus"}')
    series = promql(mon, "prometheus_tsdb_head_series")
    print(f"\nPrometheus of the test fleet: {float(rss[0]['value'][1]) / 2**20:.0f} MiB resident, "
          f"{series[0]['value'][1]} head series")
    wait_for("the recording rules", lambda: promql(mon, "gpufleet:gpus_visible"))
    empty = []
    for name in render.DASHBOARDS:
        for title, expr in render.panel_queries(render.dashboard(name)):
            if expr.startswith(VERIFY_METRICS) or "- gpufleet_verify" in expr:
                continue  # only after a verify run: test_verify_and_benchmark_panels
            query = substitute(expr)
            if not promql(mon, query):
                empty.append(f"{name}: {title}: {query}")
    assert empty == []


VERIFY_METRICS = ("gpufleet_verify_", "gpufleet_bench_", "time() - gpufleet_verify")


def substitute(expr: str) -> str:
    """A panel's query with the dashboard variables as "All" selects them."""
    return expr.replace("$host", ".*").replace("$cluster", ".*").replace("$gpu", ".*")


# ------------------------------------------------------------------------------------------------ Grafana
# The Grafana stage on the simulated package (Grafana's unit and /etc/default file, a stand-in server): judged by
# the stand-in's HTTP API and the files on the monitoring host.

GRAFANA_PASSWORD = MONITORING_DATA["gpufleet_monitoring_grafana_admin_password"]


def grafana(fleet, path: str, password: str | None = GRAFANA_PASSWORD) -> tuple[int, object]:
    request = urllib.request.Request(f"http://{fleet.host(MON).address}:3000{path}")
    if password is not None:
        token = base64.b64encode(f"admin:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, None


def test_grafana_answers_for_every_dashboard_and_the_datasource(mon):
    status, health = wait_for("Grafana's health", lambda: (r := grafana(mon, "/api/health", None))[0] == 200 and r)
    assert health["database"] == "ok"
    status, found = grafana(mon, "/api/search")
    assert status == 200
    titles = {json.loads(render.dashboard(n))["title"] for n in render.DASHBOARDS}
    assert {d["title"] for d in found} == titles and {d["folderTitle"] for d in found} == {"gpufleet"}
    status, datasources = grafana(mon, "/api/datasources")
    assert status == 200
    assert [(d["type"], d["url"], d["isDefault"]) for d in datasources] == [
        ("prometheus", f"http://{mon.host(MON).address}:9090", True)]
    assert grafana(mon, "/api/search", None)[0] == 401
    assert grafana(mon, "/api/search", "admin")[0] == 401
    root = mon.host(MON).dir / "root"
    # the package's environment file, untouched; gpufleet's settings in a drop-in
    assert (root / "etc/default/grafana-server").read_bytes() == (repo.GRAFANA_DIR / repo.GRAFANA_DEFAULTS).read_bytes()
    dropin = (root / "etc/systemd/system/grafana-server.service.d/gpufleet.conf").read_text()
    assert "GF_SERVER_HTTP_PORT=3000" in dropin and GRAFANA_PASSWORD not in dropin
    mode = ssh(mon, MON, "stat -c '%a %U %G' /etc/grafana/gpufleet-admin-password").stdout.split()
    assert mode == ["640", "root", "grafana"]


def _with_password(tmp_path: Path, mon, password: str) -> Path:
    return write_inventory(tmp_path / "grafana_inventory.py", mon.inventory,
                           {**MONITORING_DATA, "gpufleet_monitoring_grafana_admin_password": password})


def test_grafana_password_change_is_applied_to_the_existing_grafana_and_never_printed(mon, tmp_path):
    wait_for("Grafana's health", lambda: grafana(mon, "/api/health", None)[0] == 200)
    new = "e2e-changed-Grafana-2"
    inventory = _with_password(tmp_path, mon, new)
    for flags in (["--dry", "--diff"], ["--dry", "--json"], ["--dry", "--diff", "-vv"]):
        result = subprocess.run([str(BIN / "pyinfra"), *flags, str(inventory), "deploys/monitoring.py"],
                                capture_output=True, text=True, timeout=900, cwd=REPO)
        assert result.returncode == 0, result.stdout + result.stderr
        assert new not in result.stdout + result.stderr and GRAFANA_PASSWORD not in result.stdout + result.stderr
        assert "Grafana admin password" in result.stdout + result.stderr
    try:
        output = run_pyinfra(inventory, "deploys/monitoring.py").stdout
        assert new not in output
        assert grafana(mon, "/api/search", new)[0] == 200
        assert grafana(mon, "/api/search", GRAFANA_PASSWORD)[0] == 401
        # applied: the next run with the same password changes nothing
        total = grand_total(run_pyinfra(inventory, "deploys/monitoring.py").stdout)
        assert total["success"] == "-" and total["error"] == "-", total
    finally:
        run_pyinfra(mon.test_inventory, "deploys/monitoring.py")
    assert grafana(mon, "/api/search")[0] == 200


def test_grafana_defaults_replaced_by_an_earlier_gpufleet_are_restored(mon):
    """gpufleet before this version wrote its own /etc/default/grafana-server (no CONF_FILE, DATA_DIR...)."""
    root = mon.host(MON).dir / "root"
    packaged = (root / "etc/default/grafana-server").read_bytes()
    ssh(mon, MON, "printf '# Managed by gpufleet\\nGF_SERVER_HTTP_PORT=3000\\n' > /etc/default/grafana-server")
    run_pyinfra(mon.test_inventory, "deploys/monitoring.py")
    assert (root / "etc/default/grafana-server").read_bytes() == packaged
    wait_for("Grafana's health", lambda: grafana(mon, "/api/health", None)[0] == 200)
    assert grafana(mon, "/api/search")[0] == 200


def test_grafana_repository_key_trusted_only_with_the_fingerprint_set(mon, tmp_path):
    sim_key = openpgp_fingerprints((repo.repo_dir() / repo.GRAFANA_KEY_NAME).read_bytes())
    assert len(sim_key) == 1
    wrong = "0123456789ABCDEF0123456789ABCDEF01234567"
    keyring = mon.host(MON).dir / "root/etc/apt/keyrings/grafana.asc"
    before = keyring.read_bytes()
    inventory = write_inventory(tmp_path / "key_inventory.py", mon.inventory,
                                {**MONITORING_DATA, "gpufleet_monitoring_grafana_repo_key_fingerprint": wrong})
    result = run_pyinfra(inventory, "deploys/monitoring.py", check=False)
    assert result.returncode != 0
    refusal = (f"{MON}: gpufleet_monitoring_grafana_repo_key_fingerprint='{wrong}': the key at "
               f"{mon.repo_url}/gpg-full.key has fingerprint {sim_key[0]}; not trusted, nothing was changed")
    assert refusal in result.stdout, result.stdout
    assert keyring.read_bytes() == before
    # the installed key is the one with the fingerprint given: nothing to do
    inventory = write_inventory(tmp_path / "key_inventory.py", mon.inventory,
                                {**MONITORING_DATA, "gpufleet_monitoring_grafana_repo_key_fingerprint": sim_key[0]})
    total = grand_total(run_pyinfra(inventory, "deploys/monitoring.py").stdout)
    assert total["success"] == "-" and total["error"] == "-", total
    # armored, as Grafana's instructions install it (apt reads *.asc files as armored keys)
    assert openpgp_fingerprints(keyring.read_bytes()) == sim_key
    assert keyring.read_bytes().startswith(b"-----BEGIN PGP PUBLIC KEY BLOCK-----")


def test_verify_and_benchmark_panels(mon, tmp_path):
    """The verify panel's queries answer once a verify ran; the benchmark ones are valid PromQL (the simulated
    fleet has no GPU backend: verify measures no benchmark there, and never invents a number)."""
    wait_all_up(mon)
    subprocess.run([str(BIN / "gpufleet"), "verify", str(mon.test_inventory), "--limit", "gpu_nodes", "--out",
                    str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    queries = [(t, e) for n in render.DASHBOARDS for t, e in render.panel_queries(render.dashboard(n))
               if e.startswith(VERIFY_METRICS)]
    assert queries
    for title, expr in queries:
        if "gpufleet_bench_" in expr:
            api(mon, 9090, "/api/v1/query", query=substitute(expr))  # status success or HTTPError
        else:
            wait_for(f"{title}: {expr}", lambda e=expr: promql(mon, substitute(e)))


def test_verify_checks_the_exporters_and_its_textfile_reaches_prometheus(mon, tmp_path):
    wait_all_up(mon)
    proc = subprocess.run([str(BIN / "gpufleet"), "verify", str(mon.test_inventory), "--limit", "gpu_nodes",
                           "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "report.json").read_text())
    checks = {(c["host"], c["check"]): c["verdict"] for h in report["hosts"] for c in h["checks"]
              if c["check"].startswith("config.exporter.")}
    assert checks == {**{(h, f"config.exporter.{e}"): "pass" for h in (DCGM_HOST, NVML_HOST) for e in ("gpu", "node")},
                      (DCGM_HOST, "config.exporter.gpu_counters"): "pass"}, proc.stdout + proc.stderr
    # verify's textfile lands in node_exporter's textfile directory: Prometheus sees it with the inventory labels
    # each node's textfile reaches Prometheus at that node's next scrape: wait for both, then judge the labels
    result = wait_for("gpufleet_verify_host_up of both nodes in Prometheus",
                      lambda: (found := promql(mon, "gpufleet_verify_host_up")) and len(found) >= 2 and found)
    assert sorted((r["metric"]["host"], r["metric"]["hostname"]) for r in result) == [
        (DCGM_HOST, DCGM_HOST), (NVML_HOST, NVML_HOST)]
    ssh(mon, NVML_HOST, "systemctl stop gpufleet-exporter.service")
    try:
        proc = subprocess.run([str(BIN / "gpufleet"), "verify", str(mon.test_inventory), "--limit", NVML_HOST,
                               "--out", str(tmp_path / "down")], cwd=REPO, capture_output=True, text=True,
                              timeout=300)
        report = json.loads((tmp_path / "down" / "report.json").read_text())
        verdicts = {c["check"]: c["verdict"] for h in report["hosts"] for c in h["checks"]}
        assert verdicts["config.exporter.gpu"] == "fail" and proc.returncode == 1
    finally:
        ssh(mon, NVML_HOST, "systemctl start gpufleet-exporter.service")


# ------------------------------------------------------------------------------------------------ dcgm-exporter as
# NVIDIA packages it (issue 19): its own unit, one host engine, the collect interval, the label shapes

def live_gpu_holders(fleet, host: str, gpu: int = 0) -> list[str]:
    """The simulator's record of the processes holding a GPU open (the simulated NVML's clients), live ones only,
    by name: read inside the host, where the pids are."""
    script = ("import os, sys; sys.path.insert(0, '/usr/lib/gpufleet-sim'); from simgpu import state; "
              "s = state.read_state(); "
              f"print('\\n'.join(sorted(v for k, v in s.items() if k.startswith('gpu.{gpu}.client.') "
              "and os.path.exists('/proc/' + k.rsplit('.', 1)[1]))))")
    return ssh(fleet, host, f"python3 -S -c {json.dumps(script)}").stdout.split()


def unit_directives(text: str) -> set[tuple[str, str, str]]:
    """(section, key, value) of every directive of a unit file."""
    section, found = "", set()
    for line in map(str.strip, text.splitlines()):
        if line.startswith("["):
            section = line.strip("[]")
        elif line and not line.startswith(("#", ";")):
            key, value = line.split("=", 1)
            found.add((section, key.strip(), value.strip()))
    return found


def test_dcgm_exporter_runs_as_nvidias_unit_against_the_one_host_engine(mon):
    from tests import upstream

    wait_all_up(mon)
    show = ssh(mon, DCGM_HOST, "systemctl show nvidia-dcgm-exporter.service nvidia-dcgm.service "
                               "-p Id,ActiveState,FragmentPath,DropInPaths,ExecStart").stdout
    units = [dict(line.split("=", 1) for line in block.splitlines() if "=" in line) for block in show.split("\n\n")]
    exporter, engine = units
    assert (exporter["Id"], exporter["ActiveState"], engine["ActiveState"]) == (
        "nvidia-dcgm-exporter.service", "active", "active")
    assert exporter["DropInPaths"] == "/etc/systemd/system/nvidia-dcgm-exporter.service.d/gpufleet.conf"
    assert " -c 2000 -r localhost:5555 " in exporter["ExecStart"]  # the node's scrape interval (2s), in ms
    # the unit on the node is the package's, at NVIDIA's path (/lib is /usr/lib on merged-/usr Debian), with every
    # directive NVIDIA's unit has; no unit under the name earlier versions used
    relpath = "dcgm-exporter/packaging/config-files/systemd/nvidia-dcgm-exporter.service"
    installed = upstream.recorded(relpath)["installed_as"]["path"]
    assert exporter["FragmentPath"] in (installed, "/usr" + installed)
    fragment = mon.host(DCGM_HOST).dir / "root" / exporter["FragmentPath"].lstrip("/")
    on_node = unit_directives(fragment.read_text())
    assert {(section, key, value) for section, directives in upstream.systemd_unit(relpath).items()
            for key, value in directives} <= on_node
    assert "0 unit files listed" in ssh(mon, DCGM_HOST, "systemctl list-unit-files dcgm-exporter.service",
                                        check=False).stdout
    # one DCGM host engine: nv-hostengine holds the GPUs, dcgm-exporter (no embedded engine) does not
    for gpu in (0, 7):
        holders = live_gpu_holders(mon, DCGM_HOST, gpu)
        assert holders.count("nv-hostengine") == 1 and "dcgm-exporter" not in holders, holders
    # read through the host engine: the series carry its host, as the release does with -r
    series = promql(mon, f'DCGM_FI_DEV_GPU_TEMP{{host="{DCGM_HOST}"}}')
    assert {r["metric"]["Hostname"] for r in series} == {"localhost"}


def test_both_exporters_export_each_gpus_thresholds_and_recovery_action(mon):
    wait_all_up(mon)
    for host in (DCGM_HOST, NVML_HOST):
        state = sim_state(mon, host)
        count = simstate.gpu_count(state)
        for metric, key in (("DCGM_FI_DEV_SLOWDOWN_TEMP", "temp.slowdown"),
                            ("DCGM_FI_DEV_SHUTDOWN_TEMP", "temp.shutdown")):
            found = wait_for(f"{metric} of {host}", lambda m=metric, h=host: promql(mon, f'{m}{{host="{h}"}}'))
            assert {r["metric"]["gpu"]: float(r["value"][1]) for r in found} == {
                str(i): float(simstate.gpu(state, i)[key]) for i in range(count)}, (host, metric)
        actions = wait_for(f"the recovery action of {host}", lambda h=host: promql(
            mon, f'DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION{{host="{h}"}}'))
        assert sorted((r["metric"]["gpu"], r["value"][1]) for r in actions) == [(str(i), "0") for i in range(count)]


def test_xid_series_carry_err_code_and_err_msg_on_both_paths(mon):
    """Released dcgm-exporter labels each Xid with its code and text (a new series per Xid); the NVML exporter
    answers in the same shape. The text on both is gpufleet's (NVIDIA's Xid catalog name), not dcgm-exporter's own."""
    wait_all_up(mon)
    wait_for("the NVML exporter registered for Xid events", lambda: promql(
        mon, f'gpufleet_gpu_exporter_xid_events_supported{{host="{NVML_HOST}"}} == 1'))
    for host in (DCGM_HOST, NVML_HOST):
        gpufleet("sim", "fault", host, "xid", "--gpu", "0", "--code", "13")
    try:
        for host in (DCGM_HOST, NVML_HOST):
            found = wait_for(f"Xid 13 of {host}", lambda h=host: promql(
                mon, f'DCGM_FI_DEV_XID_ERRORS{{host="{h}",gpu="0",err_code="13"}}'))
            assert found[0]["metric"]["err_msg"] == err_msg(13) and found[0]["value"][1] == "13"
    finally:
        for host in (DCGM_HOST, NVML_HOST):
            gpufleet("sim", "fault", host, "clear")
        ssh(mon, NVML_HOST, "systemctl restart gpufleet-exporter.service")
    wait_for("the dcgm path's Xid back to none", lambda: promql(
        mon, f'DCGM_FI_DEV_XID_ERRORS{{host="{DCGM_HOST}",gpu="0",err_code="0",err_msg="{err_msg(0)}"}}'))


def _files(fleet, host: str, paths: tuple[str, ...]) -> dict[str, str]:
    root = fleet.host(host).dir / "root"
    return {p: hashlib.sha256((root / p.lstrip("/")).read_bytes()).hexdigest() if (root / p.lstrip("/")).exists()
            else "" for p in paths}


WATCHED = ("/etc/prometheus/prometheus.yml", "/etc/prometheus/alertmanager.yml",
           "/etc/prometheus/prometheus-web-config.yml", "/etc/prometheus/gpufleet-exporters.password",
           "/var/lib/prometheus/node-exporter/gpufleet_desired.prom",
           "/etc/prometheus/rules/gpufleet-alerts.rules.yml", "/etc/prometheus/file_sd/gpufleet-gpu.json")


def test_second_run_of_both_deploys_changes_nothing(mon):
    wait_all_up(mon)
    before = _files(mon, MON, WATCHED)
    for deploy in ("deploys/gpu_node.py", "deploys/monitoring.py"):
        total = grand_total(run_pyinfra(mon.test_inventory, deploy).stdout)
        assert total["success"] == "-" and total["error"] == "-", (deploy, total)
    assert _files(mon, MON, WATCHED) == before


def test_ctrl_c_to_the_monitoring_deploy_exits_130_naming_the_host(mon):
    """A terminal's Ctrl-C reaches pyinfra's whole process group while the monitoring host reads its packages: exit
    130 and the host named (pyinfra's own answer is "Exiting upon user request!" and exit 0)."""
    faults.close_gate(mon.host(MON), "dpkg-query", "prometheus")
    run = subprocess.Popen([str(BIN / "pyinfra"), "-y", str(mon.test_inventory), "deploys/monitoring.py"], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (faults.gate_reached(mon.host(MON), "dpkg-query") or run.poll() is not None):
            assert time.monotonic() < deadline, "timed out waiting for the package read on the monitoring host"
            time.sleep(0.05)
        assert run.poll() is None, run.communicate()[0]
        os.killpg(run.pid, signal.SIGINT)
        out, _ = run.communicate(timeout=60)
    finally:
        faults.open_gate(mon.host(MON), "dpkg-query")
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(30)
    assert run.returncode == 130, out
    assert "gpufleet: interrupted by SIGINT while executing (exit 130)." in out, out
    assert f"  {MON}: gpufleet: monitoring" in out, out


@pytest.mark.parametrize(("monitoring", "dcgm_extra", "expected"), [
    ({**MONITORING_DATA, "gpufleet_monitoring_receivers": [{"name": "pager", "type": "pagerduty", "url": "x"}]},
     None, f"{MON}: gpufleet_monitoring_receivers[0].type='pagerduty': unknown receiver type"),
    ({k: v for k, v in MONITORING_DATA.items() if k != "gpufleet_monitoring_grafana_admin_password"},
     None, f"{MON}: gpufleet_monitoring_grafana_admin_password=None: Grafana is enabled but has no admin password"),
    ({**MONITORING_DATA, "gpufleet_monitoring_scrape_interval": "2 seconds"},
     None, f"{MON}: gpufleet_monitoring_scrape_interval='2 seconds': not a Prometheus duration"),
    ({**MONITORING_DATA, "gpufleet_monitoring_alertmanager_listen": "0.0.0.0:9090"},
     None, f"{MON}: gpufleet_monitoring_alertmanager_listen='0.0.0.0:9090': port clash with "
           "gpufleet_monitoring_prometheus_listen"),
    (None, {"gpufleet_exporters_node_listen": "0.0.0.0:9400"},
     f"{DCGM_HOST}: gpufleet_exporters_node_listen='0.0.0.0:9400': port clash"),
    ({**MONITORING_DATA, "gpufleet_monitoring_alertmanager_listen": "192.0.2.1:9093"},
     None, f"{MON}: gpufleet_monitoring_alertmanager_listen='192.0.2.1:9093': not an address of this host"),
], ids=["unknown-receiver-type", "no-grafana-password", "bad-interval", "port-clash-monitoring",
        "port-clash-exporters", "listen-address-not-on-the-host"])
def test_bad_input_is_refused_before_any_change(mon, tmp_path, monitoring, dcgm_extra, expected):
    before = {h: _files(mon, h, WATCHED + ("/etc/default/prometheus-node-exporter",)) for h in (MON, DCGM_HOST)}
    inventory = write_inventory(tmp_path / "bad_inventory.py", mon.inventory, monitoring, dcgm_extra)
    result = run_pyinfra(inventory, "deploys/monitoring.py", check=False)
    assert result.returncode != 0
    assert expected in result.stdout, result.stdout
    assert "no host was changed" in result.stdout
    assert {h: _files(mon, h, WATCHED + ("/etc/default/prometheus-node-exporter",)) for h in (MON, DCGM_HOST)} == before


SECRETS = ("s3cr3t-slack-T0K3N", "hunter2-basic", "q-t0ken-42")
SECRET_RECEIVERS = [
    {"name": "ops", "type": "webhook", "url": f"http://127.0.0.1:9999/alerts?token={SECRETS[2]}"},
    {"name": "chat", "type": "slack", "api_url": f"https://hooks.slack.com/services/T0/B0/{SECRETS[0]}"},
]


def test_receiver_secrets_never_show_and_the_file_is_0640_root_prometheus(mon, tmp_path):
    """--dry --diff and --json of a monitoring deploy whose receivers' tokens changed show neither the tokens nor
    the file's text; a refused receiver URL is masked in the error; alertmanager.yml is 0640 root:prometheus."""
    stat = ssh(mon, MON, "stat -c '%a %U %G' /etc/prometheus/alertmanager.yml").stdout.split()
    assert stat == ["640", "root", "prometheus"]
    before = _files(mon, MON, WATCHED)
    inventory = write_inventory(tmp_path / "secret_inventory.py", mon.inventory,
                                {**MONITORING_DATA, "gpufleet_monitoring_receivers": SECRET_RECEIVERS})
    for options in (["--dry", "--diff"], ["--dry", "--json"]):
        result = subprocess.run([str(BIN / "pyinfra"), *options, str(inventory), "deploys/monitoring.py"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900, cwd=REPO)
        assert result.returncode == 0, result.stdout
        assert "alertmanager.yml" in result.stdout  # the change is announced ...
        assert not [s for s in SECRETS if s in result.stdout], result.stdout  # ... its text is not
    assert _files(mon, MON, WATCHED) == before
    bad = write_inventory(tmp_path / "bad_url_inventory.py", mon.inventory, {
        **MONITORING_DATA, "gpufleet_monitoring_receivers": [
            {"name": "ops", "type": "webhook", "url": f"http://ops:{SECRETS[1]}@127.0.0.1:9999/x y"}]})
    result = run_pyinfra(bad, "deploys/monitoring.py", check=False)
    assert result.returncode != 0 and "receivers[0].url='http://127.0.0.1:9999/***': not a URL" in result.stdout
    assert SECRETS[1] not in result.stdout


# ------------------------------------------------------------------------------------------------ the monitoring
# plane asks for credentials (issue 21): every listener on the host's management address, basic auth on each


# (host, port, account) of every listener of the monitoring plane on the fleet
LISTENERS = ((DCGM_HOST, 9100, "exporters"), (DCGM_HOST, 9400, "exporters"), (NVML_HOST, 9100, "exporters"),
             (NVML_HOST, 9400, "exporters"), (MON, 9090, "prometheus"), (MON, 9093, "alertmanager"))
PATHS = {9100: "/metrics", 9400: "/metrics", 9090: "/api/v1/targets", 9093: "/api/v2/alerts"}
SILENCE = {"matchers": [{"name": "alertname", "value": ".+", "isRegex": True}], "startsAt": "2020-01-01T00:00:00Z",
           "endsAt": "2099-01-01T00:00:00Z", "createdBy": "e2e", "comment": "issue 21: silence everything"}


def _status(url: str, authorization_header: str | None = None, data: bytes | None = None,
            method: str = "GET") -> int:
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
    if authorization_header:
        request.add_header("Authorization", authorization_header)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_every_listener_binds_the_management_address_and_refuses_requests_without_credentials(mon):
    wait_all_up(mon)  # Prometheus scrapes every target with the credentials: up == 1 on each
    assert promql(mon, 'count(up == 1)')[0]["value"][1] == str(len(EXPECTED_TARGETS))
    for name in (DCGM_HOST, NVML_HOST, MON):
        ports = {port for host, port, _ in LISTENERS if host == name}
        listening = ssh(mon, name, "ss -Hltn").stdout.split("\n")
        bound = {int(line.split()[3].rsplit(":", 1)[1]): line.split()[3].rsplit(":", 1)[0] for line in listening
                 if line.strip() and int(line.split()[3].rsplit(":", 1)[1]) in ports}
        assert bound == dict.fromkeys(ports, mon.host(name).address), (name, listening)
    # from another simulated host of the fleet (a GPU node a user's job runs on): 401 without or with a wrong password
    urls = " ".join(f"http://{mon.host(h).address}:{p}{PATHS[p]}" for h, p, _ in LISTENERS)
    script = (f"for url in {urls}; do curl -s -o /dev/null -w '%{{http_code}} ' $url; "
              "curl -s -o /dev/null -u gpufleet:wrong -w '%{http_code} ' $url; done")
    assert ssh(mon, NVML_HOST, script).stdout.split() == ["401"] * (2 * len(LISTENERS))
    # with the account's password (the control machine's): answered
    for host, port, account in LISTENERS:
        url = f"http://{mon.host(host).address}:{port}{PATHS[port]}"
        assert _status(url, authorization(account)) == 200, url
        assert _status(url, authorization("exporters" if account != "exporters" else "prometheus")) == 401, url


def test_a_silence_needs_alertmanagers_credential(mon):
    url = f"http://{mon.host(MON).address}:9093/api/v2/silences"
    body = json.dumps(SILENCE).encode()
    assert _status(url, data=body, method="POST") == 401
    assert _status(url, authorization("prometheus"), data=body, method="POST") == 401
    assert [s for s in api(mon, 9093, "/api/v2/silences") if s["status"]["state"] == "active"] == []
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "Authorization": authorization("alertmanager")})
    with urllib.request.urlopen(request, timeout=10) as response:
        silence = json.load(response)["silenceID"]
    try:
        assert [s["id"] for s in api(mon, 9093, "/api/v2/silences") if s["status"]["state"] == "active"] == [silence]
    finally:  # expired again: the other tests' alerts must reach their receiver
        assert _status(f"http://{mon.host(MON).address}:9093/api/v2/silence/{silence}",
                       authorization("alertmanager"), method="DELETE") == 200


def test_credentials_stay_on_the_control_machine_and_in_private_files(mon):
    secrets = {account: web_auth.password(account) for account in web_auth.ACCOUNTS}
    assert oct(web_auth.credentials_dir().stat().st_mode & 0o777) == "0o700"
    for run in (mon.first_gpu_node, mon.first_monitoring):
        assert not [a for a, s in secrets.items() if s in run.stdout]
    modes = {
        DCGM_HOST: {"/etc/prometheus/node-exporter-web-config.yml": "640 root prometheus",
                    "/etc/dcgm-exporter/web-config.yml": "600 root root"},
        NVML_HOST: {"/etc/prometheus/node-exporter-web-config.yml": "640 root prometheus",
                    "/etc/gpufleet/gpu-exporter-web-config.yml": "600 root root"},
        MON: {**dict.fromkeys(["/etc/prometheus/prometheus-web-config.yml",
                               "/etc/prometheus/alertmanager-web-config.yml",
                               *render.PASSWORD_FILES.values()], "640 root prometheus"),
              "/etc/grafana/provisioning/datasources/gpufleet.yml": "640 root grafana"},
    }
    for name, files in modes.items():
        out = ssh(mon, name, "stat -c '%n %a %U %G' " + " ".join(files)).stdout.splitlines()
        assert {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out} == files, name
        root = mon.host(name).dir / "root"
        for path in files:
            text = (root / path.lstrip("/")).read_text()
            leaked = [a for a, s in secrets.items() if s in text]
            expected = {"/etc/grafana/provisioning/datasources/gpufleet.yml": ["prometheus"],
                        **{p: [a] for a, p in render.PASSWORD_FILES.items()}}.get(path, [])
            assert leaked == expected, (name, path)


TLS_DIR = "/etc/ssl/gpufleet-e2e"


# last of the module: it leaves the listeners on HTTPS
def test_https_with_the_sites_certificates_and_with_the_fleet_ca(mon, tmp_path):
    """The nvml node's exporters with the site's certificate files (refused while they are missing), the dcgm node's
    exporters, Prometheus and Alertmanager with the fleet CA's: Prometheus scrapes every target over HTTPS (up), sends
    alerts to Alertmanager over HTTPS, plain HTTP is not served and HTTPS still asks for the credential."""
    node = mon.host(NVML_HOST).address
    tls = {"cert_file": f"{TLS_DIR}/node.crt", "key_file": f"{TLS_DIR}/node.key"}
    alice = bcrypt.hashpw(b"alice-password", bcrypt.gensalt(4)).decode()  # a person's own Prometheus account
    monitoring = {**MONITORING_DATA, "gpufleet_monitoring_tls_fleet_ca": True,
                  "gpufleet_monitoring_prometheus_basic_auth_users": {"alice": alice}}
    nvml_tls = {"gpufleet_exporters_node_tls_server_config": tls, "gpufleet_exporters_gpu_tls_server_config": tls}
    inventory = write_inventory(tmp_path / "tls_inventory.py", mon.inventory, monitoring,
                                dcgm_extra={"gpufleet_exporters_tls_fleet_ca": True}, nvml_extra=nvml_tls)
    gpu_node = [str(BIN / "pyinfra"), "-y", str(inventory), "deploys/gpu_node.py"]
    # the files the settings name are not on the node yet: refused before any change
    before = {h: _files(mon, h, ("/etc/prometheus/node-exporter-web-config.yml",)) for h in (NVML_HOST, DCGM_HOST)}
    result = subprocess.run(gpu_node, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900,
                            cwd=REPO)
    assert result.returncode != 0 and "no host was changed" in result.stdout, result.stdout
    assert (f"{NVML_HOST}: gpufleet_exporters_node_tls_server_config.cert_file='{TLS_DIR}/node.crt': no such file "
            "on the host") in result.stdout
    assert {h: _files(mon, h, ("/etc/prometheus/node-exporter-web-config.yml",)) for h in (NVML_HOST, DCGM_HOST)} \
        == before
    # the site's certificate for the nvml node (here issued by the same CA, so that one CA file checks all)
    cert, key = fleet_ca.host_certificate("site-issued", [node], [])
    directory = mon.host(NVML_HOST).dir / "root" / TLS_DIR.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "node.crt").write_text(cert)
    (directory / "node.key").write_text(key)
    # node_exporter runs as Debian's prometheus user: the site lets it read the key
    ssh(mon, NVML_HOST, f"chown root:prometheus {TLS_DIR}/node.key && chmod 640 {TLS_DIR}/node.key")
    result = subprocess.run(gpu_node, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900,
                            cwd=REPO)
    assert result.returncode == 0, result.stdout
    run_pyinfra(inventory, "deploys/monitoring.py")
    ca = tmp_path / "ca.crt"
    ca.write_text(fleet_ca.ca()[0])
    trusting = ssl.create_default_context(cafile=str(ca))

    def get(port: int, path: str):
        request = urllib.request.Request(f"https://{mon.host(MON).address}:{port}{path}",
                                         headers={"Authorization": authorization(ACCOUNT_OF_PORT[port])})
        with urllib.request.urlopen(request, timeout=10, context=trusting) as response:
            return json.load(response)

    def schemes():
        try:
            targets = get(9090, "/api/v1/targets")["data"]["activeTargets"]
        except OSError:
            return None
        return {(t["labels"]["job"], t["labels"].get("host", "")): (t["scrapeUrl"].split(":")[0], t["health"])
                for t in targets}

    wait_for("every target scraped over HTTPS", lambda: schemes() == dict.fromkeys(EXPECTED_TARGETS, ("https", "up")))
    # a person's own account beside gpufleet's, checked by Prometheus itself
    people = {}
    for password in ("alice-password", "wrong"):
        request = urllib.request.Request(
            f"https://{mon.host(MON).address}:9090/api/v1/status/buildinfo",
            headers={"Authorization": "Basic " + base64.b64encode(f"alice:{password}".encode()).decode()})
        try:
            with urllib.request.urlopen(request, timeout=10, context=trusting) as response:
                people[password] = response.status
        except urllib.error.HTTPError as error:
            people[password] = error.code
    assert people == {"alice-password": 200, "wrong": 401}, people
    assert [a["url"].split(":")[0] for a in get(9090, "/api/v1/alertmanagers")["data"]["activeAlertmanagers"]] == [
        "https"]
    for address in (node, mon.host(DCGM_HOST).address):
        for port in (9100, 9400):
            request = urllib.request.Request(f"https://{address}:{port}/metrics",
                                             headers={"Authorization": authorization("exporters")})
            with urllib.request.urlopen(request, timeout=10, context=trusting) as response:
                assert response.status == 200
    # from another simulated host: plain HTTP is not served, HTTPS still asks for the credential
    urls = [f"{mon.host(h).address}:{p}{PATHS[p]}" for h, p, _ in LISTENERS]
    script = "; ".join(f"curl -s -o /dev/null -w '%{{http_code}} ' http://{u}; "
                       f"curl -s -k -o /dev/null -w '%{{http_code}} ' https://{u}" for u in urls)
    codes = ssh(mon, NVML_HOST, script, check=False).stdout.split()
    assert codes[1::2] == ["401"] * len(LISTENERS) and "200" not in codes, codes
    # the fleet CA's key stays on the control machine
    assert "PRIVATE KEY" in (web_auth.credentials_dir() / "fleet-ca" / "ca.key").read_text()
    assert ssh(mon, MON, "stat -c '%a %U %G' /etc/gpufleet/tls/key.pem").stdout.split() == ["640", "root",
                                                                                             "prometheus"]
    # with TLS on, the second run of both deploys changes nothing (the certificates, keys and web configs kept)
    for deploy in ("deploys/gpu_node.py", "deploys/monitoring.py"):
        total = grand_total(run_pyinfra(inventory, deploy).stdout)
        assert total["success"] == "-" and total["error"] == "-", (deploy, total)
    # the site renews the node's certificate: gpufleet's exporter, which got the old one at start
    # (LoadCredential=), and node_exporter serve the new one without a deploy. First the key, then (2 s later, as two
    # steps of a tool) the certificate, each written beside and moved into place; then certbot's way: the names are
    # symlinks into an archive, swapped for new ones
    def renew(name: str, symlinks: bool) -> str:
        renewed, renewed_key = fleet_ca.host_certificate(name, [node], [])
        assert _served(node, 9400) != ssl.PEM_cert_to_DER_cert(renewed)
        key_file, cert_file = (f"archive/{name}.key", f"archive/{name}.crt") if symlinks else ("node.key", "node.crt")
        ssh(mon, NVML_HOST, f"cd {TLS_DIR} && mkdir -p archive && printf %s {shlex.quote(renewed_key)} > k.new && "
                            f"chown root:prometheus k.new && chmod 640 k.new && mv k.new {key_file}"
            + (f" && ln -s {key_file} k.link && mv -T k.link node.key" if symlinks else ""))
        time.sleep(2)
        ssh(mon, NVML_HOST, f"cd {TLS_DIR} && printf %s {shlex.quote(renewed)} > c.new && mv c.new {cert_file}"
            + (f" && ln -s {cert_file} c.link && mv -T c.link node.crt" if symlinks else ""))
        return renewed

    for name, symlinks in (("site-renewed", False), ("site-symlinked", True), ("site-symlinks-swapped", True)):
        renewed = renew(name, symlinks)
        for port in (9400, 9100):
            wait_for(f"{NVML_HOST}:{port} serving the certificate {name}",
                     lambda port=port, renewed=renewed: _served(node, port) == ssl.PEM_cert_to_DER_cert(renewed),
                     timeout=60)


def _served(address: str, port: int) -> bytes | None:
    """The certificate the listener presents (DER), None while it does not answer."""
    try:
        return ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate((address, port), timeout=5))
    except OSError:
        return None
