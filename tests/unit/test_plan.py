"""gpufleet.plan: one GPU record, the node plan resolved once (power, MIG, clocks), its problems and boot files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.config import load_node_config
from gpufleet.plan import (
    POWER_TOLERANCE_W,
    Gpu,
    NodePlan,
    gpus_from_facts,
    gpus_from_probe,
    mig_fit,
    mig_instances_ok,
    mig_mode_ok,
    outside_range,
    power_conf_text,
    power_differs,
)
from gpufleet.verify import ExpectedState, evaluate

H100 = "NVIDIA H100 80GB HBM3"
UUID_A = "GPU-76aef7ff-372d-2432-b4b4-beca4d8d3400"
UUID_B = "GPU-c7a0294c-c2c2-5476-438c-fb468eaa223b"
UUID_C = "GPU-00000000-0000-0000-0000-0000000000cc"


def gpu(uuid, name=H100, default=700.0, pci="0x233010DE", **more):
    return {"uuid": uuid, "name": name, "power_default_w": default, "pci_device_id": pci, **more}


def limits(config, gpus: list[dict]) -> dict[str, float]:
    """What the deploy hands the power operation: {uuid: watts}."""
    plan = NodePlan.resolve(config, gpus_from_facts({"gpus": [{"index": i, **g} for i, g in enumerate(gpus)]}))
    return plan.power.limits if plan.power is not None else {}


# ---------------------------------------------------------------------------------------------- the record


def test_one_record_from_the_fact_and_from_the_probe():
    fact = {"index": 0, "name": H100, "uuid": UUID_A, "pci_bus_id": "00000000:18:00.0", "pci_device_id": "0x233010DE",
            "power_limit_w": 600.0, "power_default_w": 700.0, "power_min_w": 200.0, "power_max_w": 700.0,
            "mig_current": "Enabled", "mig_pending": "Enabled", "persistence_mode": "Enabled",
            "clocks_max_sm_mhz": 1980}
    probe = {"index": 0, "status": "ok", "name": H100, "uuid": UUID_A, "pci_bus_id": "00000000:18:00.0",
             "pci_device_id": "0x233010DE", "persistence_mode": True,
             "power": {"limit_w": 600.0, "default_limit_w": 700.0, "min_limit_w": 200.0, "max_limit_w": 700.0},
             "mig": {"mode_current": True, "mode_pending": True, "gpu_instances": []},
             "clocks": {"max_sm_mhz": 1980}}
    from_fact, from_probe = Gpu.from_fact(fact), gpus_from_probe({"gpus": [probe]})[0]
    assert from_fact.source == "nvidia-smi" and from_probe.source == "probe"
    assert from_fact == Gpu(**{**from_probe.__dict__, "source": "nvidia-smi"})
    assert from_fact.model.key == "h100-sxm" and from_fact.mig_current is True and from_fact.persistence is True


def test_without_a_driver_gpus_come_from_pci():
    gpus = gpus_from_facts({"gpus": []}, {"gpus": [{"pci_device_id": "0x233010DE", "address": "0000:18:00.0"}]})
    assert [(g.index, g.source, g.model.key, g.pci_bus_id, g.uuid) for g in gpus] == [
        (0, "pci", "h100-sxm", "0000:18:00.0", None)]


# --------------------------------------------------------------------------------------------------- power


def test_power_precedence_uuid_over_model_over_fleet():
    config = load_node_config("n", {
        "gpufleet_power_limit": "80%",
        "gpufleet_power_limit_by_model": {H100: 600, "a100-sxm4-80gb": "90%"},
        "gpufleet_power_limit_by_uuid": {UUID_A.upper(): 500},
    })
    gpus = [
        gpu(UUID_A),  # uuid wins over model
        gpu(UUID_B),  # model (by nvidia-smi name, configured by name)
        gpu("GPU-00000000-0000-0000-0000-000000000001", "NVIDIA A100-SXM4-80GB", 400.0, "0x20B210DE"),  # model key
        gpu("GPU-00000000-0000-0000-0000-000000000002", "NVIDIA L40S", 350.0, "0x26B910DE"),  # fleet-wide
    ]
    assert limits(config, gpus) == {
        UUID_A: 500.0,
        UUID_B: 600.0,
        "GPU-00000000-0000-0000-0000-000000000001": 360.0,
        "GPU-00000000-0000-0000-0000-000000000002": 280.0,
    }


def test_power_uuid_match_is_case_insensitive():
    config = load_node_config("n", {"gpufleet_power_limit_by_uuid": {UUID_A.upper(): 450}})
    assert limits(config, [gpu(UUID_A)]) == {UUID_A: 450.0}


def test_power_model_matches_by_pci_id_when_name_unknown():
    config = load_node_config("n", {"gpufleet_power_limit_by_model": {"h100-sxm": "50%"}})
    assert limits(config, [gpu(UUID_A, name="H100 engineering sample")]) == {UUID_A: 350.0}


def test_power_default_from_catalog_when_nvml_has_none():
    config = load_node_config("n", {"gpufleet_power_limit": "default"})
    assert limits(config, [gpu(UUID_A, default=None)]) == {UUID_A: 700.0}


def test_power_unmanaged_and_unresolvable():
    assert NodePlan.resolve(load_node_config("n", {}), gpus_from_facts({"gpus": [gpu(UUID_A)]})).power is None
    config = load_node_config("n", {"gpufleet_power_limit": "80%"})
    mystery = gpu(UUID_A, name="NVIDIA Mystery", default=None, pci="0xFFFF10DE")
    assert limits(config, [mystery]) == {}  # never a guess
    plan = NodePlan.resolve(config, gpus_from_facts({"gpus": [mystery]}))
    assert [e.message for e in plan.problems().errors] == [
        "n: gpufleet_power_limit=80% on GPU 0 (NVIDIA Mystery): cannot resolve a relative power limit; allowed: a "
        "limit in watts (this GPU's default power limit is unknown)"]


def test_one_power_tolerance_for_operation_range_boot_file_and_verify():
    assert not power_differs(337.5, 337.504) and power_differs(337.5, 337.49)
    assert not outside_range(700.004, 200, 700) and outside_range(700.01, 200, 700)
    assert f"tolerance_w={POWER_TOLERANCE_W:g}" in power_conf_text({}).splitlines()
    doc = json.loads((Path(__file__).parents[1] / "fixtures/verify/probe-h100-sxm-8.json").read_text())  # 700 W
    uuid = doc["gpus"][0]["uuid"]
    for want, verdict in ((700 - POWER_TOLERANCE_W / 2, "pass"), (700 - 2 * POWER_TOLERANCE_W, "fail")):
        checks = evaluate(doc, ExpectedState(power_limits_w={uuid: want}))
        assert next(c.verdict for c in checks if c.check == "config.power_limit") == verdict


def test_per_uuid_limit_for_a_gpu_not_on_the_host_is_an_error_naming_it():
    config = load_node_config("node01", {"gpufleet_power_limit_by_uuid": {UUID_C: 500}})
    plan = NodePlan.resolve(config, gpus_from_facts({"gpus": [{"index": 0, **gpu(UUID_A)}]}))
    assert [e.message for e in plan.problems().errors] == [
        f"node01: gpufleet_power_limit_by_uuid['{UUID_C}']='{UUID_C}': no such GPU on this host; allowed: a UUID "
        f"of this host's GPUs: {UUID_A}"]


def test_per_uuid_limit_for_a_gpu_while_one_is_lost_is_a_warning():
    config = load_node_config("node01", {"gpufleet_power_limit_by_uuid": {UUID_C: 500}})
    plan = NodePlan.resolve(config, gpus_from_facts({"gpus": [{"index": 0, **gpu(UUID_A)}]}))
    problems = plan.problems(lost=["00000000:19:00.0"])
    assert problems.errors == []
    assert problems.warnings == [
        f"node01: GPU {UUID_C} is missing (nvidia-smi reports lost GPU(s) 00000000:19:00.0): its desired power "
        "limit is kept and applied at boot when it is back"]


def test_per_uuid_limit_without_a_driver_is_checked_once_the_driver_answers():
    config = load_node_config("node01", {"gpufleet_power_limit_by_uuid": {UUID_C: 500}})
    plan = NodePlan.resolve(config, gpus_from_facts({}, {"gpus": [{"pci_device_id": "0x233010DE"}]}))
    problems = plan.problems()
    assert problems.errors == [] and any("checked once it does" in n for n in problems.notes)


# ----------------------------------------------------------------------------------------------------- MIG


def test_mig_layout_resolved_per_gpu_index():
    config = load_node_config("n", {"gpufleet_mig": [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
        {"devices": [1], "mig-enabled": False}]})
    gpus = gpus_from_facts({"gpus": [{"index": i, **gpu(u)} for i, u in enumerate((UUID_A, UUID_B, UUID_C))]})
    assert NodePlan.resolve(config, gpus).mig.layout == {0: {"1g.10gb": 7}, 1: None}


def test_mig_layout_with_the_mig_stage_off_is_a_visible_warning():
    config = load_node_config("node01", {"gpufleet_stages": ["driver", "power"], "gpufleet_mig": [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]})
    plan = NodePlan.resolve(config, [])
    assert plan.mig is None
    assert plan.problems().warnings == [
        "node01: a MIG layout is configured (gpufleet_mig) but gpufleet_stages leaves out 'mig': the layout is not "
        "applied"]


def test_mig_fit_is_one_decision_with_placements_in_creation_order():
    model = Gpu.from_fact(gpu(UUID_A)).model
    profiles, issues = mig_fit(model, {"1g.10gb": 2, "3g.40gb": 1, "2g.20gb": 1})
    assert issues == [] and [p.name for p in profiles] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    _, issues = mig_fit(model, {"1g.10gb": 8, "nope": 1})
    assert [i.kind for i in issues] == ["unknown_profile", "too_many"]
    _, issues = mig_fit(model, {"3g.40gb": 2, "1g.10gb": 1})
    assert [i.kind for i in issues] == ["slices"]


@pytest.mark.parametrize(("enabled", "current", "pending", "ok"), [
    (True, True, True, True), (True, True, False, False), (True, False, True, False), (False, None, None, True),
    (True, None, None, False), (False, False, None, True)])
def test_mig_mode_ok(enabled, current, pending, ok):
    assert mig_mode_ok(enabled, Gpu(index=0, source="nvidia-smi", mig_current=current, mig_pending=pending)) is ok


def test_mig_instances_compared_as_a_multiset_of_profile_ids():
    assert mig_instances_ok([9, 19, 19], [(19, True), (9, True), (19, True)])
    assert not mig_instances_ok([9, 19, 19], [(19, True), (9, True), (19, False)])  # partial compute instance
    assert not mig_instances_ok([9, 19], [(9, True)])


# -------------------------------------------------------------------------------------------------- clocks


def test_clock_lock_above_the_gpus_max_is_an_error():
    config = load_node_config("node01", {"gpufleet_stages": ["clocks"],
                                         "gpufleet_clocks": {"lock_gpu_mhz": [2000, 2000]}})
    plan = NodePlan.resolve(config, gpus_from_facts({"gpus": [{"index": 0, **gpu(UUID_A, clocks_max_sm_mhz=1980)}]}))
    assert [e.message for e in plan.problems().errors] == [
        f"node01: gpufleet_clocks.lock_gpu_mhz=[2000, 2000] on GPU 0 ({H100}): locked clock range above the GPU's "
        "maximum; allowed: a minimum at most 1980 MHz (this GPU's max SM clock)"]
    assert plan.clocks.desired([UUID_A]) == {UUID_A: "2000,2000"}


def test_mig_layout_doc_is_keyed_by_pci_bus_id():
    from gpufleet.plan import mig_layout_doc, mig_target

    target, problem = mig_target(Gpu.from_fact({"index": 0, "pci_bus_id": "00000000:18:00.0", "mig_current": "Enabled",
                                                **gpu(UUID_A)}), {"1g.10gb": 2})
    assert problem is None
    doc = mig_layout_doc([target], ["nvidia-persistenced.service"])
    assert json.loads(json.dumps(doc))["gpus"] == [{"pci_bus_id": "00000000:18:00.0", "index": 0, "name": H100,
                                                   "mig_enabled": True, "instances": {"1g.10gb": 2},
                                                   "create": [19, 19]}]


def test_power_diff_and_serialize_are_what_the_operation_sets_and_writes():
    config = load_node_config("n", {"gpufleet_power_limit": 600})
    facts = [{"index": 1, **gpu(UUID_B, power_limit_w=600.004)}, {"index": 0, **gpu(UUID_A, power_limit_w=700.0)}]
    plan = NodePlan.resolve(config, gpus_from_facts({"gpus": facts}))
    assert plan.power.diff(plan.gpus) == {UUID_A: 600.0}  # GPU 1 is within the tolerance
    assert plan.power.serialize() == power_conf_text({UUID_A: 600.0, UUID_B: 600.0})


def test_clocks_diff_against_the_record_of_applied_locks():
    config = load_node_config("n", {"gpufleet_stages": ["clocks"], "gpufleet_clocks": {"lock_gpu_mhz": [1200, 1400]}})
    gpus = gpus_from_facts({"gpus": [{"index": 0, **gpu(UUID_A)}, {"index": 1, **gpu(UUID_B)}]})
    plan = NodePlan.resolve(config, gpus)
    assert plan.clocks.diff(gpus, {UUID_A: "1200,1400", UUID_B: "1000,1400"}) == [UUID_B]
    assert plan.clocks.serialize([UUID_B, UUID_A]).splitlines()[-2:] == [f"{UUID_A}=1200,1400", f"{UUID_B}=1200,1400"]
