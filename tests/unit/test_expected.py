"""ExpectedState from a validated NodeConfig (gpufleet/verify/expected.py), resolved against recorded probe documents
(tests/fixtures/verify/probe-*.json): the same power and MIG resolution as the converge deploy, only the stages that
are on, NVSwitch -> fabric manager, PCI GPU count; and the checks it drives on those documents."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpufleet.config import load_node_config
from gpufleet.facts.pci import NvidiaPciDevices
from gpufleet.plan import Gpu, NodePlan, gpus_from_facts, gpus_from_probe
from gpufleet.verify import ExpectedState, evaluate
from gpufleet.verify.expected import FABRICMANAGER, PERSISTENCED, expected_state

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "verify"
H100_PCI = "0x233010DE"


def probe(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def config(host: str = "gpu01", **data):
    return load_node_config(host, {f"gpufleet_{k}": v for k, v in data.items()})


def pci_fact(gpus: int, nvswitches: int = 0, device: str = "2330") -> dict:
    lines = ["@@gpufleet begin lspci"]
    lines += [f"0000:{5 + i:02x}:00.0 0680: 10de:22a3 (rev a1)" for i in range(nvswitches)]
    lines += [f"0000:{0x18 + i:02x}:00.0 0302: 10de:{device} (rev a1)" for i in range(gpus)]
    lines.append("@@gpufleet end lspci rc=0")
    return NvidiaPciDevices().process(lines)


def test_default_stages_expect_driver_persistence_and_no_nccl_file():
    exp = expected_state(config(), probe("probe-h100-sxm-8.json"))
    assert exp.driver_branch == "580"
    assert exp.persistence is True
    assert exp.services == {PERSISTENCED: "active"}
    assert exp.nccl == {}  # the deploy removes /etc/nccl.conf when no NCCL setting is given
    assert exp.power_limits_w == {} and exp.power_limit_w_all is None  # no limit set: power left alone
    assert exp.mig is None and exp.gpu_count is None


def test_stages_that_are_off_are_not_checked():
    exp = expected_state(config(stages=["driver", "power"], power_limit=600, nccl={"NCCL_DEBUG": "WARN"}),
                         probe("probe-h100-sxm-8.json"))
    assert exp.persistence is None and PERSISTENCED not in exp.services
    assert exp.nccl is None and exp.mig is None
    assert len(exp.power_limits_w) == 8
    none = expected_state(config(stages=[]), probe("probe-h100-sxm-8.json"))
    assert (none.driver_branch, none.persistence, none.nccl, none.mig, dict(none.power_limits_w), dict(none.services)) \
        == (None, None, None, None, {}, {})


def test_percent_power_limit_is_resolved_per_uuid_from_the_gpus_default_limit():
    doc = probe("probe-a100-40gb-1-mig.json")
    exp = expected_state(config(power_limit="80%"), doc)
    assert exp.power_limits_w == {doc["gpus"][0]["uuid"]: 320.0}  # 80 % of this A100's 400 W default


def test_power_precedence_uuid_over_model_over_fleet_wide_as_the_deploy():
    doc = probe("probe-h100-sxm-8.json")
    uuid0, uuid1 = doc["gpus"][0]["uuid"], doc["gpus"][1]["uuid"]
    exp = expected_state(config(power_limit=500, power_limit_by_model={"h100-sxm": "90%"},
                                power_limit_by_uuid={uuid1: 300}), doc)
    assert exp.power_limits_w[uuid0] == 630.0
    assert exp.power_limits_w[uuid1] == 300.0
    assert len(exp.power_limits_w) == 8


def fact_gpus(doc: dict) -> list[Gpu]:
    """The probe's GPUs as the deploy sees them (GpuInventory fact GPU dicts)."""
    return gpus_from_facts({"gpus": [{"index": g["index"], "uuid": g["uuid"], "name": g["name"],
                                      "pci_device_id": g["pci_device_id"],
                                      "power_default_w": g["power"]["default_limit_w"]} for g in doc["gpus"]]})


