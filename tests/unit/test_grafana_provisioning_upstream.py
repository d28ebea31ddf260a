"""Grafana's provisioning files as the monitoring deploy writes them, held to what Grafana's source parses (recorded in
tests/reference/upstream/grafana/facts.json, read through ``upstream.grafana_provisioning()``): the yaml keys of
pkg/services/provisioning/{datasources,dashboards}/types.go at apiVersion 1 (go-yaml drops any other key without a
word, so a misspelt key is a setting Grafana silently never sees), a file provider's options, the Prometheus plugin's
id, the jsonData/secureJsonData keys the plugin SDK builds a datasource's HTTP client from, the directories and file
suffixes Grafana reads, and the interpolation of ``$`` in values. The simulated Grafana
(gpufleet/sim/grafana/standin.py) is held to the same facts: it reads only keys Grafana parses, from the directories
Grafana reads.

Not established from upstream here: the deb's provisioning directory /etc/grafana/provisioning itself (the current
/etc/default/grafana-server that sets PROVISIONING_CFG_DIR could not be obtained;
tests/unit/test_sim_grafana_upstream.py checks what the recorded files fix about it)."""

from __future__ import annotations

import ast
import inspect
from pathlib import PurePosixPath

import pytest
import yaml

from gpufleet import fleet_ca
from gpufleet.deploys import monitoring
from gpufleet.monitoring import render
from gpufleet.monitoring.config import MonitoringSettings
from gpufleet.sim.grafana import standin
from gpufleet.web_auth import USER
from tests import upstream

GRAFANA = upstream.grafana_provisioning()
SETTINGS = {
    "basic auth": MonitoringSettings(),
    # Prometheus on the fleet CA's certificate: the datasource carries the CA (deploys/monitoring.py with_fleet_ca)
    "basic auth and the fleet CA": monitoring.with_fleet_ca(MonitoringSettings(tls_fleet_ca=True), []),
}


