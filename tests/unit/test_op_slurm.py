"""slurm.gres_conf and the ``slurm`` stage: the exact gres.conf of an 8 x H100 node, a MIG node and a GeForce
workstation (derived from the node plan), the commands (upload, slurmd restarted only when the file changed and slurmd
is installed), the no-op, refused arguments and settings."""

from __future__ import annotations

import pytest
from pyinfra.api import OperationValueError
from pyinfra_harness import managed_state, run_operation

from gpufleet.config import ConfigErrors, load_node_config
from gpufleet.deploys.gpu_node import slurm_gres_args
from gpufleet.facts.files import ManagedState
from gpufleet.operations import slurm
from gpufleet.plan import Gpu, NodePlan, catalog_model

H100 = "NVIDIA H100 80GB HBM3"
RTX = "NVIDIA GeForce RTX 4090"
PATH = slurm.GRES_CONF

H100_X8 = """# Managed by gpufleet (slurm stage), overwritten on every run.
# slurm.conf for this node: Gres=gpu:h100_80gb_hbm3:8
AutoDetect=off
Name=gpu Type=h100_80gb_hbm3 File=/dev/nvidia0
Name=gpu Type=h100_80gb_hbm3 File=/dev/nvidia1
Name=gpu Type=h100_80gb_hbm3 File=/dev/nvidia2
Name=gpu Type=h100_80gb_hbm3 File=/dev/nvidia3
Name=gpu Type=h100_80gb_hbm3 File=/dev/nvidia4
Name=gpu Type=h100_80gb_hbm3 File=/dev/nvidia5
Name=gpu Type=h100_80gb_hbm3 File=/dev/nvidia6
Name=gpu Type=h100_80gb_hbm3 File=/dev/nvidia7
"""

H100_MIG = """# Managed by gpufleet (slurm stage), overwritten on every run.
# slurmd finds the GPUs and MIG devices through NVML. This node, by gpufleet's plan:
#   GPU 0: NVIDIA H100 80GB HBM3, MIG: 7 x 1g.10gb
#   GPU 1: NVIDIA H100 80GB HBM3, MIG: 1 x 3g.40gb, 2 x 2g.20gb
#   GPU 2: NVIDIA H100 80GB HBM3
#   GPU 3: NVIDIA H100 80GB HBM3
# slurm.conf for this node (a type matches a substring of NVML's name):
#   Gres=gpu:1g.10gb:7,gpu:3g.40gb:1,gpu:2g.20gb:2,gpu:h100_80gb_hbm3:2
AutoDetect=nvml
"""

GEFORCE = """# Managed by gpufleet (slurm stage), overwritten on every run.
# slurm.conf for this node: Gres=gpu:geforce_rtx_4090:1
AutoDetect=off
Name=gpu Type=geforce_rtx_4090 File=/dev/nvidia0
"""


def plan(name: str, count: int, **data) -> tuple:
    config = load_node_config("gpu01", data)
    gpus = [Gpu(index=i, source="nvidia-smi", model=catalog_model(name), name=name, mig_current=False
                if catalog_model(name).mig else None) for i in range(count)]
    return config, NodePlan.resolve(config, gpus)


def test_8_h100_node_lists_every_gpu_with_its_device_file():
    config, node = plan(H100, 8, gpufleet_stages=["driver", "slurm"])
    args = slurm_gres_args(config, node)
    assert args == {"gpus": [H100] * 8, "mig": {}, "mode": "auto"}
    assert slurm.gres_text(**args) == H100_X8


