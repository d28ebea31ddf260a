"""The decisions the node plan makes for the operations (gpufleet/plan/): a per-UUID setting for an absent GPU, the
driver by GPU and OS, persistence, the GPU exporter, NCCL's pairs; each decided once, here."""

from __future__ import annotations

from gpufleet.catalog import load_catalog
from gpufleet.config import load_node_config
from gpufleet.plan import (
    ABSENT_KEPT,
    ABSENT_REFUSED,
    ABSENT_UNKNOWN,
    DriverPlan,
    ExportersPlan,
    Gpu,
    NcclPlan,
    NodePlan,
    PersistencePlan,
    absent_uuids,
    driver_on_branch,
    power_plan_diff,
)

U0 = "GPU-0000000a-0000-0000-0000-00000000000b"
U1 = "GPU-11111111-1111-1111-1111-111111111111"
H100 = "NVIDIA H100 80GB HBM3"


def gpu(index: int, uuid: str | None, name: str = H100, source: str = "nvidia-smi", **more) -> Gpu:
    return Gpu(index=index, source=source, model=load_catalog().by_name(name) if name else None, name=name,
               uuid=uuid, **more)


def test_a_uuid_naming_no_gpu_is_refused_kept_while_gpus_are_lost_or_unknown_without_driver():
    assert absent_uuids([U0], [gpu(0, U0)], []) == ([], None)
    assert absent_uuids(["GPU-0000000A-0000-0000-0000-00000000000B"], [gpu(0, U0)], []) == ([], None)  # any case
    assert absent_uuids([U1], [gpu(0, U0)], []) == ([U1], ABSENT_REFUSED)
    assert absent_uuids([U1], [gpu(0, U0)], ["00000000:2A:00.0"]) == ([U1], ABSENT_KEPT)
    assert absent_uuids([U1], [], []) == ([U1], ABSENT_UNKNOWN)
    assert absent_uuids([U1], [gpu(0, None, source="pci")], []) == ([U1], ABSENT_UNKNOWN)


def test_preflight_and_the_power_operation_decide_an_absent_gpu_the_same_way():
    """The same absent UUID: an error in preflight and a refusal in the operation; with GPUs lost a warning in
    both and the limit kept in the boot file."""
    config = load_node_config("n", {"gpufleet_power_limit_by_uuid": {U1: 500}})
    present = [gpu(0, U0, power_limit_w=700.0, power_min_w=200.0, power_max_w=700.0)]
    plan = NodePlan.resolve(config, present)
    assert [e.key for e in plan.problems().errors] == [f"gpufleet_power_limit_by_uuid[{U1!r}]"]
    assert "is not on n" in power_plan_diff("n", {U1: 500.0}, present, [], {}).problem
    lost = ["00000000:2A:00.0"]
    assert not plan.problems(lost).errors and "is missing" in plan.problems(lost).warnings[0]
    diff = power_plan_diff("n", {U1: 500.0}, present, lost, {})
    assert diff.problem is None and diff.file_limits == {U1: 500.0} and "is missing" in diff.warning


def test_driver_flavour_by_gpu_and_package_naming_by_os():
    h100, b200 = [gpu(0, U0)], [gpu(0, U0, name="NVIDIA B200")]
    config = load_node_config("n", {})
    ubuntu = DriverPlan.resolve(config, h100, "ubuntu")
    assert (ubuntu.flavour, ubuntu.packages_style, ubuntu.dkms) == ("open", "ubuntu", False)
    debian = DriverPlan.resolve(config, b200, "debian")
    assert (debian.flavour, debian.packages_style, debian.dkms) == ("open", "nvidia", True)
    nvidia_on_ubuntu = DriverPlan.resolve(load_node_config("n", {"gpufleet_driver_packages_style": "nvidia"}), h100,
                                          "ubuntu")
    assert (nvidia_on_ubuntu.packages_style, nvidia_on_ubuntu.dkms) == ("nvidia", True)
    assert driver_on_branch("580.95.05", "580") and driver_on_branch("580", "580")
    assert not driver_on_branch("5800.1", "580") and not driver_on_branch(None, "580")


def test_persistence_restarts_the_daemon_only_for_gpus_with_persistence_off_when_it_should_be_on():
    gpus = [gpu(1, U1, persistence=False), gpu(0, U0, persistence=True), gpu(2, None, persistence=None)]
    assert PersistencePlan().diff(gpus) == [U1]
    assert PersistencePlan(False).diff(gpus) == []  # not switched off by gpufleet
    assert PersistencePlan().differs(gpus[2]) is None and PersistencePlan(False).differs(gpus[1]) is True


def test_the_gpu_exporter_is_chosen_by_the_plan():
    config = load_node_config("n", {})
    assert ExportersPlan.resolve(config, [gpu(0, U0)], dcgm_offered=True).kind == "dcgm"
    assert ExportersPlan.resolve(config, [gpu(0, U0)], dcgm_offered=False).kind == "nvml"
    assert ExportersPlan.resolve(config, [gpu(0, U0, name="NVIDIA GeForce RTX 4090")], dcgm_offered=True).kind == "nvml"
    assert NodePlan.resolve(config, [gpu(0, U0)], dcgm_offered=True).exporters.kind == "dcgm"


def test_nccl_pairs_of_a_file_against_the_plan():
    diff = NcclPlan({"NCCL_IB_DISABLE": 1, "NCCL_DEBUG": "WARN"}).diff({"NCCL_IB_DISABLE": "0", "NCCL_X": "y"})
    assert (diff.missing, dict(diff.wrong), diff.extra) == (("NCCL_DEBUG",), {"NCCL_IB_DISABLE": "0"}, ("NCCL_X",))
