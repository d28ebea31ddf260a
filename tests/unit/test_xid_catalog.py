"""NVIDIA's Xid catalog in the product (gpufleet/verify/xid_catalog.json) against the upstream copy
(tests/reference/upstream/xid/), the classes verify and the alert rules judge Xids by, and the GPU recovery action
table against NVML's constants."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpufleet.monitoring import rules
from gpufleet.verify import ExpectedState, evaluate
from gpufleet.verify.recovery import RECOVERY_ACTIONS, recovery_action
from gpufleet.verify.thresholds import default_thresholds
from gpufleet.verify.xid import critical_xids, xid_catalog, xid_info
from tests import upstream

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verify"


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def test_the_product_catalog_is_nvidia_s_table():
    ours = {int(code): row for code, row in xid_catalog()["xids"].items()}
    assert ours == upstream.xid_catalog()
    assert xid_catalog()["source"] == json.loads(upstream.read("xid/catalog.json"))["source"]


def test_every_resolution_bucket_is_in_exactly_one_class_and_critical_is_nvidia_s_fatal():
    classes = xid_catalog()["classes"]
    buckets = [r for c in classes.values() for r in c["resolutions"]]
    assert len(buckets) == len(set(buckets))
    assert {row["resolution"] for row in upstream.xid_catalog().values()} <= set(buckets)
    for code, row in upstream.xid_catalog().items():
        assert xid_info(code).critical == row["fatal"], (code, row)


@pytest.mark.parametrize("code", [46, 48, 74, 79, 95, 109, 110, 119, 136, 140, 143, 144, 145, 146, 147, 148, 149,
                                  150, 155, 156, 158, 160])
def test_reset_and_reboot_xids_are_critical(code):
    """The issue's list: reset/reboot-class Xids the old hand-written list missed (NVLink5 on B200/GB200 included)."""
    assert xid_info(code).critical and default_thresholds().xid_severity(code) == "fail"
    assert xid_info(code).xid_class in ("reset_gpu", "reboot")


@pytest.mark.parametrize(("code", "xid_class"), [(13, "restart_app"), (31, "restart_app"), (43, "non_fatal"),
                                                 (63, "non_fatal"), (154, "recovery_action"), (999, "unknown")])
def test_application_non_fatal_and_recovery_action_xids_are_not_critical(code, xid_class):
    info = xid_info(code)
    assert (info.xid_class, info.critical, default_thresholds().xid_severity(code)) == (xid_class, False, "warn")


def test_verify_judges_kernel_log_xids_by_the_catalog():
    doc = load("probe-h100-sxm-8.json")
    log = ("[ 5.1] NVRM: Xid (PCI:0000:18:00): 154, pid=0, GPU recovery action changed from 0x0 (None) to 0x1 "
           "(Reset)\n[ 5.2] NVRM: Xid (PCI:0000:2a:00): 136, pid=0, Link training failed\n")
    checks = {c.gpu_index: c for c in evaluate(doc, ExpectedState(persistence=None), kernel_log=log)
              if c.check == "health.xid"}
    assert checks[0].verdict == "warn" and "follow the GPU's recovery action" in checks[0].message
    assert checks[1].verdict == "fail"
    assert "Xid 136 x1: ALI_TRAINING_FAIL (reset the GPU; NVIDIA's catalog: RESET_GPU)" in checks[1].message


def test_the_critical_xid_rule_keeps_exactly_the_critical_xids():
    expr = next(r["expr"] for g in rules.recording_rules()["groups"] for r in g["rules"]
                if r["record"] == "gpufleet:gpu_xid_critical")
    codes = set()
    for term in expr.split(" or "):
        m = re.fullmatch(r"DCGM_FI_DEV_XID_ERRORS (?:== (\d+)|>= (\d+) <= (\d+))", term)
        assert m, term
        low, high = (int(m.group(1)),) * 2 if m.group(1) else (int(m.group(2)), int(m.group(3)))
        codes |= set(range(low, high + 1))
    assert codes == set(critical_xids()) == set(default_thresholds().xid_critical())
    assert 154 not in codes and {79, 136, 48} <= codes


def test_recovery_actions_are_nvml_s():
    nvml = {name.removeprefix("NVML_GPU_RECOVERY_ACTION_").lower(): fact["value"]
            for name, fact in upstream.nvml_facts()["gpu_recovery_actions"].items()}
    assert {a.name: a.value for a in RECOVERY_ACTIONS.values()} == nvml
    assert recovery_action(0).severity is None
    assert {recovery_action(v).severity for v in (1, 2, 6, 7, 42)} == {"critical"}
    assert {recovery_action(v).severity for v in (3, 4, 5)} == {"warning"}