def test_mig_node_is_described_from_the_plans_layout_and_autodetected_through_nvml():
    config, node = plan(H100, 4, gpufleet_stages=["mig", "slurm"], gpufleet_mig=[
        {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
        {"devices": [1], "mig-enabled": True, "mig-devices": {"3g.40gb": 1, "2g.20gb": 2}},
        {"devices": [2], "mig-enabled": False}])
    args = slurm_gres_args(config, node)
    assert args == {"gpus": [H100] * 4, "mig": {0: {"1g.10gb": 7}, 1: {"3g.40gb": 1, "2g.20gb": 2}}, "mode": "auto"}
    assert slurm.gres_text(**args) == H100_MIG


def test_mig_layout_of_a_stage_that_is_off_is_not_applied_so_not_described():
    config, node = plan(H100, 8, gpufleet_stages=["slurm"],
                        gpufleet_mig=[{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}])
    assert slurm_gres_args(config, node)["mig"] == {}
    assert slurm.gres_text(**slurm_gres_args(config, node)) == H100_X8


def test_geforce_workstation():
    config, node = plan(RTX, 1, gpufleet_stages=["slurm"])
    assert slurm.gres_text(**slurm_gres_args(config, node)) == GEFORCE


def test_nvml_mode_without_mig():
    assert slurm.gres_text(["NVIDIA A100-SXM4-40GB"], mode="nvml") == (
        "# Managed by gpufleet (slurm stage), overwritten on every run.\n"
        "# slurmd finds the GPUs and MIG devices through NVML. This node, by gpufleet's plan:\n"
        "#   GPU 0: NVIDIA A100-SXM4-40GB\n"
        "# slurm.conf for this node (a type matches a substring of NVML's name):\n"
        "#   Gres=gpu:a100-sxm4-40gb:1\n"
        "AutoDetect=nvml\n")


@pytest.mark.parametrize(("name", "kind"), [
    (H100, "h100_80gb_hbm3"), (RTX, "geforce_rtx_4090"), ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
    ("Tesla T4", "tesla_t4"), ("NVIDIA", "nvidia")])
def test_gres_type_is_the_nvidia_smi_name_as_slurms_nvml_names_it_without_nvidia(name, kind):
    assert slurm.gres_type(name) == kind


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"gpus": [H100], "mode": "nvlm"}, "slurm.gres_conf: mode='nvlm'; allowed: auto, files, nvml"),
    ({"gpus": [H100], "mig": {0: {"1g.10gb": 7}}, "mode": "files"},
     "slurm.gres_conf: mode='files' with a MIG layout; allowed: auto or nvml (MIG devices are found by slurmd "
     "through NVML)"),
    ({"gpus": [H100], "mig": {3: {"1g.10gb": 7}}}, "slurm.gres_conf: MIG layout for GPU 3; this node has GPUs 0-0"),
    ({"gpus": []}, "slurm.gres_conf: no GPU to describe (gpus is empty)"),
])
def test_refused_arguments(kwargs, message):
    with pytest.raises(OperationValueError) as error:
        slurm.gres_text(**kwargs)
    assert str(error.value) == message


# ------------------------------------------------------------------------------------------ the operation


def run(files=None, slurmd_loaded=True, **kwargs):
    units = {slurm.SLURMD: {"active_state": "active"}} if slurmd_loaded else {slurm.SLURMD: {"load_state": "not-found"}}
    return run_operation(slurm.gres_conf, facts={ManagedState: managed_state(files, units)}, **kwargs)


def test_new_file_is_written_and_a_running_slurmd_restarted():
    commands, noops = run(gpus=[H100] * 8)
    assert commands == ["mkdir -p /etc/slurm", f"upload {PATH}\n{H100_X8}",
                        f"chown root:root {PATH} && chmod 644 {PATH}", "systemctl try-restart slurmd.service"]
    assert noops == []


def test_without_slurmd_the_file_is_written_and_nothing_restarted():
    commands, _ = run(slurmd_loaded=False, gpus=[H100] * 8)
    assert commands[-1] == f"chown root:root {PATH} && chmod 644 {PATH}"


def test_changed_file_is_uploaded_and_slurmd_restarted():
    commands, _ = run({PATH: "AutoDetect=off\nName=gpu File=/dev/nvidia0\n"}, gpus=[RTX])
    assert commands == [f"upload {PATH}\n{GEFORCE}", "systemctl try-restart slurmd.service"]


def test_same_file_is_noop_and_slurmd_left_alone():
    commands, noops = run({PATH: H100_X8}, gpus=[H100] * 8)
    assert commands == []
    assert noops == ["/etc/slurm/gres.conf describes 8 GPU(s)"]


# ------------------------------------------------------------------------------------------ settings


def errors_of(data: dict) -> list[str]:
    with pytest.raises(ConfigErrors) as error:
        load_node_config("node01", data)
    return [e.message for e in error.value.errors]


def test_setting_is_validated_naming_host_key_value_and_allowed():
    assert errors_of({"gpufleet_slurm_gres": "nvlm"}) == [
        "node01: gpufleet_slurm_gres='nvlm': unknown choice; allowed: auto, files, nvml (did you mean 'nvml'?)"]


def test_files_with_a_mig_layout_is_refused_before_any_host_is_touched():
    mig = [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]
    assert errors_of({"gpufleet_stages": ["mig", "slurm"], "gpufleet_slurm_gres": "files", "gpufleet_mig": mig}) == [
        "node01: gpufleet_slurm_gres='files': gres.conf files cannot name MIG devices; allowed: auto or nvml on a "
        "host with a MIG layout (MIG devices are found by slurmd through NVML: AutoDetect=nvml)"]
    for ok in ({"gpufleet_stages": ["mig", "slurm"], "gpufleet_mig": mig},
               {"gpufleet_stages": ["slurm"], "gpufleet_slurm_gres": "files", "gpufleet_mig": mig}):
        assert load_node_config("node01", ok).slurm_gres in ("auto", "files")
