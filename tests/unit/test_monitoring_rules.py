"""The shipped Prometheus rules: rendered from data, valid for promtool, and unit-tested by promtool with a firing
and a non-firing case for every alert (monitoring/tests/*.test.yml)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufleet.catalog import load_catalog
from gpufleet.monitoring import rules
from gpufleet.verify.thresholds import default_thresholds

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
    # RTX 2080 SUPER: max operating 89 °C, slowdown 97 °C (catalog); slowdown - 5 = 92 -> warn at 89
    assert limits[catalog.get("rtx2080-super").name] == (89, 97)
    # no slowdown temperature in the catalog: the thresholds file's fallbacks
    fallback = default_thresholds().for_model("h100-sxm")["temperature"]
    assert limits[catalog.get("h100-sxm").name] == (fallback["fallback_warn_c"], fallback["fallback_fail_c"])


def test_critical_xids_are_the_thresholds_data():
    recording = rules.recording_rules()["groups"][1]["rules"]
    expr = next(r["expr"] for r in recording if r["record"] == "gpufleet:gpu_xid_critical")
    codes = {int(part.rsplit("==", 1)[1]) for part in expr.split(" or ")}
    assert codes == set(default_thresholds().data["xid"]["fail"])


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
