"""The shipped Prometheus rules: rendered from data, valid for promtool, and unit-tested by promtool with a firing
and a non-firing case for every alert (monitoring/tests/*.test.yml)."""

from __future__ import annotations

import ast
import copy
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufleet.catalog import load_catalog
from gpufleet.monitoring import rules
from gpufleet.verify import evaluate
from gpufleet.verify.thresholds import Thresholds, default_thresholds
from tests import upstream

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "monitoring" / "rules"
TEST_FILE = ROOT / "monitoring" / "tests" / "gpufleet-alerts.test.yml"
TEST_FILES = sorted((ROOT / "monitoring" / "tests").glob("*.test.yml"))  # + the long-horizon alerts, hourly


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool not found: install Debian's 'prometheus' package (make deps does)"
    return path


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_shipped_rule_files_are_the_rendered_data(tmp_path):
    written = rules.write_default_files(tmp_path)
    for path in written:
        assert (RULES_DIR / path.name).read_text() == path.read_text(), (
            f"monitoring/rules/{path.name} is stale: run python -m gpufleet.monitoring.rules")


def test_promtool_check_rules_accepts_the_shipped_files():
    result = run_promtool("check", "rules", *sorted(str(p) for p in RULES_DIR.glob("*.yml")))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_test_rules_passes():
    result = run_promtool("test", "rules", *(p.name for p in TEST_FILES), cwd=TEST_FILE.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(TEST_FILES) >= 2


def test_promtool_test_rules_fails_when_a_threshold_is_wrong(tmp_path):
    """The test file judges the rules: a wrong threshold makes it fail (the test can fail)."""
    shutil.copytree(RULES_DIR, tmp_path / "rules")
    (tmp_path / "tests").mkdir()
    shutil.copy(TEST_FILE, tmp_path / "tests")
    recording = tmp_path / "rules" / rules.RECORDING_FILE
    recording.write_text(recording.read_text().replace(
        "record: gpufleet:gpu_temp_warn_fallback_celsius\n    expr: vector(83)",
        "record: gpufleet:gpu_temp_warn_fallback_celsius\n    expr: vector(95)"))
    assert "vector(95)" in recording.read_text()
    result = run_promtool("test", "rules", TEST_FILE.name, cwd=tmp_path / "tests")
    assert result.returncode != 0
    assert "GpuTemperatureHigh" in result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_non_firing_case():
    tests = [case for path in TEST_FILES for case in yaml.safe_load(path.read_text())["tests"]]
    firing, quiet = set(), set()
    for case in tests:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = set(rules.alert_names())
    assert names - firing == set(), "alerts without a firing case"
    assert names - quiet == set(), "alerts without a non-firing case"


def test_every_alert_names_host_and_gpu_and_has_a_runbook_hint():
    for alert in rules.alert_rules()["groups"][0]["rules"]:
        text = alert["annotations"]["summary"] + alert["annotations"]["description"]
        assert "$labels.host" in text, alert["alert"]
        if alert["labels"]["scope"] == "gpu" and alert["alert"] not in ("GpuExporterDown", "GpuMissing"):
            assert "$labels.gpu" in text, alert["alert"]
        assert alert["annotations"]["runbook"], alert["alert"]
        assert alert["labels"]["severity"] in ("info", "warning", "critical")


def test_temperature_thresholds_come_from_catalog_and_thresholds_data():
    limits = rules.temperature_thresholds()
    catalog = load_catalog()
    assert set(limits) == {m.name for m in catalog}
    # RTX 2080 SUPER: slowdown 97 °C in the catalog; warn 5 °C below it (thresholds.json)
    rtx = limits[catalog.get("rtx2080-super").name]
    assert (rtx.warn_c, rtx.fail_c, rtx.source) == (92, 97, "catalog")
    # no slowdown temperature in the catalog: the thresholds file's fallbacks
    fallback = default_thresholds().for_model("h100-sxm")["temperature"]
    h100 = limits[catalog.get("h100-sxm").name]
    assert (h100.warn_c, h100.fail_c, h100.source) == (fallback["fallback_warn_c"], fallback["fallback_fail_c"],
                                                       "fallback")


VERIFY_FIXTURES = ROOT / "tests" / "fixtures" / "verify"


def _verify_temperature_verdicts(cases: list[tuple[str, float | None, float]]) -> list[str]:
    """verify's health.temperature verdict of each (GPU name, slowdown it reports, temperature), through
    ``evaluate`` on the H100 fixture's probe document (8 GPUs a document)."""
    verdicts = []
    for start in range(0, len(cases), 8):
        doc = json.loads((VERIFY_FIXTURES / "probe-h100-sxm-8.json").read_text())
        chunk = cases[start:start + 8]
        for gpu, (name, slowdown, temp) in zip(doc["gpus"], chunk, strict=False):
            gpu["name"] = name
            gpu["temperature"].update(gpu_c=temp, slowdown_c=slowdown, memory_c=None)
        by_index = {c.gpu_index: c.verdict for c in evaluate(doc) if c.check == "health.temperature"}
        verdicts += [by_index[i] for i in range(len(chunk))]
    return verdicts


def test_alerts_and_verify_decide_temperature_alike(tmp_path):
    """One decision: for GPUs that report their slowdown temperature and GPUs that do not (catalog model with and
    without a slowdown temperature, a model the catalog does not know), GpuTemperatureHigh fires exactly where
    verify warns or fails and GpuOverheating exactly where it fails."""
    names = [load_catalog().get("h100-sxm").name, load_catalog().get("rtx2080-super").name, "Future GPU"]
    cases = [(name, slowdown, temp) for name in names for slowdown in (None, 85, 92)
             for temp in (70, 79, 80, 82, 83, 84, 85, 86, 87, 89, 90, 91, 92, 95, 96, 97)]
    verdicts = _verify_temperature_verdicts(cases)
    assert {"pass", "warn", "fail"} <= set(verdicts)
    series, firing = [], {"GpuTemperatureHigh": [], "GpuOverheating": []}
    for i, ((name, slowdown, temp), verdict) in enumerate(zip(cases, verdicts, strict=True)):
        labels = {"job": "gpu", "host": f"h{i}", "gpu": "0", "UUID": f"GPU-{i}", "modelName": name}
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        series.append({"series": f"DCGM_FI_DEV_GPU_TEMP{{{text}}}", "values": f"{temp}x3"})
        if slowdown is not None:
            series.append({"series": f"DCGM_FI_DEV_SLOWDOWN_TEMP{{{text}}}", "values": f"{slowdown}x3"})
        expected = {**labels, "scope": "gpu"}
        if verdict in ("warn", "fail"):
            firing["GpuTemperatureHigh"].append({"exp_labels": {**expected, "severity": "warning"}})
        if verdict == "fail":
            firing["GpuOverheating"].append({"exp_labels": {**expected, "severity": "critical"}})
    alerts = rules.alert_rules({"GpuTemperatureHigh": "0s", "GpuOverheating": "0s"})
    for rule in alerts["groups"][0]["rules"]:
        rule.pop("annotations")  # judged here: which GPUs fire, not the texts
    (tmp_path / "recording.yml").write_text(rules.dump(rules.recording_rules(), "test"))
    (tmp_path / "alerts.yml").write_text(rules.dump(alerts, "test"))
    (tmp_path / "agree.test.yml").write_text(yaml.safe_dump({
        "rule_files": ["recording.yml", "alerts.yml"], "evaluation_interval": "1m",
        "group_eval_order": ["gpufleet-thresholds", "gpufleet-recording", "gpufleet-alerts"],
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": [
            {"eval_time": "2m", "alertname": name, "exp_alerts": expected} for name, expected in firing.items()]}],
    }, width=1000))
    result = run_promtool("test", "rules", "agree.test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_model_s_own_temperature_margin_reaches_the_rules(tmp_path):
    """A model whose thresholds override the warning margin is judged by it in the rules too."""
    data = copy.deepcopy(default_thresholds().data)
    data["models"]["h100-sxm"] = {**data["models"].get("h100-sxm", {}), "temperature": {"warn_below_slowdown_c": 10}}
    thresholds = Thresholds.from_dict(data)
    h100 = load_catalog().get("h100-sxm").name
    expr = next(r["expr"] for r in rules.recording_rules(thresholds)["groups"][1]["rules"]
                if r["record"] == "gpufleet:gpu_temp_warn_celsius")
    assert expr.startswith(f'max by (host, UUID) (DCGM_FI_DEV_SLOWDOWN_TEMP{{modelName="{h100}"}} - 10) or '
                           "max by (host, UUID) (DCGM_FI_DEV_SLOWDOWN_TEMP - 5) or ")
    assert thresholds.temperature_rule("h100-sxm").limits(92).warn_c == 82


def test_no_rule_reads_the_exporters_host_name_label():
    """dcgm-exporter labels Hostname (released) or hostname (its main, gpufleet's exporter): no rule may depend on
    either; hosts are the inventory's host label."""
    for rule_file in (rules.recording_rules(), rules.alert_rules()):
        for group in rule_file["groups"]:
            for rule in group["rules"]:
                assert "hostname" not in rule["expr"].lower(), rule


def test_monitoring_uses_no_private_name_of_another_package():
    """monitoring sits on top of verify: it may use verify's public names, never its private helpers."""
    offenders = []
    for path in (ROOT / "gpufleet" / "monitoring").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpufleet.") \
                    and not node.module.startswith("gpufleet.monitoring"):
                offenders += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert offenders == []


def test_longest_lookback_of_the_rules():
    assert rules.longest_lookback(rules.recording_rules(), rules.alert_rules()) == (30 * 86400, "BenchmarkRegression",
                                                                                    "[30d]")
    made_up = {"groups": [{"name": "g", "rules": [
        {"alert": "A", "expr": "rate(x[5m] offset 2d) > 0"}, {"record": "r", "expr": "max_over_time(y[1d:5m])"},
        {"alert": "B", "expr": "z offset 3d"}]}]}
    assert rules.longest_lookback(made_up) == (3 * 86400, "B", "offset 3d")
    assert rules.duration(30 * 86400) == "30d" and rules.duration(90) == "90s" and rules.duration(0.5) == "500ms"


def test_for_overrides_and_interval():
    group = rules.alert_rules({"GpuOverheating": "15s"}, interval="5s")["groups"][0]
    assert group["interval"] == "5s"
    by_name = {r["alert"]: r for r in group["rules"]}
    assert by_name["GpuOverheating"]["for"] == "15s"
    assert by_name["GpuTemperatureHigh"]["for"] == "2m"
    with pytest.raises(rules.RulesError, match=r"unknown alert\(s\) \['GpuOverheat'\]"):
        rules.alert_rules({"GpuOverheat": "1m"})


def test_inventory_rules_pass_promtool(tmp_path):
    path = tmp_path / rules.INVENTORY_FILE
    path.write_text(rules.dump(rules.inventory_rules({"gpu-b": 8, "gpu-a": 1}), source="test"))
    data = yaml.safe_load(path.read_text())
    assert data["groups"][0]["rules"] == [
        {"record": "gpufleet:gpus_expected:inventory", "expr": "vector(1)", "labels": {"host": "gpu-a"}},
        {"record": "gpufleet:gpus_expected:inventory", "expr": "vector(8)", "labels": {"host": "gpu-b"}},
    ]
    result = run_promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_docs_table_every_alert_with_its_severity_and_for():
    """docs/alerts.md: one row per alert of alerts.yml, with the same severity and `for`."""
    rows = {}
    for line in (ROOT / "docs" / "alerts.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`") and cells[0].strip("`") in rules.alert_names():
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    assert rows == {a["alert"]: (a["severity"], a["for"]) for a in rules.alert_definitions()}


def _test_series() -> list[str]:
    return [s["series"] for path in TEST_FILES for case in yaml.safe_load(path.read_text())["tests"]
            for s in case.get("input_series", [])]


def test_the_promtool_cases_use_dcgm_exporter_s_real_label_shape():
    """The rules' tests feed series shaped as the released dcgm-exporter emits them (tests/reference/upstream:
    `Hostname`, and err_code/err_msg on DCGM_FI_DEV_XID_ERRORS since 3.3.6-3.4.2) and as gpufleet's exporter
    emitted them before (lowercase hostname, no err_code): the rules must hold for both."""
    latest = upstream.dcgm_exporter_label_facts()
    assert latest["hostname_label"] == "Hostname" and latest["xid_err_labels"] == ["err_code", "err_msg"]
    xid_series = [s for s in _test_series() if s.startswith("DCGM_FI_DEV_XID_ERRORS{")]
    released = [s for s in xid_series if f'{latest["hostname_label"]}="' in s]
    assert released and all(all(f'{label}="' in s for label in latest["xid_err_labels"]) for s in released)
    assert [s for s in xid_series if 'hostname="' in s and "err_code" not in s]
    for name in ("GpuXidCritical", "GpuXidError", "GpuTemperatureHigh", "GpuOverheating",
                 "GpuRecoveryActionRequired"):
        labels = [c["exp_labels"] for path in TEST_FILES for case in yaml.safe_load(path.read_text())["tests"]
                  for check in case.get("alert_rule_test", []) if check["alertname"] == name
                  for c in check.get("exp_alerts", [])]
        assert any("Hostname" in x for x in labels) and any("hostname" in x for x in labels), name


def test_every_dcgm_field_the_rules_read_is_a_dcgm_field():
    """DCGM_FI_* names in the rules are DCGM's own (dcgm_fields.h of the DCGM release in tests/reference/upstream)."""
    fields = set(upstream.dcgm_field_ids())
    read = {name for rule_file in (rules.recording_rules(), rules.alert_rules()) for group in rule_file["groups"]
            for rule in group["rules"] for name in re.findall(r"\bDCGM_FI_[A-Z0-9_]+", rule["expr"])}
    assert {"DCGM_FI_DEV_SLOWDOWN_TEMP", "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION", "DCGM_FI_DEV_XID_ERRORS"} <= read
    assert read - fields == set()
