"""Checks (gpufleet/verify/checks.py) on recorded probe documents (tests/fixtures/verify/probe-*.json, produced by
the real probe against the simulated NVML; see regen.py there): a converged node passes everything, each injected
fault is reported as exactly that fault on exactly that GPU, plus thresholds, Xid parsing and fleet outliers."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpufleet.catalog import load_catalog
from gpufleet.verify import (
    EXIT_COULD_NOT_RUN,
    EXIT_FAILED,
    EXIT_OK,
    CheckResult,
    ExpectedState,
    FleetResult,
    HostResult,
    Thresholds,
    ThresholdsError,
    build_fleet_result,
    default_thresholds,
    evaluate,
    evaluate_host,
    exit_code,
    parse_probe_output,
    parse_xid_lines,
    probe_failed_host,
    unreachable_host,
    worst_verdict,
)
from gpufleet.verify.xid import parse_bus_id

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verify"
NCCL = {"NCCL_SOCKET_IFNAME": "=ens1f0", "NCCL_IB_HCA": "mlx5"}
SERVICES = {"nvidia-persistenced": "active", "nvidia-fabricmanager": "active", "dcgm-exporter": "active"}


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def h100_expected(**overrides) -> ExpectedState:
    values = dict(driver_branch="570", persistence=True, power_limit_w_all=700.0, nccl=NCCL, gpu_count=8,
                  gpu_model="h100-sxm", services=SERVICES)
    values.update(overrides)
    return ExpectedState(**values)


def problems(checks: list[CheckResult]) -> set[tuple[str, str, int | None]]:
    return {(c.verdict, c.check, c.gpu_index) for c in checks if c.verdict not in ("pass", "skip")}


# --------------------------------------------------------------------------------------------------------------
# Whole documents
# --------------------------------------------------------------------------------------------------------------


def test_converged_h100_node_passes_every_check():
    checks = evaluate(load("probe-h100-sxm-8.json"), h100_expected())
    assert problems(checks) == set()
    ids = {c.check for c in checks}
    assert {"host.probe", "config.driver_branch", "config.persistence", "config.power_limit", "config.nccl",
            "config.service.nvidia-persistenced", "health.gpu_count", "health.gpu_model", "health.temperature",
            "health.clock_events", "health.ecc", "health.row_remap", "health.pcie", "health.nvlink", "health.xid",
            "perf.matmul.bf16", "perf.matmul.fp8", "perf.memory_bandwidth", "perf.host_transfer",
            "perf.clock_events_during_run", "perf.nccl_all_reduce", "perf.dcgm_diag"} <= ids
    for c in checks:
        assert c.host == "gpu-h100-01" and c.remediation == ""
        if c.check.startswith(("health.temperature", "config.power_limit", "perf.matmul")):
            assert c.gpu_index is not None and c.gpu_uuid.startswith("GPU-")
    # 8 GPUs x per-GPU checks, named by index and UUID
    assert sorted({c.gpu_index for c in checks if c.check == "health.ecc"}) == list(range(8))


def test_faulty_node_reports_exactly_its_faults():
    checks = evaluate(load("probe-h100-sxm-8-faults.json"), h100_expected())
    assert problems(checks) == {
        ("fail", "config.service.dcgm-exporter", None),
        ("warn", "health.services", None),
        ("fail", "config.nccl", None),
        ("fail", "health.gpu_count", None),
        ("fail", "health.gpu_status", 1),
        ("fail", "health.temperature", 2),
        ("fail", "health.clock_events", 2),
        ("fail", "health.ecc", 2),
        ("fail", "health.row_remap", 2),
        ("fail", "health.xid", 2),
        ("fail", "perf.clock_events_during_run", 2),
        ("fail", "health.nvlink", 3),
        ("warn", "health.xid", 3),
        ("warn", "perf.matmul.bf16", 3),
        ("warn", "perf.matmul.fp16", 3),
        ("warn", "perf.matmul.tf32", 3),
        ("warn", "perf.matmul.fp32", 3),
        ("warn", "perf.matmul.fp8", 3),
        ("fail", "perf.memory_bandwidth", 3),
        ("fail", "health.pcie", 4),
        ("fail", "config.power_limit", 5),
        ("fail", "config.persistence", 6),
        ("fail", "health.xid", None),
    }
    by = {(c.check, c.gpu_index): c for c in checks}
    lost = by[("health.gpu_status", 1)]
    assert lost.observed == "gpu_lost" and "fallen off the bus" in lost.remediation
    assert "2 uncorrected ECC" in by[("health.ecc", 2)].message
    assert by[("config.power_limit", 5)].message == "power limit 500 W, expected 700 W"
    assert "-pl 700" in by[("config.power_limit", 5)].remediation
    assert by[("health.nvlink", 3)].observed == [4, 11]
    assert "hw_thermal_slowdown" in by[("health.clock_events", 2)].message
    xids = [c for c in checks if c.check == "health.xid" and c.gpu_index is None]
    assert sorted(c.message.split(" ")[1] for c in xids) == ["0000:2a:00", "0000:c1:00"]
    for c in checks:
        if c.verdict in ("fail", "warn"):
            assert c.remediation and "\n" not in c.remediation, c
            if c.gpu_index is not None and c.check != "health.gpu_status":
                assert c.gpu_uuid and c.gpu_uuid.startswith("GPU-")


def test_no_expectations_checks_only_health():
    checks = evaluate(load("probe-h100-sxm-8.json"), ExpectedState(persistence=None))
    ids = {c.check for c in checks}
    assert not any(i.startswith("config.") for i in ids)
    assert problems(checks) == set()


def test_driver_not_loaded_is_one_clear_failure():
    checks = evaluate(load("probe-driver-not-loaded.json"), h100_expected())
    probe_check = next(c for c in checks if c.check == "host.probe")
    assert probe_check.verdict == "fail" and "driver_not_loaded" in probe_check.message
    assert "modprobe nvidia" in probe_check.remediation
    assert next(c for c in checks if c.check == "config.driver_branch").verdict == "skip"
    assert not any(c.gpu_index is not None or c.check.startswith("perf.") for c in checks)
    assert next(c for c in checks if c.check == "health.services").verdict == "pass"  # still read without NVML


def test_consumer_gpu_without_ecc_or_row_remap():
    checks = evaluate(load("probe-rtx4090-1.json"), ExpectedState(persistence=True, nccl={}))
    by = {(c.check, c.gpu_index): c for c in checks}
    assert by[("health.row_remap", 0)].verdict == "skip"
    assert by[("config.nccl", None)].verdict == "pass"  # no file, none expected
    assert "health.nvlink" not in {c.check for c in checks}
    assert problems(checks) == set()


def test_l40s_host():
    checks = evaluate(load("probe-l40s-4.json"), ExpectedState(gpu_model="NVIDIA L40S", gpu_count=4,
                                                               services={"nvidia-persistenced": "active"}))
    assert problems(checks) == set()
    assert next(c for c in checks if c.check == "health.gpu_model").message == "4x NVIDIA L40S"


# --------------------------------------------------------------------------------------------------------------
# Config checks
# --------------------------------------------------------------------------------------------------------------


def test_driver_branch_mismatch():
    checks = evaluate(load("probe-h100-sxm-8.json"), h100_expected(driver_branch="580"))
    c = next(c for c in checks if c.check == "config.driver_branch")
    assert c.verdict == "fail" and c.observed == "570.172.08" and "580" in c.remediation


def test_power_limit_by_uuid_and_tolerance():
    doc = load("probe-h100-sxm-8.json")
    uuid0, uuid1 = doc["gpus"][0]["uuid"], doc["gpus"][1]["uuid"]
    checks = evaluate(doc, h100_expected(power_limit_w_all=None, power_limits_w={uuid0: 600, uuid1: 699.996}))
    power = {c.gpu_index: c for c in checks if c.check == "config.power_limit"}
    assert set(power) == {0, 1}  # GPUs without an expectation are not checked
    assert power[0].verdict == "fail" and power[1].verdict == "pass"
    out_of_range = evaluate(doc, h100_expected(power_limit_w_all=None, power_limits_w={uuid0: 900}))
    c = next(c for c in out_of_range if c.check == "config.power_limit")
    assert c.verdict == "fail" and "outside this GPU's range 200-700 W" in c.message
    capped = copy.deepcopy(doc)
    capped["gpus"][0]["power"]["enforced_limit_w"] = 500.0
    c = next(c for c in evaluate(capped, h100_expected()) if c.check == "config.power_limit" and c.gpu_index == 0)
    assert c.verdict == "warn" and "BMC" in c.remediation


def test_mig_layout_checks():
    doc = load("probe-a100-40gb-1-mig.json")
    ok = evaluate(doc, ExpectedState(mig={0: {"3g.20gb": 1, "2g.10gb": 1}}))
    assert next(c for c in ok if c.check == "config.mig").verdict == "pass"
    wrong = next(c for c in evaluate(doc, ExpectedState(mig={0: {"1g.5gb": 7}})) if c.check == "config.mig")
    assert wrong.verdict == "fail" and "expected 7x 1g.5gb" in wrong.message
    disabled = next(c for c in evaluate(doc, ExpectedState(mig={0: None})) if c.check == "config.mig")
    assert disabled.verdict == "fail" and disabled.message == "MIG enabled, expected disabled"
    empty = next(c for c in evaluate(doc, ExpectedState(mig={0: {}})) if c.check == "config.mig")
    assert empty.verdict == "fail" and empty.message == "MIG layout 1x 2g.10gb, 1x 3g.20gb, expected no instances"
    plain_off = load("probe-h100-sxm-8.json")
    assert next(c for c in evaluate(plain_off, ExpectedState(mig={3: None})) if c.check == "config.mig").verdict \
        == "pass"
    assert "config.mig" not in {c.check for c in evaluate(doc, ExpectedState(mig=None))}
    no_ci = copy.deepcopy(doc)
    no_ci["gpus"][0]["mig"]["gpu_instances"][1]["compute_instances"] = []
    layout = ExpectedState(mig={0: {"3g.20gb": 1, "2g.10gb": 1}})
    c = next(c for c in evaluate(no_ci, layout) if c.check == "config.mig")
    assert c.verdict == "warn" and "no compute instance" in c.message
    # the MIG GPU's benchmarks would measure one instance: performance is skipped, not judged
    plain = load("probe-h100-sxm-8.json")
    off = next(c for c in evaluate(plain, ExpectedState(mig={0: {"1g.10gb": 7}})) if c.check == "config.mig")
    assert off.verdict == "fail" and off.message.startswith("MIG disabled")
    pending = copy.deepcopy(plain)
    pending["gpus"][0]["mig"]["mode_pending"] = True
    c = next(c for c in evaluate(pending, ExpectedState(mig={0: {"1g.10gb": 7}})) if c.check == "config.mig")
    assert "enable pending" in c.message
    consumer = next(c for c in evaluate(load("probe-l40s-4.json"), ExpectedState(mig={0: {"1g.10gb": 1}}))
                    if c.check == "config.mig")
    assert consumer.verdict == "fail" and "no MIG mode" in consumer.message


def test_mig_layout_applied_without_a_pending_mode_reported_passes():
    """A probe that does not report the pending MIG mode: the layout is applied (the MIG operation, the applier and
    the exporter say so; verify warned 'disable pending' before the comparison was shared)."""
    doc = copy.deepcopy(load("probe-a100-40gb-1-mig.json"))
    doc["gpus"][0]["mig"]["mode_pending"] = None
    c = next(c for c in evaluate(doc, ExpectedState(mig={0: {"3g.20gb": 1, "2g.10gb": 1}})) if c.check == "config.mig")
    assert c.verdict == "pass", c.message


def test_mig_compute_instance_not_spanning_its_gpu_instance_warns():
    """The MIG operation recreates a GPU instance whose compute instance does not span it: verify does not pass it."""
    doc = copy.deepcopy(load("probe-a100-40gb-1-mig.json"))
    gi = next(gi for gi in doc["gpus"][0]["mig"]["gpu_instances"] if gi["profile_name"] == "3g.20gb")
    gi["compute_instances"] = [dict(gi["compute_instances"][0], profile_name="1c.3g.20gb")]
    c = next(c for c in evaluate(doc, ExpectedState(mig={0: {"3g.20gb": 1, "2g.10gb": 1}})) if c.check == "config.mig")
    assert c.verdict == "warn" and "do not hold one compute instance spanning them" in c.message


def test_nccl_file_checks():
    doc = load("probe-h100-sxm-8.json")
    extra = next(c for c in evaluate(doc, h100_expected(nccl={"NCCL_IB_HCA": "mlx5"})) if c.check == "config.nccl")
    assert extra.verdict == "warn" and "NCCL_SOCKET_IFNAME" in extra.message
    missing = copy.deepcopy(doc)
    missing["nccl_conf"].update(exists=False, content=None, values={})
    c = next(c for c in evaluate(missing, h100_expected()) if c.check == "config.nccl")
    assert c.verdict == "fail" and "missing" in c.message


def test_services_unknown_without_systemd():
    doc = load("probe-h100-sxm-8.json")
    doc["services"] = {"status": "no_systemd", "error": "System has not been booted with systemd", "units": {}}
    checks = evaluate(doc, h100_expected())
    svc = [c for c in checks if c.check.startswith("config.service.")]
    assert svc and all(c.verdict == "skip" for c in svc)
    assert "health.services" not in {c.check for c in checks}


# --------------------------------------------------------------------------------------------------------------
# Health details
# --------------------------------------------------------------------------------------------------------------


def _one(doc: dict, check: str, gpu: int = 0, expected: ExpectedState | None = None) -> CheckResult:
    return next(c for c in evaluate(doc, expected or ExpectedState(persistence=None))
                if c.check == check and c.gpu_index == gpu)


@pytest.mark.parametrize("temp,verdict", [(60, "pass"), (84, "warn"), (87, "warn"), (89, "fail"), (95, "fail")])
def test_temperature_against_the_gpus_own_thresholds(temp, verdict):
    doc = load("probe-h100-sxm-8.json")
    doc["gpus"][0]["temperature"].update(gpu_c=temp, slowdown_c=89, gpu_max_c=87)
    assert _one(doc, "health.temperature").verdict == verdict


@pytest.mark.parametrize("temp,verdict", [(82, "pass"), (83, "warn"), (90, "fail")])
def test_temperature_fallback_thresholds_from_data(temp, verdict):
    doc = load("probe-h100-sxm-8.json")
    doc["gpus"][0]["temperature"].update(gpu_c=temp, slowdown_c=None, gpu_max_c=None)
    assert _one(doc, "health.temperature").verdict == verdict


@pytest.mark.parametrize(("temp", "verdict"), [(91, "pass"), (92, "warn"), (97, "fail")])
def test_temperature_of_a_gpu_that_reports_no_threshold_by_its_catalog_model(temp, verdict):
    """RTX 2080 SUPER: slowdown 97 °C in the catalog: the same decision as the alert rules make from it."""
    doc = load("probe-h100-sxm-8.json")
    doc["gpus"][0]["name"] = load_catalog().get("rtx2080-super").name
    doc["gpus"][0]["temperature"].update(gpu_c=temp, slowdown_c=None, gpu_max_c=None, memory_c=None)
    c = _one(doc, "health.temperature")
    assert c.verdict == verdict
    assert f"GPU {temp} °C (warn 92, slowdown 97 from the catalog)" in c.message
    assert c.expected == {"warn_c": 92, "fail_c": 97, "source": "catalog"}


@pytest.mark.parametrize(("value", "verdict", "text"), [
    (0, "pass", "recovery action none (0)"), (1, "fail", "recovery action gpu_reset (1)"),
    (2, "fail", "recovery action node_reboot (2)"), (3, "warn", "recovery action drain_p2p (3)"),
    (4, "warn", "recovery action drain_and_reset (4)"), (9, "fail", "recovery action unknown (9)")])
def test_recovery_action_from_the_probe(value, verdict, text):
    doc = load("probe-h100-sxm-8.json")
    doc["gpus"][0]["recovery_action"] = value
    c = _one(doc, "health.recovery_action")
    assert (c.verdict, c.message) == (verdict, text)
    assert (c.remediation == "") == (verdict == "pass")


def test_no_recovery_action_check_where_the_driver_reports_none():
    doc = load("probe-h100-sxm-8.json")
    assert all(g.get("recovery_action") is None for g in doc["gpus"])  # a probe of an older driver / gpufleet
    assert not [c for c in evaluate(doc) if c.check == "health.recovery_action"]


def test_memory_temperature():
    doc = load("probe-h100-sxm-8.json")
    doc["gpus"][0]["temperature"].update(memory_c=94, memory_max_c=95)
    c = _one(doc, "health.temperature")
    assert c.verdict == "warn" and "memory 94 °C" in c.message


@pytest.mark.parametrize("reasons,verdict", [(["gpu_idle"], "pass"), (["sw_power_cap"], "pass"),
                                             (["sw_thermal_slowdown"], "warn"), (["hw_power_brake_slowdown"], "fail")])
def test_clock_event_reasons(reasons, verdict):
    doc = load("probe-h100-sxm-8.json")
    hw = [r for r in reasons if r.startswith("hw_")]
    doc["gpus"][0]["clock_event_reasons"].update(active=reasons, hardware_problems=hw)
    assert _one(doc, "health.clock_events").verdict == verdict


def test_ecc_and_row_remap_variants():
    doc = load("probe-h100-sxm-8.json")
    doc["gpus"][0]["ecc"]["aggregate_uncorrected"] = 4
    assert _one(doc, "health.ecc").verdict == "warn"
    doc["gpus"][0]["ecc"].update(aggregate_uncorrected=0, mode_current=False, mode_pending=False)
    c = _one(doc, "health.ecc")
    assert c.verdict == "warn" and "disabled" in c.message
    doc["gpus"][0]["ecc"].update(mode_current=True, mode_pending=False)
    assert "pending a reboot" in _one(doc, "health.ecc").message
    doc["gpus"][0]["row_remap"].update(failure=True)
    c = _one(doc, "health.row_remap")
    assert c.verdict == "fail" and "RMA" in c.remediation


def test_pcie_generation_downtrained_at_idle_is_not_a_problem():
    doc = load("probe-h100-sxm-8.json")
    doc["gpus"][0]["pcie"]["gen_current"] = 1
    assert _one(doc, "health.pcie").verdict == "pass"
    doc["gpus"][0]["clock_event_reasons"]["active"] = ["sw_power_cap"]
    assert _one(doc, "health.pcie").verdict == "warn"


def test_xid_lines_given_as_text_override_the_probe():
    doc = load("probe-h100-sxm-8.json")
    log = "[ 5.1] NVRM: Xid (PCI:0000:9a:00): 74, pid=1, NVLink: fatal error detected on link 3\n"
    checks = evaluate(doc, ExpectedState(persistence=None), kernel_log=log)
    by_gpu = {c.gpu_index: c for c in checks if c.check == "health.xid"}
    assert by_gpu[4].verdict == "fail" and "NVLink error" in by_gpu[4].message
    assert all(c.verdict == "pass" for i, c in by_gpu.items() if i != 4)


def test_kernel_log_unavailable_is_a_skip():
    doc = load("probe-h100-sxm-8.json")
    doc["kernel_log"] = {"status": "unavailable", "source": None, "error": "dmesg: Operation not permitted",
                         "xid_lines": []}
    checks = [c for c in evaluate(doc) if c.check == "health.xid"]
    assert len(checks) == 1 and checks[0].verdict == "skip" and "Operation not permitted" in checks[0].message


def test_parse_xid_lines_real_shapes():
    events = parse_xid_lines((FIXTURES / "kernel_log_xid.txt").read_text())
    assert [(e.code, e.pci) for e in events] == [(79, "0000:2a:00"), (48, "0000:3a:00"), (63, "0000:3a:00"),
                                                 (13, "0000:5d:00"), (79, "0000:c1:00")]
    assert events[1].message.startswith("pid='<unknown>', name=<unknown>, An uncorrectable double bit error")
    assert events[0].matches_bus_id("00000000:2A:00.0") and not events[0].matches_bus_id("00000000:3A:00.0")
    assert parse_xid_lines(["NVRM: Xid (PCI:0000:00:1e): 31"])[0].code == 31
    assert parse_xid_lines(["nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 11001, Fatal"]) == []
    assert parse_bus_id("00000000:18:00.0") == (0, 0x18, 0) and parse_bus_id("junk") is None


# --------------------------------------------------------------------------------------------------------------
# Performance
# --------------------------------------------------------------------------------------------------------------


def test_performance_thresholds_use_the_dense_peak():
    doc = load("probe-h100-sxm-8.json")
    bf16 = _one(doc, "perf.matmul.bf16")
    peak = load_catalog().by_name("NVIDIA H100 80GB HBM3").dense_peak("bf16")
    assert peak == 989.4 and bf16.expected["peak"] == 989.4 and "75% of dense peak 989.4" in bf16.message
    doc["bench"]["gpus"][0]["matmul"]["bf16"]["tflops"] = 400.0  # 40% of dense: fails (would be 20% of sparse)
    assert _one(doc, "perf.matmul.bf16").verdict == "fail"


def test_bench_skipped_without_backend_is_reported_once():
    doc = load("probe-h100-sxm-8.json")
    doc["bench"] = {"schema_version": 1, "profile": "quick", "status": "skipped",
                    "reason": "no CUDA backend: PyTorch not installed; CuPy not installed", "gpus": [],
                    "nccl_all_reduce": {"status": "skipped", "reason": "nccl-tests all_reduce_perf not found"},
                    "dcgm_diag": {"status": "skipped", "reason": "dcgmi not found (DCGM not installed)"}}
    checks = evaluate(doc)
    bench = [c for c in checks if c.check == "perf.bench"]
    assert len(bench) == 1 and bench[0].verdict == "skip" and "PyTorch not installed" in bench[0].message
    assert not any(c.check.startswith("perf.matmul") for c in checks)
    assert next(c for c in checks if c.check == "perf.nccl_all_reduce").verdict == "skip"
    assert "perf.bench" not in {c.check for c in evaluate(dict(doc, bench=None))}


def test_nccl_and_dcgm_verdicts():
    doc = load("probe-h100-sxm-8.json")
    nccl = next(c for c in evaluate(doc) if c.check == "perf.nccl_all_reduce")
    assert nccl.verdict == "pass" and nccl.observed == 470.73
    doc["bench"]["nccl_all_reduce"]["max_busbw_gbs"] = 320.0
    assert next(c for c in evaluate(doc) if c.check == "perf.nccl_all_reduce").verdict == "warn"
    doc["bench"]["nccl_all_reduce"]["wrong_total"] = 2
    assert next(c for c in evaluate(doc) if c.check == "perf.nccl_all_reduce").verdict == "fail"
    from gpufleet.probe.bench import parse_dcgmi_diag

    diag = parse_dcgmi_diag((FIXTURES / "dcgmi_diag_r1_4x_fail.txt").read_text())
    doc["bench"]["dcgm_diag"] = {"status": "ok", "level": 1, **diag}
    c = next(c for c in evaluate(doc) if c.check == "perf.dcgm_diag")
    assert c.verdict == "fail" and "software: fail" in c.message and "Persistence mode for GPU 0" in c.message


# --------------------------------------------------------------------------------------------------------------
# Hosts, fleet, exit codes
# --------------------------------------------------------------------------------------------------------------


def test_unreachable_and_failed_probe_hosts():
    down = unreachable_host("gpu09", "ssh: connect to host gpu09 port 22: No route to host")
    assert down.verdict == "unreachable" and down.checks[0].check == "host.reachable"
    assert "No route to host" in down.checks[0].message
    broken = probe_failed_host("gpu10", "python3: not found")
    assert broken.verdict == "fail" and broken.status == "error"


def test_exit_codes():
    ok = evaluate_host("gpu-h100-01", load("probe-h100-sxm-8.json"), h100_expected())
    bad = evaluate_host("gpu-h100-02", load("probe-h100-sxm-8-faults.json"), h100_expected())
    down = unreachable_host("gpu09", "timeout")
    assert exit_code(FleetResult([ok])) == EXIT_OK
    assert exit_code(FleetResult([ok, bad])) == EXIT_FAILED
    assert exit_code(FleetResult([ok, down])) == EXIT_FAILED
    assert exit_code(FleetResult([down])) == EXIT_COULD_NOT_RUN
    assert exit_code(FleetResult([])) == EXIT_COULD_NOT_RUN
    warn_only = evaluate_host("gpu-h100-01", load("probe-h100-sxm-8.json"), h100_expected(nccl={"NCCL_IB_HCA": "mlx5"}))
    assert warn_only.verdict == "warn" and exit_code(FleetResult([warn_only])) == EXIT_OK
    assert exit_code(FleetResult([ok, bad]).to_dict()) == EXIT_FAILED


def test_worst_verdict_order():
    assert worst_verdict([]) == "pass"
    assert worst_verdict(["skip"]) == "skip"
    assert worst_verdict(["skip", "pass"]) == "pass"
    assert worst_verdict(["pass", "warn", "skip"]) == "warn"
    assert worst_verdict(["warn", "fail", "unreachable"]) == "unreachable"
    with pytest.raises(ValueError):
        CheckResult(check="x", verdict="broken", host="h", message="m")


def _host_with_bf16(name: str, values: list[float]) -> HostResult:
    gpus = [{"index": i, "uuid": f"GPU-{name}-{i}", "name": "NVIDIA H100 80GB HBM3", "mig": False,
             "matmul": {"bf16": {"tflops": v}}, "memory_bandwidth_gbs": 2900.0} for i, v in enumerate(values)]
    return HostResult(host=name, probe={}, gpus=gpus)


def test_fleet_outliers_gpu_and_node():
    hosts = [_host_with_bf16("a", [750, 748, 752, 749]), _host_with_bf16("b", [751, 747, 600, 750]),
             _host_with_bf16("c", [740, 745, 742, 744]), _host_with_bf16("d", [600, 610, 605, 598])]
    fleet = build_fleet_result(hosts)
    gpu_checks = {(c.host, c.gpu_index): c for c in fleet.checks if c.check == "fleet.gpu_outlier"}
    assert len(gpu_checks) == 16
    assert gpu_checks[("b", 2)].verdict == "warn" and "below the fleet median" in gpu_checks[("b", 2)].message
    assert gpu_checks[("a", 0)].verdict == "pass"
    node = {c.host: c for c in fleet.checks if c.check == "fleet.node_outlier"}
    assert node["d"].verdict == "warn" and node["a"].verdict == "pass" and node["b"].verdict == "pass"
    # the per-GPU verdict of the summary follows its checks
    assert hosts[1].gpus[2]["verdict"] == "warn"


def test_fleet_outliers_need_a_group():
    fleet = build_fleet_result([_host_with_bf16("a", [750, 300])])
    assert not [c for c in fleet.checks if c.check.startswith("fleet.")]


def test_gpu_summary_for_reports():
    host = evaluate_host("gpu-h100-01", load("probe-h100-sxm-8.json"), h100_expected())
    row = host.gpus[0]
    assert row["model"] == "h100-sxm" and row["matmul"]["bf16"]["peak_tflops"] == 989.4
    assert row["matmul"]["bf16"]["fraction"] == pytest.approx(742.0 / 989.4, abs=1e-3)
    assert row["memory_bandwidth_peak_gbs"] == 3350 and row["temperature_warn_c"] < row["temperature_fail_c"]
    assert row["verdict"] == "pass"


def test_parse_probe_output():
    doc = load("probe-l40s-4.json")
    assert parse_probe_output("Warning: something\n" + json.dumps(doc) + "\n")["host"] == "gpu-l40s-01"
    assert parse_probe_output(json.dumps(doc, indent=1))["host"] == "gpu-l40s-01"
    with pytest.raises(ValueError):
        parse_probe_output("Traceback (most recent call last):\n  ...\nImportError: No module named pynvml")


# --------------------------------------------------------------------------------------------------------------
# Thresholds data
# --------------------------------------------------------------------------------------------------------------


def test_shipped_thresholds_are_valid_and_name_catalog_models():
    thr = default_thresholds()
    catalog = load_catalog()
    for key in thr.data["models"]:
        assert key in catalog, f"thresholds.json names unknown model {key}"
    a100 = thr.for_model("a100-sxm4-80gb")
    assert a100["matmul_fraction"]["bf16"] == {"warn": 0.7, "fail": 0.55}
    assert a100["matmul_fraction"]["fp32"] == thr.data["defaults"]["matmul_fraction"]["fp32"]  # merged, not replaced
    assert thr.for_model(None) == thr.data["defaults"]
    assert thr.xid_severity(79) == "fail" and thr.xid_severity(13) == "warn"
    assert thr.pcie_lane_gbs(5) == 3.938 and thr.pcie_lane_gbs(None) is None


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(typo=1), "unknown keys"),
    (lambda d: d["defaults"].update(temprature={}), "unknown keys"),
    (lambda d: d["defaults"]["matmul_fraction"]["bf16"].update(fail=0.9), "fail <= warn"),
    (lambda d: d.update(schema_version=2), "schema_version"),
    (lambda d: d["defaults"]["temperature"].update(warn_below_slowdown_c=-5), r"warn_below_slowdown_c=-5: must be >= "),
    (lambda d: d["defaults"]["temperature"].pop("fail_below_slowdown_c"), r"missing \['fail_below_slowdown_c'\]"),
    (lambda d: d["models"].update({"h100-sxm": {"temperature": {"fallback_fail_c": "hot"}}}),
     r"models.h100-sxm.temperature.fallback_fail_c='hot': not a number"),
    (lambda d: d["xid"].update(fail=["79"]), r"xid.fail=\['79'\]: must be a list of Xid codes"),
    (lambda d: d["xid"].update(critical=[79]), r"unknown keys \['critical'\] in 'xid'"),
])
def test_thresholds_reject_bad_data(mutate, message):
    data = copy.deepcopy(default_thresholds().data)
    mutate(data)
    with pytest.raises(ThresholdsError, match=message):
        Thresholds.from_dict(data)


def test_thresholds_from_a_user_file(tmp_path):
    data = copy.deepcopy(default_thresholds().data)
    data["defaults"]["temperature"]["fallback_warn_c"] = 70
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    thr = Thresholds.load(path)
    doc = load("probe-h100-sxm-8.json")
    doc["gpus"][0]["temperature"].update(gpu_c=75, slowdown_c=None, gpu_max_c=None)
    c = next(c for c in evaluate(doc, thresholds=thr) if c.check == "health.temperature" and c.gpu_index == 0)
    assert c.verdict == "warn"
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ThresholdsError, match="invalid JSON"):
        Thresholds.load(tmp_path / "bad.json")
