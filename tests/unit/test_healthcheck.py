"""gpufleet-healthcheck (gpufleet/healthcheck): verify's checks on recorded probe documents decide the drain reason;
the drain/resume rule keeps every drain that is not the health check's; the zip application runs alone."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet import config
from gpufleet import healthcheck_bundle as bundle
from gpufleet.healthcheck import node
from gpufleet.slurm import NodeStatus

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verify"
PLAN = {"node": "gpu01", "gpu_count": 8, "gpu_model": "NVIDIA H100 80GB HBM3", "persistence": True, "mig": None,
        "nvswitch": False, "checks": list(config.HEALTH_CHECKS), "reason_prefix": "gpufleet health"}
XID_79 = ("2026-12-08T02:00:00+0000 gpu01 kernel: NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', "
          "name=<unknown>, GPU has fallen off the bus.")


def probe() -> dict:
    doc = json.loads((FIXTURES / "probe-h100-sxm-8.json").read_text())
    for service in node.SERVICES:  # the node's own units as the plan wants them
        doc["services"]["units"][service] = {"load": "loaded", "active": "active", "sub": "running",
                                             "enabled": "enabled"}
    return doc


def test_a_healthy_node_has_no_failure():
    assert node.check(PLAN, probe()) == ([], None)


def test_an_xid_79_names_the_gpu_and_the_xid_in_the_reason():
    doc = probe()
    doc["kernel_log"]["xid_lines"] = [XID_79]
    failed, cannot = node.check(PLAN, doc)
    assert cannot is None
    assert [(f.check, f.gpu_index) for f in failed] == [("health.xid", 3)]
    reason = node.reason("gpufleet health", failed[0])
    assert reason.startswith("gpufleet health: health.xid: GPU 3 GPU-bad2c546-3c74-58de-85b9-14815ab6a455: Xid 79 ")
    assert len(reason) <= node.REASON_MAX


def test_only_the_enabled_groups_drain():
    doc = probe()
    doc["kernel_log"]["xid_lines"] = [XID_79]
    doc["gpus"][1]["persistence_mode"] = False
    failed, _ = node.check(PLAN, doc)
    assert {f.check for f in failed} == {"health.xid", "config.persistence"}
    failed, _ = node.check(dict(PLAN, checks=["persistence"]), doc)
    assert [(f.check, f.gpu_index) for f in failed] == [("config.persistence", 1)]


def test_a_gpu_missing_from_the_plan_fails_gpus():
    doc = probe()
    doc["gpus"] = doc["gpus"][:7]
    doc["gpu_count"] = 7
    failed, _ = node.check(PLAN, doc)
    assert [f.check for f in failed] == ["health.gpu_count"]


def test_a_probe_that_cannot_read_nvml_changes_nothing():
    doc = json.loads((FIXTURES / "probe-driver-not-loaded.json").read_text())
    failed, cannot = node.check(PLAN, doc)
    assert failed == [] and cannot.startswith("host.probe: ")


@pytest.mark.parametrize(("state", "reason", "drain", "expected"), [
    ("idle", "", "gpufleet health: health.xid: GPU 3: Xid 79", ["state=drain",
                                                                "reason=gpufleet health: health.xid: GPU 3: Xid 79"]),
    ("drained", "gpufleet health: health.xid: GPU 3: Xid 79", "gpufleet health: health.xid: GPU 3: Xid 79", None),
    ("drained", "gpufleet health: health.ecc: GPU 1: x", "gpufleet health: health.xid: GPU 3: Xid 79",
     ["state=drain", "reason=gpufleet health: health.xid: GPU 3: Xid 79"]),
    ("drained", "disk swap (admin)", "gpufleet health: health.xid: GPU 3: Xid 79", None),
    ("draining", "gpufleet rollout 20261208-0200", "gpufleet health: health.xid: GPU 3: Xid 79", None),
    ("drained", "gpufleet health: health.xid: GPU 3: Xid 79", None, ["state=resume"]),
    ("drained", "disk swap (admin)", None, None),
    ("drained", "gpufleet rollout 20261208-0200", None, None),
    ("drained", "gpufleet healthy-looking admin text", None, None),
    ("idle", "", None, None),
])
def test_drain_and_resume_rule(state, reason, drain, expected):
    assert node.decide(NodeStatus(state, reason, "root"), "gpufleet health", drain) == expected


def test_the_bundle_runs_alone_and_reports_a_missing_plan(tmp_path):
    pyz = tmp_path / bundle.BUNDLE_NAME
    pyz.write_bytes(bundle.bundle())
    assert bundle.bundle() == pyz.read_bytes()
    proc = subprocess.run([sys.executable, "-I", "-S", str(pyz), "--plan", str(tmp_path / "none.json"), "--dry"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "cannot check this node" in proc.stderr and "left as it is" in proc.stderr


@pytest.mark.parametrize(("key", "value", "allowed"), [
    ("gpufleet_health_interval", 2, "5..86400"),
    ("gpufleet_health_interval", "60", "5..86400"),
    ("gpufleet_health_checks", ["xid", "ecc"], "check groups out of"),
    ("gpufleet_health_checks", [], "non-empty list"),
    ("gpufleet_health_reason_prefix", "gpufleet: health", "1-48 characters"),
    ("gpufleet_health_reason_prefix", "", "1-48 characters"),
    ("gpufleet_health_node_state", ["NONDRAINED_IDLE"], "ALLOC, ANY, CYCLE, IDLE, MIXED"),
])
def test_bad_health_settings_are_refused_naming_host_key_and_what_is_allowed(key, value, allowed):
    with pytest.raises(config.ConfigErrors) as raised:
        config.load_node_config("gpu01", {key: value})
    text = str(raised.value)
    assert "gpu01" in text and key in text and allowed in text, text


def test_health_settings_reach_the_node_config():
    cfg = config.load_node_config("gpu01", {"gpufleet_health_interval": 30, "gpufleet_health_checks": ["xid"],
                                            "gpufleet_health_node_state": ["IDLE", "CYCLE"]})
    assert (cfg.health.interval, cfg.health.checks, cfg.health.node_state) == (30, ("xid",), ("IDLE", "CYCLE"))
    assert copy.deepcopy(cfg.health.reason_prefix) == "gpufleet health"


def test_the_slurm_conf_lines_and_node_states_are_slurm_22_05s():
    facts = json.loads((Path(__file__).resolve().parents[1] / "reference" / "upstream" / "slurm" / "facts.json")
                       .read_text())["files"]["slurm/doc/man/man5/slurm.conf.5"]["statements"]
    from gpufleet.operations.slurm import HEALTHCHECK_PROGRAM, slurm_conf_lines
    lines = slurm_conf_lines(30, ["IDLE", "CYCLE"])
    assert [line.split("=", 1)[0] for line in lines] == ["HealthCheckProgram", "HealthCheckInterval",
                                                         "HealthCheckNodeState"]
    for line, fact in zip(lines, ("health_check_program", "health_check_interval", "health_check_node_state"),
                          strict=True):
        assert facts[fact]["value"].startswith(line.split("=", 1)[0] + ":")
    assert lines[0] == f"HealthCheckProgram={HEALTHCHECK_PROGRAM}" and HEALTHCHECK_PROGRAM.startswith("/")
    assert lines[2] == "HealthCheckNodeState=IDLE,CYCLE"  # "Multiple state values ... with a comma separator"
    assert "comma separator" in facts["health_check_node_state"]["value"]
    assert facts["health_check_node_states"]["value"].split(", ") == list(config.HEALTH_NODE_STATES)
    assert "within 60 seconds" in facts["health_check_timeout"]["value"] and node.SLURM_TIMEOUT_S * 2 < 60


def test_dry_says_what_it_would_do_and_runs_no_scontrol(monkeypatch, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    doc = probe()
    doc["kernel_log"]["xid_lines"] = [XID_79]
    monkeypatch.setattr(node, "collect", lambda **_: doc)
    ran = []

    def run(argv):
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0, "idle|none|root\n" if argv[0] == "sinfo" else "", "")

    monkeypatch.setattr(node, "_run", run)
    assert node.main(["--plan", str(plan), "--dry"]) == 1
    assert [argv[0] for argv in ran] == ["sinfo"]
    out = capsys.readouterr().out
    assert "would run: scontrol update nodename=gpu01 state=drain reason=gpufleet health: health.xid: GPU 3 " in out
    ran.clear()
    assert node.main(["--plan", str(plan)]) == 1
    assert [argv[:4] for argv in ran] == [["sinfo", "-h", "-n", "gpu01"],
                                          ["scontrol", "update", "nodename=gpu01", "state=drain"]]
    assert ran[1][4].startswith("reason=gpufleet health: health.xid: GPU 3 GPU-bad2c546")
