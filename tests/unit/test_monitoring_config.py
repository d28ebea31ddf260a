"""Monitoring settings validation, the rendered Prometheus / Alertmanager / Grafana files (checked with promtool
and amtool), scrape targets from the inventory, the dashboards' queries and the choice of GPU exporter."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess

import pytest
import yaml

from gpufleet.catalog import load_catalog
from gpufleet.config import load_node_config
from gpufleet.monitoring import render, rules
from gpufleet.monitoring.config import (
    MonitoringSettings,
    TargetSettings,
    check_monitoring_host,
    load_monitoring_settings,
    seconds,
)
from gpufleet.operations import exporters
from gpufleet.plan import choose_gpu_exporter

OK = {"gpufleet_monitoring_grafana_admin_password": "a-long-enough-secret"}


def messages(data, host="mon1"):
    settings, _target, errors = load_monitoring_settings(host, data)
    if settings is not None:
        errors = check_monitoring_host(host, settings, data)
    return [str(e) for e in errors]


def test_defaults_need_a_grafana_password():
    assert messages({}) == [
        "mon1: gpufleet_monitoring_grafana_admin_password=None: Grafana is enabled but has no admin password "
        "(gpufleet never deploys Grafana's default admin/admin); allowed: a password of at least 12 characters "
        "that is not a default one, or gpufleet_monitoring_grafana: false"]
    assert messages(OK) == []
    assert messages({"gpufleet_monitoring_grafana": False}) == []


@pytest.mark.parametrize(("data", "expected"), [
    ({"gpufleet_monitoring_grafana_admin_password": "admin"},
     "mon1: gpufleet_monitoring_grafana_admin_password='***': too short or a default password"),
    ({**OK, "gpufleet_monitoring_scrape_interval": "2 seconds"},
     "mon1: gpufleet_monitoring_scrape_interval='2 seconds': not a Prometheus duration"),
    ({**OK, "gpufleet_monitoring_scrape_interval": "2h"},
     "mon1: gpufleet_monitoring_scrape_interval='2h': duration out of range"),
    ({**OK, "gpufleet_monitoring_receivers": [{"name": "p", "type": "pagerduty"}]},
     "mon1: gpufleet_monitoring_receivers[0].type='pagerduty': unknown receiver type; allowed: webhook, email, "
     "slack"),
    ({**OK, "gpufleet_monitoring_receivers": [{"name": "m", "type": "email", "to": "ops@example.com"}]},
     "mon1: gpufleet_monitoring_receivers[0].from=None: missing or not a string (email receivers need it)"),
    ({**OK, "gpufleet_monitoring_receivers": [{"name": "w", "type": "webhook", "url": "ftp://x"}]},
     "mon1: gpufleet_monitoring_receivers[0].url='ftp://x/***': not a URL"),
    ({**OK, "gpufleet_monitoring_routes": [{"receiver": "nobody"}]},
     "mon1: gpufleet_monitoring_routes[0]={'receiver': 'nobody'}: not a route to a defined receiver"),
    ({**OK, "gpufleet_monitoring_alert_for": {"GpuOverheat": "1m"}},
     "mon1: gpufleet_monitoring_alert_for['GpuOverheat']='1m': unknown alert"),
    ({**OK, "gpufleet_monitoring_grafana_listen": "0.0.0.0:9093"},
     "mon1: gpufleet_monitoring_grafana_listen='0.0.0.0:9093': port clash with gpufleet_monitoring_alertmanager_"
     "listen"),
    ({**OK, "gpufleet_monitoring_scrape_intervall": "15s"},
     "mon1: gpufleet_monitoring_scrape_intervall='15s': unknown gpufleet monitoring setting"),
    ({**OK, "gpufleet_monitoring_gpu_model": "h101"}, "mon1: gpufleet_monitoring_gpu_model='h101': unknown GPU model"),
    ({**OK, "gpufleet_monitoring_retention": "15d"},
     "mon1: gpufleet_monitoring_retention='15d': Prometheus would drop data that BenchmarkRegression reads ([30d]: "
     "30d back); allowed: a Prometheus duration of at least 30d"),
    ({**OK, "gpufleet_monitoring_retention": "a month"},
     "mon1: gpufleet_monitoring_retention='a month': not a Prometheus duration"),
    ({**OK, "gpufleet_monitoring_grafana": "yes"},
     "mon1: gpufleet_monitoring_grafana='yes': not a boolean; allowed: true or false"),
    ({**OK, "gpufleet_monitoring_tls_fleet_ca": 1},
     "mon1: gpufleet_monitoring_tls_fleet_ca=1: not a boolean; allowed: true or false"),
])
def test_bad_settings_name_host_key_and_value(data, expected):
    found = messages(data)
    assert any(m.startswith(expected) for m in found), found


ALICE_HASH = "$2b$04$" + "a" * 53  # the shape of a bcrypt hash; its password is not wanted here


@pytest.mark.parametrize(("users", "expected"), [
    ({"gpufleet": ALICE_HASH}, "{'gpufleet': '<hash>'}: user 'gpufleet': gpufleet's own account"),
    ({"al:ice": ALICE_HASH}, "{'al:ice': '<hash>'}: user 'al:ice': not a user name of letters, digits"),
    ({"alice": "s3cret-in-clear"}, "{'alice': '<hash>'}: user 'alice': its value is not a bcrypt hash"),
    ({"alice": "$2b$03$" + "a" * 53}, "{'alice': '<hash>'}: user 'alice': its value is not a bcrypt hash"),
    (["alice"], "['alice']: not a mapping of user name to bcrypt hash"),
])
def test_peoples_accounts_are_refused_naming_the_user_never_the_value(users, expected):
    for key in ("gpufleet_monitoring_prometheus_basic_auth_users", "gpufleet_monitoring_alertmanager_basic_auth_users"):
        found = messages({**OK, key: users})
        assert any(m.startswith(f"mon1: {key}={expected}") and "; allowed: {user: bcrypt hash}" in m
                   for m in found), found
        assert not any("s3cret-in-clear" in m or "a" * 53 in m for m in found), found


def test_peoples_accounts_join_gpufleets_in_the_web_configuration_and_log_in():
    import bcrypt

    from gpufleet import web_auth
    from gpufleet.deploys import monitoring as monitoring_deploy
    from gpufleet.exporter import web

    hashed = bcrypt.hashpw(b"alice-password", bcrypt.gensalt(4)).decode()
    settings, _, errors = load_monitoring_settings("mon1", {
        **OK, "gpufleet_monitoring_prometheus_basic_auth_users": {"alice": hashed}})
    assert errors == [] and settings.prometheus_users == {"alice": hashed} and settings.alertmanager_users == {}
    text = monitoring_deploy._web_config("generated-password", {}, dict(settings.prometheus_users))
    users = yaml.safe_load(text)["basic_auth_users"]
    assert users == {"alice": hashed, web_auth.USER: web_auth.bcrypt_hash("generated-password", web_auth.USER)}
    config = web.WebConfig(None)  # the users as exporter-toolkit checks them (gpufleet/exporter/web.py)
    config.users = users

    def basic(user, password):
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    assert config.authorized(basic("alice", "alice-password"))
    assert config.authorized(basic(web_auth.USER, "generated-password"))
    assert not config.authorized(basic("alice", "generated-password"))


def test_retention_default_covers_every_rule_and_is_a_setting():
    settings, _target, errors = load_monitoring_settings("mon1", OK)
    assert errors == [] and settings.retention == "35d"
    assert seconds(settings.retention) >= rules.longest_lookback(rules.recording_rules(), rules.alert_rules())[0]
    assert messages({**OK, "gpufleet_monitoring_retention": "30d"}) == []
    assert load_monitoring_settings("mon1", {**OK, "gpufleet_monitoring_retention": "90d"})[0].retention == "90d"


def settings(**values) -> MonitoringSettings:
    return MonitoringSettings(grafana=False, **values)


def node_target(name, data=None, groups=("hgx",)):
    config = load_node_config(name, data or {})
    return render.Target(host=name, address=f"10.0.0.{len(name)}", groups=("all", *groups), config=config,
                         target=TargetSettings(cluster="c1", gpu_model="h100-sxm"))


def test_scrape_targets_from_the_inventory():
    targets = [node_target("gpu-b", {"gpufleet_exporters_gpu_listen": "0.0.0.0:9401"}),
               node_target("gpu-a", {"gpufleet_exporters_node": False}),
               node_target("gpu-c", {"gpufleet_stages": ["driver"]})]
    assert render.scrape_targets(targets) == {
        "gpu": [{"targets": ["10.0.0.5:9400"], "labels": {"host": "gpu-a", "group": "hgx", "gpu_model": "h100-sxm",
                                                           "cluster": "c1"}},
                {"targets": ["10.0.0.5:9401"], "labels": {"host": "gpu-b", "group": "hgx", "gpu_model": "h100-sxm",
                                                           "cluster": "c1"}}],
        "node": [{"targets": ["10.0.0.5:9100"], "labels": {"host": "gpu-b", "group": "hgx", "gpu_model": "h100-sxm",
                                                            "cluster": "c1"}}],
    }
    assert render.expected_gpus([node_target("gpu-a", {"gpufleet_exporters_gpu_count": 8}), node_target("x")]) == {
        "gpu-a": 8}


def tool(name):
    path = shutil.which(name)
    assert path, f"{name} not found: make deps installs Debian's prometheus and prometheus-alertmanager"
    return path


def test_prometheus_config_passes_promtool(tmp_path):
    text = render.prometheus_config(settings(scrape_interval="30s", evaluation_interval="20s"), "localhost:9093")
    data = yaml.safe_load(text)
    assert data["global"] == {"scrape_interval": "30s", "scrape_timeout": "10s", "evaluation_interval": "20s"}
    assert [c["job_name"] for c in data["scrape_configs"]] == ["prometheus", "gpu", "node"]
    path = tmp_path / "prometheus.yml"
    path.write_text(text.replace(render.PROMETHEUS_DIR, str(tmp_path)))
    result = subprocess.run([tool("promtool"), "check", "config", str(path)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alertmanager_config_passes_amtool_and_only_a_down_host_inhibits(tmp_path):
    s = settings(receivers=(
        {"name": "hook", "type": "webhook", "url": "http://hooks.example.com/x"},
        {"name": "mail", "type": "email", "to": "ops@example.com", "from": "am@example.com",
         "smarthost": "smtp.example.com:25"},
        {"name": "chat", "type": "slack", "api_url": "https://hooks.slack.com/services/X", "channel": "#gpu"}),
        routes=({"receiver": "chat", "matchers": {"severity": "critical"}},))
    text = render.alertmanager_config(s)
    data = yaml.safe_load(text)
    assert data["route"]["receiver"] == "hook"
    assert data["route"]["routes"] == [{"receiver": "chat", "matchers": ['severity="critical"']}]
    # NodeDown (no exporter of the host answers) inhibits the host's other alerts; an exporter down alone
    # (NodeExporterDown, GpuExporterDown) inhibits nothing
    assert data["inhibit_rules"] == [{"source_matchers": ['alertname="NodeDown"'],
                                      "target_matchers": ['alertname!="NodeDown"'], "equal": ["host"]}]
    assert "up{job=~\"node|gpu\"}" in next(r["expr"] for r in rules.alert_rules()["groups"][0]["rules"]
                                           if r["alert"] == "NodeDown")
    assert set(render.JOBS) == {"node", "gpu"}
    path = tmp_path / "alertmanager.yml"
    path.write_text(text)
    result = subprocess.run([tool("amtool"), "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_provisioning_files():
    datasource = yaml.safe_load(render.grafana_datasource("http://localhost:9090"))
    assert datasource["datasources"][0] | {} == {
        "name": "gpufleet-prometheus", "uid": "gpufleet-prometheus", "type": "prometheus", "access": "proxy",
        "url": "http://localhost:9090", "isDefault": True, "editable": False}
    provider = yaml.safe_load(render.grafana_dashboard_provider())
    assert provider["providers"][0]["options"]["path"] == render.GRAFANA_DASHBOARD_DIR


def test_dashboards_use_the_provisioned_datasource_and_known_metrics():
    from gpufleet.report.prometheus import _HELP as verify_metrics
    known = {f for f, _t, _h in (*exporters.HEALTH_COUNTERS, *exporters.PROFILING_COUNTERS)} | set(verify_metrics)
    known |= {r["record"] for g in rules.recording_rules()["groups"] for r in g["rules"]} | {"up"}
    titles = {}
    for name in render.DASHBOARDS:
        data = json.loads(render.dashboard(name))
        titles[name] = data["title"]
        # importable into any Grafana: every panel, query and variable takes the $datasource variable's choice
        assert "gpufleet-prometheus" not in render.dashboard(name)
        variables = {v["name"]: v for v in data["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        assert {"host", "gpu"} <= set(variables)
        for v in variables.values():
            assert v["name"] == "datasource" or v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for panel in data["panels"]:
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
                # per-GPU series follow the GPU selector
                for selector in re.findall(r"(?:DCGM_FI_\w+|gpufleet_bench_\w+)\{([^}]*)\}", target["expr"]):
                    assert 'gpu=~"$gpu"' in selector, (panel["title"], target["expr"])
        for _title, expr in render.panel_queries(render.dashboard(name)):
            names = {tok for tok in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*(?=\{|\[|\s|\)|$)", expr)
                     if tok.startswith(("DCGM_", "gpufleet", "host:", "cluster:", "up"))}
            assert names <= known, (name, expr, names - known)
    assert titles == {"gpu-fleet-health.json": "GPU fleet health", "training.json": "Training"}


def test_auto_gpu_exporter_choice():
    catalog = load_catalog()
    h100, rtx = catalog.get("h100-sxm"), catalog.get("rtx4090")
    assert choose_gpu_exporter("auto", [h100] * 8, dcgm_offered=True)[0] == "dcgm"
    assert choose_gpu_exporter("auto", [rtx], dcgm_offered=True)[0] == "nvml"
    assert choose_gpu_exporter("auto", [], dcgm_offered=True)[0] == "nvml"
    assert choose_gpu_exporter("dcgm", [rtx], dcgm_offered=False)[0] == "dcgm"
    # datacenter GPUs without a dcgm-exporter for the host (Debian 13: NVIDIA publishes none): the NVML exporter,
    # saying why
    why = "the NVIDIA repository http://repo/debian13/x86_64/ has no datacenter-gpu-manager-exporter"
    assert choose_gpu_exporter("auto", [h100] * 8, dcgm_offered=False, why_not_offered=why) == (
        "nvml", f"auto: no dcgm-exporter for this host ({why}): the NVML exporter")


def _example_monitoring_data(monkeypatch, password: str | None) -> dict:
    import runpy
    from pathlib import Path

    if password is None:
        monkeypatch.delenv("GPUFLEET_GRAFANA_ADMIN_PASSWORD", raising=False)
    else:
        monkeypatch.setenv("GPUFLEET_GRAFANA_ADMIN_PASSWORD", password)
    path = Path(__file__).resolve().parents[2] / "inventories" / "group_data" / "monitoring.py"
    return {k: v for k, v in runpy.run_path(str(path)).items() if k.startswith("gpufleet_")}


def test_example_group_data_takes_the_grafana_password_from_the_environment(monkeypatch):
    settings, _, errors = load_monitoring_settings("monitor-01", _example_monitoring_data(
        monkeypatch, "a-long-secret-from-the-vault"))
    assert errors == [] and settings is not None
    assert settings.grafana_admin_password == "a-long-secret-from-the-vault"
    assert messages(_example_monitoring_data(monkeypatch, None)) == [
        "mon1: gpufleet_monitoring_grafana_admin_password=None: Grafana is enabled but has no admin password "
        "(gpufleet never deploys Grafana's default admin/admin); allowed: a password of at least 12 characters "
        "that is not a default one, or gpufleet_monitoring_grafana: false"]


def test_alertmanager_config_group_is_the_debian_packages_service_group():
    from gpufleet.deploys.monitoring import ALERTMANAGER_GROUP
    from tests import upstream

    package = "debian/bookworm/prometheus-alertmanager"
    unit = f"{package}/lib/systemd/system/prometheus-alertmanager.service"
    assert upstream.unit_values(unit, "Service", "User") == [ALERTMANAGER_GROUP]
    assert f"--group --gecos \"Prometheus daemon\" {ALERTMANAGER_GROUP}" in upstream.read(f"{package}/DEBIAN/postinst")