@pytest.fixture(autouse=True)
def credentials(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_CREDENTIALS_DIR", str(tmp_path / "credentials"))


def rendered(settings: MonitoringSettings) -> dict[str, dict]:
    """{path on the host: parsed file} of the provisioning files, exactly as the deploy renders them."""
    return {path: yaml.safe_load(text) for path, text in monitoring.grafana_provisioning(settings).items()}


def unparsed_keys(document: dict, kind: str) -> list[str]:
    """The keys of a provisioning document (``kind``: datasources or dashboards) that Grafana does not parse, as
    dotted paths; empty when Grafana reads every key written."""
    problems = []

    def check(mapping, allowed, where):
        problems.extend(f"{where}{key}" for key in mapping if key not in allowed)

    if kind == "datasources":
        check(document, GRAFANA["datasource_file_keys"], "")
        for i, entry in enumerate(document.get("datasources") or []):
            check(entry, GRAFANA["datasource_keys"], f"datasources[{i}].")
            check(entry.get("jsonData") or {}, GRAFANA["json_data_keys"], f"datasources[{i}].jsonData.")
            check(entry.get("secureJsonData") or {}, GRAFANA["secure_json_data_keys"],
                  f"datasources[{i}].secureJsonData.")
    else:
        check(document, GRAFANA["provider_file_keys"], "")
        for i, provider in enumerate(document.get("providers") or []):
            check(provider, GRAFANA["provider_keys"], f"providers[{i}].")
            check(provider.get("options") or {}, GRAFANA["provider_option_keys"], f"providers[{i}].options.")
    return problems


def _strings(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value


def test_the_files_lie_where_grafana_reads_them():
    files = rendered(MonitoringSettings())
    assert set(files) == {monitoring.GRAFANA_DATASOURCE, monitoring.GRAFANA_DASHBOARD_PROVIDER}
    for path in files:
        path = PurePosixPath(path)
        assert str(path.parent.parent) == monitoring.GRAFANA_PROVISIONING
        assert path.suffix in GRAFANA["suffixes"], path
    # provisioning.go: datasources from <provisioning>/datasources, dashboard providers from <provisioning>/dashboards
    assert PurePosixPath(monitoring.GRAFANA_DATASOURCE).parent.name == "datasources"
    assert PurePosixPath(monitoring.GRAFANA_DASHBOARD_PROVIDER).parent.name == "dashboards"
    assert {"datasources", "dashboards"} <= GRAFANA["subdirectories"]


@pytest.mark.parametrize("case", SETTINGS)
def test_every_datasource_key_written_is_one_grafana_parses(case):
    document = rendered(SETTINGS[case])[monitoring.GRAFANA_DATASOURCE]
    assert unparsed_keys(document, "datasources") == []
    # apiVersion > 0: read as configsV1, whose keys are the ones checked
    assert isinstance(document[GRAFANA["api_version_key"]], int) and document[GRAFANA["api_version_key"]] > 0
    (source,) = document["datasources"]
    assert source["type"] == GRAFANA["prometheus_type"]
    assert source["access"] == GRAFANA["default_access"]
    # basic auth: the SDK sends basicAuthUser and secureJsonData.basicAuthPassword only with basicAuth on
    assert source["basicAuth"] is True and source["basicAuthUser"] == USER
    assert source["secureJsonData"][GRAFANA["basic_auth_password_key"]]
    # values are interpolated ($VAR); nothing gpufleet writes may be expanded ('$$' would be a literal '$')
    assert [s for s in _strings(document) if "$" in s] == []


def test_the_fleet_ca_is_sent_where_grafana_reads_it():
    (source,) = rendered(SETTINGS["basic auth and the fleet CA"])[monitoring.GRAFANA_DATASOURCE]["datasources"]
    assert source["url"].startswith("https://")
    assert source["secureJsonData"]["tlsCACert"] == fleet_ca.ca()[0]
    # the SDK reads tlsCACert only when one of these jsonData switches is true
    assert any(source["jsonData"].get(switch) is True for switch in GRAFANA["tls_ca_cert_only_with"])
    (plain,) = rendered(SETTINGS["basic auth"])[monitoring.GRAFANA_DATASOURCE]["datasources"]
    assert "tlsCACert" not in plain["secureJsonData"] and "jsonData" not in plain


def test_every_dashboard_provider_key_written_is_one_grafana_parses():
    document = rendered(MonitoringSettings())[monitoring.GRAFANA_DASHBOARD_PROVIDER]
    assert unparsed_keys(document, "dashboards") == []
    assert isinstance(document[GRAFANA["api_version_key"]], int) and document[GRAFANA["api_version_key"]] > 0
    (provider,) = document["providers"]
    assert provider["type"] == GRAFANA["default_provider_type"]
    assert provider["options"] == {"path": render.GRAFANA_DASHBOARD_DIR}
    assert [s for s in _strings(document) if "$" in s] == []


@pytest.mark.parametrize("kind, path, misspelt, reported", [
    ("datasources", ["datasources", 0, "basicAuthUser"], "basicAuthUsername", "datasources[0].basicAuthUsername"),
    ("datasources", ["datasources", 0, "secureJsonData", "tlsCACert"], "tlsCaCert",
     "datasources[0].secureJsonData.tlsCaCert"),
    ("datasources", ["datasources", 0, "jsonData", "tlsAuthWithCACert"], "tlsAuthWithCaCert",
     "datasources[0].jsonData.tlsAuthWithCaCert"),
    ("datasources", ["apiVersion"], "api_version", "api_version"),
    ("dashboards", ["providers", 0, "allowUiUpdates"], "allowUIUpdates", "providers[0].allowUIUpdates"),
    ("dashboards", ["providers", 0, "options", "path"], "paths", "providers[0].options.paths"),
])
def test_a_key_grafana_does_not_parse_is_caught(kind, path, misspelt, reported):
    files = rendered(SETTINGS["basic auth and the fleet CA"])
    document = files[monitoring.GRAFANA_DATASOURCE if kind == "datasources" else monitoring.GRAFANA_DASHBOARD_PROVIDER]
    *parents, key = path
    mapping = document
    for step in parents:
        mapping = mapping[step]
    mapping[misspelt] = mapping.pop(key)
    assert unparsed_keys(document, kind) == [reported]


# --- the stand-in reads Grafana's keys, from Grafana's directories

def _reads(function) -> list[tuple[str, str]]:
    """(receiver, key) of every string-keyed read (``x["k"]``, ``x.get("k")``) in a function's source."""
    reads = []
    for node in ast.walk(ast.parse(inspect.getsource(function).lstrip())):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(
                node.slice.value, str):
            reads.append((ast.unparse(node.value), node.slice.value))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            reads.append((ast.unparse(node.func.value), node.args[0].value))
    return reads


def test_the_stand_in_reads_only_keys_grafana_parses():
    allowed = {
        # a provisioning file, datasources or dashboards
        "_read_yaml_json(path)": GRAFANA["datasource_file_keys"] | GRAFANA["provider_file_keys"],
        "provider": GRAFANA["provider_keys"],
        "provider['options']": GRAFANA["provider_option_keys"],
        "entry": GRAFANA["datasource_keys"],
    }
    # reads of the config (cfg) and of a dashboard's own JSON (data) are not provisioning-file keys
    not_provisioning = {"cfg", "cfg['paths']", "data"}
    reads = _reads(standin.provisioned) + _reads(standin.datasource_answer)
    assert {receiver for receiver, _ in reads} - not_provisioning == set(allowed)
    assert [(r, k) for r, k in reads if r not in not_provisioning and k not in allowed[r]] == []


def test_the_stand_in_reads_the_deploys_files_from_grafanas_directories(tmp_path):
    files = monitoring.grafana_provisioning(SETTINGS["basic auth and the fleet CA"])
    root = tmp_path / "provisioning"
    dashboards = tmp_path / "dashboards"
    dashboards.mkdir()
    (dashboards / "one.json").write_text('{"uid": "one", "title": "One", "panels": []}')
    for path, text in files.items():
        path = PurePosixPath(path)
        target = root / path.parent.name / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text.replace(render.GRAFANA_DASHBOARD_DIR, str(dashboards)))
    # a file without one of Grafana's suffixes is not read (by Grafana, nor by the stand-in)
    assert ".json" not in GRAFANA["suffixes"]
    (root / "datasources" / "ignored.json").write_text('{"apiVersion": 1, "datasources": [{"name": "x"}]}')
    datasources, found = standin.provisioned({"paths": {"provisioning": str(root)}})
    assert [d["name"] for d in datasources] == ["gpufleet-prometheus"]
    assert standin.datasource_answer(1, datasources[0]) == {
        "id": 1, "uid": "gpufleet-prometheus", "name": "gpufleet-prometheus", "type": GRAFANA["prometheus_type"],
        "url": "https://localhost:9090", "access": GRAFANA["default_access"], "isDefault": True, "readOnly": True}
    assert [(d["uid"], d["folderTitle"]) for d in found] == [("one", "gpufleet")]