def test_power_limits_match_the_deploys_resolution_on_the_same_gpus():
    doc = probe("probe-l40s-4.json")
    cfg = config(power_limit="75%")
    deploy_side = NodePlan.resolve(cfg, fact_gpus(doc)).power.limits
    assert expected_state(cfg, doc).power_limits_w == deploy_side == {g["uuid"]: 262.5 for g in doc["gpus"]}


def test_lost_gpu_and_unresolvable_relative_limit_are_left_out_of_power():
    doc = probe("probe-h100-sxm-8-faults.json")  # gpu1 is lost: no uuid, no default limit
    exp = expected_state(config(power_limit="90%"), doc)
    assert len(exp.power_limits_w) == 7
    unknown = copy.deepcopy(probe("probe-h100-sxm-8.json"))
    for gpu in unknown["gpus"]:
        gpu["name"] = "NVIDIA Prototype X"  # not in the catalog
        gpu["pci_device_id"] = "0xFFFF10DE"
    unknown["gpus"][0]["power"]["default_limit_w"] = None  # and NVML does not know its default either
    exp = expected_state(config(power_limit="90%"), unknown)
    assert unknown["gpus"][0]["uuid"] not in exp.power_limits_w and len(exp.power_limits_w) == 7


def test_mig_layout_from_a_mig_parted_file_is_the_deploys_layout():
    cfg = config(mig_config_file=str(REPO / "inventories/mig/hgx-h100.yaml"), mig_config="inference-2-training-6")
    doc = probe("probe-h100-sxm-8.json")
    exp = expected_state(cfg, doc)
    assert exp.mig == {0: {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}, 1: {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2},
                       **{i: None for i in range(2, 8)}}
    assert exp.mig == NodePlan.resolve(cfg, fact_gpus(doc)).mig.layout


def test_mig_device_filter_and_unselected_gpus():
    layout = [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}, "device-filter": [H100_PCI]},
              {"devices": [1], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}, "device-filter": ["0x20B010DE"]}]
    exp = expected_state(config(mig=layout), probe("probe-h100-sxm-8.json"))
    assert exp.mig == {0: {"1g.10gb": 7}}  # GPU 1 is not an A100: its MIG state is left alone, like the deploy


def test_mig_stage_off_or_no_layout_checks_no_gpu():
    layout = [{"devices": "all", "mig-enabled": False}]
    assert expected_state(config(mig=layout, stages=["driver", "persistence"]), probe("probe-h100-sxm-8.json")).mig \
        is None
    assert expected_state(config(), probe("probe-h100-sxm-8.json")).mig is None


def test_nccl_settings_are_the_files_key_values():
    exp = expected_state(config(nccl={"NCCL_SOCKET_IFNAME": "=ens1f0", "NCCL_IB_HCA": "mlx5", "NCCL_DEBUG": "warn"}),
                         probe("probe-h100-sxm-8.json"))
    assert exp.nccl == {"NCCL_SOCKET_IFNAME": "=ens1f0", "NCCL_IB_HCA": "mlx5", "NCCL_DEBUG": "WARN"}


def test_fabric_manager_expected_where_the_pci_bus_has_nvswitches():
    doc = probe("probe-h100-sxm-8.json")
    assert expected_state(config(), doc, pci=pci_fact(8, nvswitches=4)).services == {
        PERSISTENCED: "active", FABRICMANAGER: "active"}
    assert FABRICMANAGER not in expected_state(config(), doc, pci=pci_fact(8)).services
    assert FABRICMANAGER not in expected_state(config(), doc).services  # unknown: not checked
    assert FABRICMANAGER in expected_state(config(), doc, nvswitch=True).services
    assert FABRICMANAGER not in expected_state(config(), doc, pci=pci_fact(8, 4), nvswitch=False).services
    failed = dict(pci_fact(8, 4), error="lspci: cannot read")
    assert FABRICMANAGER not in expected_state(config(), doc, pci=failed).services


