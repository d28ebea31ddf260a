"""The monitoring host's files, rendered from validated settings and the inventory (pure: no host access).

* :func:`scrape_targets` — file_sd target groups (jobs ``gpu`` and ``node``) of every GPU node whose stage
  ``exporters`` is on, labelled ``host``, ``group``, ``gpu_model``, ``cluster``.
* :func:`prometheus_config`, :func:`alertmanager_config`, Grafana's provisioning files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from gpufleet.config import NodeConfig
from gpufleet.web_auth import USER

from .config import MonitoringSettings, TargetSettings, seconds

PROMETHEUS_DIR = "/etc/prometheus"
FILE_SD_DIR = f"{PROMETHEUS_DIR}/file_sd"
RULES_DIR = f"{PROMETHEUS_DIR}/rules"
JOBS = ("gpu", "node")
# the passwords Prometheus sends (basic_auth password_file), 0640 root:prometheus: per account of gpufleet.web_auth
PASSWORD_FILES = {account: f"{PROMETHEUS_DIR}/gpufleet-{account}.password"
                  for account in ("exporters", "prometheus", "alertmanager")}
PROMETHEUS_WEB_CONFIG = f"{PROMETHEUS_DIR}/prometheus-web-config.yml"
ALERTMANAGER_WEB_CONFIG = f"{PROMETHEUS_DIR}/alertmanager-web-config.yml"
DASHBOARDS = ("gpu-fleet-health.json", "training.json")
GRAFANA_DASHBOARD_DIR = "/var/lib/grafana/dashboards/gpufleet"
# the alert that means the whole host is down (none of its exporters answers): the only one that inhibits others
HOST_DOWN_ALERT = "NodeDown"


@dataclass(frozen=True)
class Target:
    """One GPU node as the monitoring host sees it."""

    host: str
    address: str  # how Prometheus reaches it (ssh_hostname, else the inventory name)
    groups: tuple[str, ...]
    config: NodeConfig
    target: TargetSettings


def _dump(data: Any) -> str:
    return "# Managed by gpufleet (deploys/monitoring.py), generated from the inventory.\n" + yaml.safe_dump(
        data, sort_keys=False, width=1000)


def scrape_targets(targets: Sequence[Target]) -> dict[str, list[dict[str, Any]]]:
    """{job: file_sd target groups}, one group per host, sorted by host."""
    out: dict[str, list[dict[str, Any]]] = {job: [] for job in JOBS}
    for t in sorted(targets, key=lambda t: t.host):
        exporters = t.config.exporters
        if not t.config.stage_enabled("exporters"):
            continue
        labels = {"host": t.host, "group": ",".join(g for g in t.groups if g != "all"),
                  "gpu_model": t.target.gpu_model, "cluster": t.target.cluster}
        # an exporter with a certificate is scraped over HTTPS (Prometheus' __scheme__ target label)
        if exporters.gpu != "none":
            out["gpu"].append({"targets": [f"{t.address}:{exporters.port(exporters.gpu_listen)}"],
                               "labels": {**labels, **({"__scheme__": "https"} if exporters.gpu_tls
                                                       or exporters.tls_fleet_ca else {})}})
        if exporters.node:
            out["node"].append({"targets": [f"{t.address}:{exporters.port(exporters.node_listen)}"],
                                "labels": {**labels, **({"__scheme__": "https"} if exporters.node_tls
                                                        or exporters.tls_fleet_ca else {})}})
    return out


def file_sd_text(groups: list[dict[str, Any]]) -> str:
    return json.dumps(groups, indent=2, sort_keys=True) + "\n"


def expected_gpus(targets: Sequence[Target]) -> dict[str, int]:
    return {t.host: t.config.exporters.gpu_count for t in targets if t.config.exporters.gpu_count}


def client_address(listen: str) -> str:
    """Where a client on the same host reaches a service listening on ``listen`` (``0.0.0.0``/``[::]``: localhost)."""
    address, port = listen.rsplit(":", 1)
    return f"localhost:{port}" if address in ("0.0.0.0", "[::]", "") else listen


def basic_auth(account: str) -> dict[str, str]:
    """Prometheus' ``basic_auth`` with the password read from its file (never inline in prometheus.yml)."""
    return {"username": USER, "password_file": PASSWORD_FILES[account]}


def prometheus_config(settings: MonitoringSettings, alertmanager: str | None = None) -> str:
    """prometheus.yml: scrapes every exporter and itself, sends alerts to Alertmanager, each with its account's
    basic auth. ``alertmanager``: HOST:PORT (default: where this host's Alertmanager listens)."""
    # scrape timeout: at most 10 s, never longer than the interval (Prometheus refuses that)
    timeout = settings.scrape_interval if seconds(settings.scrape_interval) <= 10 else "10s"
    alertmanager = alertmanager or client_address(settings.alertmanager_listen)
    # HTTPS: the certificates are checked against tls_ca_file (else the system's CAs)
    tls = {"tls_config": {"ca_file": settings.tls_ca_file}} if settings.tls_ca_file else {}

    def https(on: Mapping) -> dict:
        return {"scheme": "https", **tls} if on else {}

    config = {
        "global": {"scrape_interval": settings.scrape_interval, "scrape_timeout": timeout,
                   "evaluation_interval": settings.evaluation_interval},
        "rule_files": [f"{RULES_DIR}/*.rules.yml"],
        "alerting": {"alertmanagers": [{"basic_auth": basic_auth("alertmanager"), **https(settings.alertmanager_tls),
                                        "static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [
            {"job_name": "prometheus", "basic_auth": basic_auth("prometheus"), **https(settings.prometheus_tls),
             "static_configs": [{"targets": [client_address(settings.prometheus_listen)]}]},
            *({"job_name": job, "basic_auth": basic_auth("exporters"), **tls,
               "file_sd_configs": [{"files": [f"{FILE_SD_DIR}/gpufleet-{job}.json"]}]}
              for job in JOBS),
        ],
    }
    return _dump(config)


def _receiver(r: Mapping[str, Any]) -> dict[str, Any]:
    if r["type"] == "webhook":
        return {"name": r["name"], "webhook_configs": [{"url": r["url"], "send_resolved": True}]}
    if r["type"] == "email":
        return {"name": r["name"], "email_configs": [{"to": r["to"], "from": r["from"], "smarthost": r["smarthost"],
                                                      "send_resolved": True}]}
    slack = {"api_url": r["api_url"], "send_resolved": True}
    if r.get("channel"):
        slack["channel"] = r["channel"]
    return {"name": r["name"], "slack_configs": [slack]}


def matcher(label: str, value: str) -> str:
    """One equality matcher as Alertmanager parses it (prometheus/alertmanager ``pkg/labels/parse.go``
    ``ParseMatcher``): the value in double quotes with ``\\``, ``"`` and a line feed escaped (``\\\\``, ``\\"``,
    ``\\n``), so that no value can close the quotes and add matchers (``a",host=~".+``). ``label`` is a label name
    (validated by :mod:`gpufleet.monitoring.config`)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'{label}="{escaped}"'


def alertmanager_config(settings: MonitoringSettings) -> str:
    """Routes and receivers from data; NodeDown (no exporter of the host answers) inhibits the host's other alerts."""
    receivers = [_receiver(r) for r in settings.receivers] or [{"name": "null"}]
    route: dict[str, Any] = {
        "receiver": receivers[0]["name"],
        "group_by": ["alertname", "host"],
        "group_wait": settings.group_wait,
        "group_interval": "5m" if seconds(settings.group_wait) >= 30 else settings.group_wait,
        "repeat_interval": "4h",
    }
    if settings.routes:
        route["routes"] = [{"receiver": r["receiver"],
                            "matchers": [matcher(k, v) for k, v in sorted(r["matchers"].items())]}
                           for r in settings.routes]
    config = {
        "route": route,
        "receivers": receivers,
        "inhibit_rules": [{"source_matchers": [f'alertname="{HOST_DOWN_ALERT}"'],
                           "target_matchers": [f'alertname!="{HOST_DOWN_ALERT}"'], "equal": ["host"]}],
    }
    return _dump(config)


def _dump_yaml_as_json(data: Any) -> str:
    # JSON is YAML (1.2): Grafana reads it as the YAML it expects, and a reader without a YAML library can too
    return ("# Managed by gpufleet (deploys/monitoring.py), generated from the inventory.\n"
            + json.dumps(data, indent=2, sort_keys=False) + "\n")


def grafana_datasource(prometheus_url: str, password: str | None = None, ca_cert: str | None = None) -> str:
    """Grafana's provisioned Prometheus datasource; with ``password``, basic auth as gpufleet's ``prometheus``
    account (the file then holds a secret: written 0640 root:grafana)."""
    source: dict[str, Any] = {
        "name": "gpufleet-prometheus", "uid": "gpufleet-prometheus", "type": "prometheus", "access": "proxy",
        "url": prometheus_url, "isDefault": True, "editable": False}
    if password is not None:
        source.update(basicAuth=True, basicAuthUser=USER, secureJsonData={"basicAuthPassword": password})
    if ca_cert is not None:  # Prometheus' certificate is checked against this CA (the fleet CA's)
        source["jsonData"] = {"tlsAuthWithCACert": True}
        source.setdefault("secureJsonData", {})["tlsCACert"] = ca_cert
    return _dump_yaml_as_json({"apiVersion": 1, "datasources": [source]})


def grafana_dashboard_provider() -> str:
    return _dump_yaml_as_json({"apiVersion": 1, "providers": [{
        "name": "gpufleet", "folder": "gpufleet", "type": "file", "disableDeletion": True,
        "allowUiUpdates": False, "options": {"path": GRAFANA_DASHBOARD_DIR}}]})


def dashboard(name: str) -> str:
    return resources.files("gpufleet.monitoring").joinpath("dashboards", name).read_text(encoding="utf-8")


def panel_queries(text: str) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of a dashboard JSON."""
    data = json.loads(text)
    out = []
    for panel in data.get("panels", []):
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out


def grafana_apt_source(repo_url: str, keyring: str) -> str:
    """The one-line apt source of Grafana's repository (``URL SUITE COMPONENT``, validated as one line of words), as
    Grafana's installation instructions write it: signed by ``keyring`` only."""
    return f"deb [signed-by={keyring}] {repo_url}\n"