def test_gpu_count_comes_from_the_pci_bus():
    doc = probe("probe-h100-sxm-8.json")
    assert expected_state(config(), doc, pci=pci_fact(8, 4)).gpu_count == 8
    short = copy.deepcopy(doc)
    short["gpus"] = short["gpus"][:7]  # the driver lists 7 of the 8 GPUs on the bus
    short["gpu_count"] = 7
    checks = evaluate(short, expected_state(config(), short, pci=pci_fact(8, 4)))
    count = [c for c in checks if c.check == "health.gpu_count"]
    assert [(c.verdict, c.observed, c.expected) for c in count] == [("fail", 7, 8)]


def test_classmethod_is_the_function():
    doc = probe("probe-a100-40gb-1-mig.json")
    cfg = config(power_limit="80%", nccl={"NCCL_DEBUG": "WARN"})
    assert ExpectedState.from_node_config(cfg, doc, pci=pci_fact(1, device="20b0")) == \
        expected_state(cfg, doc, pci=pci_fact(1, device="20b0"))


def test_probe_gpus_are_the_plans_gpu_record():
    gpus = gpus_from_probe(probe("probe-h100-sxm-8-faults.json"))
    first = gpus[0]
    assert (first.index, first.uuid, first.name, first.pci_device_id, first.power_default_w, first.status,
            first.model.key, first.source) == (0, "GPU-db6aaeaf-5277-5f18-a29d-eda193a8152a", "NVIDIA H100 80GB HBM3",
                                               H100_PCI, 700.0, "ok", "h100-sxm", "probe")
    assert gpus[1].status == "gpu_lost" and gpus[1].uuid is None


def test_verify_does_not_import_the_deploy():
    import gpufleet.verify.expected as module

    source = Path(module.__file__).read_text()
    assert "gpufleet.deploys" not in source and "gpufleet.operations" not in source


def test_a_node_matching_its_config_passes_every_config_check():
    doc = probe("probe-h100-sxm-8.json")  # driver 570, persistence on, 700 W, nccl file of the fixture
    eight = [str(i) for i in range(8)]
    doc["exporters"] = {"gpu": {"url": "http://127.0.0.1:9400/metrics", "status": "ok", "error": None,
                                "gpus": {"DCGM_FI_DEV_GPU_TEMP": eight, "DCGM_FI_DEV_POWER_USAGE": eight}},
                        "node": {"url": "http://127.0.0.1:9100/metrics", "status": "ok", "error": None, "gpus": {}}}
    cfg = config(driver_branch="570", power_limit="default", nccl={"NCCL_SOCKET_IFNAME": "=ens1f0",
                                                                    "NCCL_IB_HCA": "mlx5"},
                 mig=[{"devices": "all", "mig-enabled": False}])
    checks = evaluate(doc, expected_state(cfg, doc, pci=pci_fact(8, 4)))
    config_checks = [c for c in checks if c.check.startswith("config.")]
    assert {c.check for c in config_checks} == {
        "config.driver_branch", "config.persistence", "config.power_limit", "config.mig", "config.nccl",
        "config.service.nvidia-persistenced", "config.service.nvidia-fabricmanager", "config.exporter.gpu",
        "config.exporter.node"}
    assert [c for c in config_checks if c.verdict != "pass"] == []


@pytest.mark.parametrize(("data", "check", "gpu"), [
    ({"driver_branch": "580"}, "config.driver_branch", None),
    ({"power_limit": 600}, "config.power_limit", 0),
    ({"nccl": {"NCCL_DEBUG": "WARN"}}, "config.nccl", None),
    ({"mig": [{"devices": [3], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]}, "config.mig", 3),
])
def test_a_config_the_node_does_not_match_fails_exactly_that_check(data, check, gpu):
    doc = probe("probe-h100-sxm-8.json")
    base = {"driver_branch": "570", "nccl": {"NCCL_SOCKET_IFNAME": "=ens1f0", "NCCL_IB_HCA": "mlx5"}}
    base.update(data)
    checks = evaluate(doc, expected_state(config(**base), doc))
    failed = {(c.check, c.gpu_index) for c in checks if c.verdict == "fail"}
    if check == "config.power_limit":
        assert failed == {(check, i) for i in range(8)}
    else:
        assert failed == {(check, gpu)}
