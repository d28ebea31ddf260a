"""power.limits: commands for given facts; the boot unit and its node script."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from pyinfra.api import OperationError, OperationValueError, State
from pyinfra_harness import gpu_inventory, managed_state, run_operation

from gpufleet.facts.files import ManagedState
from gpufleet.facts.nvidia import GpuInventory
from gpufleet.operations import power
from gpufleet.operations.gpu_settings import GPU_SETTINGS_SCRIPT, gpu_settings_unit
from gpufleet.operations.managed_files import node_script

UNIT_PATH = f"/etc/systemd/system/{power.UNIT}"
UUID0 = "GPU-0c5ef656-7642-5c6a-a509-453b0e5cca1e"
UUID1 = "GPU-61da76c4-0cad-5e7c-83d5-994bce5c83e1"
SCRIPT = Path(__file__).resolve().parents[2] / "gpufleet" / "node" / "gpu-settings.sh"


def gpu(index: int, uuid: str, limit: float, default: float = 700.0) -> dict:
    return {"index": index, "uuid": uuid, "name": "NVIDIA H100 80GB HBM3", "power_limit_w": limit,
            "power_default_w": default, "power_min_w": 200.0, "power_max_w": 700.0, "persistence_mode": "Enabled"}


def inventory(*gpus: dict, status: str = "ok", lost: tuple = ()) -> dict:
    return gpu_inventory(gpus, status=status, lost=lost)


def run(inv: dict, limits: dict, files=None, units=None):
    managed = managed_state(files, units, executables=(GPU_SETTINGS_SCRIPT,))
    return run_operation(power.limits, facts={GpuInventory: inv, ManagedState: managed}, limits=limits)


def installed(limits: dict) -> dict:
    return {
        power.CONF: power.conf_text(limits),
        GPU_SETTINGS_SCRIPT: node_script("gpu-settings.sh"),
        UNIT_PATH: gpu_settings_unit(power.UNIT, power.DESCRIPTION, "power", power.CONF),
    }


ENABLED = {power.UNIT: {"unit_file_state": "enabled", "active_state": "active", "sub_state": "exited"}}


def test_fresh_host_sets_differing_gpus_persists_and_installs_the_boot_unit():
    commands, _ = run(inventory(gpu(0, UUID0, 700.0), gpu(1, UUID1, 700.0)), {UUID0: 560, UUID1: 700})
    assert commands[0] == f"nvidia-smi -i {UUID0} -pl 560"  # UUID1 is already at 700 W
    commands, noops = run(inventory(gpu(0, UUID0, 700.0), gpu(1, UUID1, 700.0)), {UUID0: 560, UUID1: 500})
    assert commands == [
        f"nvidia-smi -i {UUID0} -pl 560 && nvidia-smi -i {UUID1} -pl 500",  # one round trip for all GPUs
        "mkdir -p /etc/gpufleet",
        f"upload {power.CONF}\n{power.conf_text({UUID0: 560, UUID1: 500})}",
        f"chown root:root {power.CONF} && chmod 644 {power.CONF}",
        "mkdir -p /usr/local/sbin",
        f"upload {GPU_SETTINGS_SCRIPT}\n{node_script('gpu-settings.sh')}",
        f"chown root:root {GPU_SETTINGS_SCRIPT} && chmod 755 {GPU_SETTINGS_SCRIPT}",
        "mkdir -p /etc/systemd/system",
        f"upload {UNIT_PATH}\n{gpu_settings_unit(power.UNIT, power.DESCRIPTION, 'power', power.CONF)}",
        f"chown root:root {UNIT_PATH} && chmod 644 {UNIT_PATH}",
        "systemctl daemon-reload",
        "systemctl enable gpufleet-power-limits.service",
        "systemctl start gpufleet-power-limits.service",
    ]
    assert noops == []


def test_values_file_is_sorted_by_uuid_with_watts():
    text = power.conf_text({UUID1: 337.5, UUID0: 560.0})
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        "tolerance_w=0.005", f"{UUID0}=560", f"{UUID1}=337.5"]  # the tolerance: the boot script compares with it
    assert power.parse_conf(text) == {UUID0: "560", UUID1: "337.5"}


def test_boot_unit_is_oneshot_ordered_after_persistenced_fabricmanager_and_mig():
    text = gpu_settings_unit(power.UNIT, power.DESCRIPTION, "power", power.CONF)
    lines = text.splitlines()
    assert "Type=oneshot" in lines and "RemainAfterExit=yes" in lines
    assert "After=nvidia-persistenced.service nvidia-fabricmanager.service gpufleet-mig.service" in lines
    assert "Wants=nvidia-persistenced.service" in lines
    assert f"ExecStart={GPU_SETTINGS_SCRIPT} power {power.CONF}" in lines
    assert "WantedBy=multi-user.target" in lines


def test_converged_host_is_noop():
    limits = {UUID0: 560}
    commands, noops = run(inventory(gpu(0, UUID0, 560.0)), limits, installed(limits), ENABLED)
    assert commands == []
    assert noops == ["power limits already set on 1 GPU(s), reapplied at boot by gpufleet-power-limits.service"]


def test_limit_compared_to_the_hundredth_of_a_watt():
    limits = {UUID0: 337.504}
    commands, _ = run(inventory(gpu(0, UUID0, 337.5)), limits, installed(limits), ENABLED)
    assert commands == []
    commands, _ = run(inventory(gpu(0, UUID0, 337.49)), limits, installed(limits), ENABLED)
    assert commands == [f"nvidia-smi -i {UUID0} -pl 337.5"]


def test_changed_limit_rewrites_the_values_file_but_not_the_unit():
    old, new = {UUID0: 560}, {UUID0: 500}
    commands, _ = run(inventory(gpu(0, UUID0, 560.0)), new, installed(old), ENABLED)
    assert commands == [f"nvidia-smi -i {UUID0} -pl 500", f"upload {power.CONF}\n{power.conf_text(new)}"]


def test_limit_reset_outside_gpufleet_is_set_again_only_on_that_gpu():
    limits = {UUID0: 560, UUID1: 560}
    commands, _ = run(inventory(gpu(0, UUID0, 560.0), gpu(1, UUID1, 700.0)), limits, installed(limits), ENABLED)
    assert commands == [f"nvidia-smi -i {UUID1} -pl 560"]


def test_uuid_not_on_the_host_is_refused_by_name():
    with pytest.raises(OperationError) as err:
        run(inventory(gpu(0, UUID0, 700.0)), {UUID1: 500})
    assert str(err.value) == f"power.limits: GPU {UUID1} is not on testhost (its GPUs: {UUID0})"


def test_uuid_of_a_lost_gpu_is_kept_for_boot_with_a_warning(caplog):
    limits = {UUID0: 560, UUID1: 500}
    commands, noops = run(inventory(gpu(0, UUID0, 560.0), lost=("00000000:19:00.0",)), limits, installed(limits),
                          ENABLED)
    assert commands == [] and noops  # the file already holds both: nothing changes, nothing reported changed
    assert f"GPU {UUID1} is missing (nvidia-smi reports lost GPU(s) 00000000:19:00.0)" in caplog.text


def test_desired_limit_of_a_lost_gpu_is_never_pruned_from_the_boot_file(caplog):
    # the deploy resolves limits for the GPUs nvidia-smi lists: GPU 1 (lost) is not in them
    old = {UUID0: 560, UUID1: 500}
    commands, noops = run(inventory(gpu(0, UUID0, 560.0), lost=("00000000:19:00.0",)), {UUID0: 560}, installed(old),
                          ENABLED)
    assert commands == []  # no "back to default" for GPU 1, no rewrite without it
    assert noops == ["power limits already set on 1 GPU(s), reapplied at boot by gpufleet-power-limits.service"]
    assert f"{UUID1} is missing" in caplog.text and "kept and applied at boot" in caplog.text


def test_a_gpu_absent_with_no_gpu_lost_is_dropped_from_the_boot_file():
    old, new = {UUID0: 560, UUID1: 500}, {UUID0: 560}
    commands, _ = run(inventory(gpu(0, UUID0, 560.0)), new, installed(old), ENABLED)
    assert commands == [f"upload {power.CONF}\n{power.conf_text(new)}"]  # removed or replaced: not ours any more


def test_deprecated_name_is_the_same_operation():
    assert power.power_limits is power.limits


def test_limit_outside_the_gpu_range_is_refused():
    with pytest.raises(OperationError, match=r"800 W for GPU GPU-0c5e.* outside its range 200-700 W"):
        run(inventory(gpu(0, UUID0, 700.0)), {UUID0: 800})


def test_gpu_without_power_management_is_refused():
    item = {**gpu(0, UUID0, 700.0), "power_limit_w": None}
    with pytest.raises(OperationError, match="does not report a power limit"):
        run(inventory(item), {UUID0: 500})


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"0": 300}, "'0' is not a GPU UUID"),
        ({"GPU-a b": 300}, "is not a GPU UUID"),
        ({UUID0: True}, "True is not a power limit"),
        ({UUID0: -5}, "-5 is not a power limit"),
        ({UUID0: "300"}, "'300' is not a power limit"),
        ({UUID0: float("nan")}, "nan is not a power limit"),
        ([300], "limits must be a dict"),
    ],
)
def test_bad_arguments_are_refused(limits, message):
    with pytest.raises(OperationValueError, match=message):
        run(inventory(gpu(0, UUID0, 700.0)), limits)


def test_uuid_is_quoted_in_commands():
    odd = "GPU-x$(reboot)"
    commands, _ = run(inventory(gpu(0, odd, 700.0)), {odd: 500}, installed({odd: 500}), ENABLED)
    assert commands == ["nvidia-smi -i 'GPU-x$(reboot)' -pl 500"]


@pytest.mark.parametrize("status", ["driver_not_loaded", "absent"])
def test_no_gpu_reachable_persists_for_boot_without_applying(status):
    limits = {UUID0: 560}
    commands, noops = run(inventory(status=status), limits)
    assert not [c for c in commands if c.startswith("nvidia-smi")]
    assert "systemctl enable gpufleet-power-limits.service" in commands
    assert "systemctl start gpufleet-power-limits.service" not in commands
    assert noops == [f"no GPU reachable ({status}): power limits apply at the next boot"]


def test_gpu_dropped_from_limits_goes_back_to_default():
    old, new = {UUID0: 560, UUID1: 560}, {UUID0: 560}
    inv = inventory(gpu(0, UUID0, 560.0), gpu(1, UUID1, 560.0, default=700.0))
    commands, _ = run(inv, new, installed(old), ENABLED)
    assert commands == [f"nvidia-smi -i {UUID1} -pl 700", f"upload {power.CONF}\n{power.conf_text(new)}"]


def test_empty_limits_reset_managed_gpus_and_remove_file_and_unit():
    inv = inventory(gpu(0, UUID0, 560.0), gpu(1, UUID1, 700.0))
    commands, _ = run(inv, {}, installed({UUID0: 560, UUID1: 700}), ENABLED)
    assert commands == [
        f"nvidia-smi -i {UUID0} -pl 700",
        "systemctl stop gpufleet-power-limits.service",
        "systemctl disable gpufleet-power-limits.service",
        f"rm -f {UNIT_PATH}",
        "systemctl daemon-reload",
        f"rm -f {power.CONF}",
    ]


def test_empty_limits_with_nothing_managed_is_noop():
    commands, noops = run(inventory(gpu(0, UUID0, 700.0)), {}, {}, {power.UNIT: {"load_state": "not-found"}})
    assert commands == []
    assert noops == ["no power limits managed"]


def test_format_watts():
    assert [power.format_watts(w) for w in (560.0, 337.5, 100.25, 99.999)] == ["560", "337.5", "100.25", "100"]


# -------------------------------------------------------------- the node script, with a fake nvidia-smi


FAKE_SMI = """#!/bin/sh
echo "$*" >> "$SMI_LOG"
case "$*" in
  "--query-gpu=uuid,power.limit --format=csv,noheader,nounits")
      [ -n "$SMI_DOWN" ] && { echo "NVIDIA-SMI has failed"; exit 9; }
      for gpu in $SMI_GPUS; do echo "$gpu, 700.00"; done ;;
  *" -pl 9999") echo "Provided power limit 9999.00 W is not a valid power limit"; exit 2 ;;
esac
"""


@pytest.fixture()
def node(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SMI_LOG": str(tmp_path / "log"),
           "SMI_GPUS": f"{UUID0} {UUID1}", "GPUFLEET_CLOCKS_RECORD": str(tmp_path / "run" / "locked")}

    def run_script(what: str, conf: str, **extra) -> tuple[subprocess.CompletedProcess, list[str]]:
        path = tmp_path / "conf"
        path.write_text(conf)
        result = subprocess.run(["sh", str(SCRIPT), what, str(path)], capture_output=True, text=True,
                                env={**env, **extra}, timeout=30)
        log = tmp_path / "log"
        calls = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        return result, calls

    run_script.tmp_path = tmp_path
    return run_script


def test_node_script_applies_by_uuid_and_skips_a_missing_gpu(node):
    conf = power.conf_text({UUID0: 560, "GPU-gone": 300, UUID1: 337.5})
    result, calls = node("power", conf)
    assert result.returncode == 0, result.stderr
    assert calls[1:] == [f"-i {UUID0} -pl 560", f"-i {UUID1} -pl 337.5"]
    assert "warning: GPU GPU-gone is not present" in result.stdout


def test_node_script_leaves_a_limit_already_set(node):
    result, calls = node("power", f"tolerance_w=0.005\n{UUID0}=700\n{UUID1}=699.999\n{UUID1[:-1]}=700")
    assert result.returncode == 0, result.stderr
    assert calls[1:] == []  # both at 700.00 W already; the UUID prefix is not a match
    assert f"GPU {UUID0}: power limit already 700 W" in result.stdout
    assert f"GPU {UUID1[:-1]} is not present" in result.stdout


def test_node_script_without_a_tolerance_sets_every_limit(node):
    result, calls = node("power", f"{UUID0}=700\n")
    assert result.returncode == 0, result.stderr
    assert calls[1:] == [f"-i {UUID0} -pl 700"]


def test_node_script_failure_of_one_gpu_fails_the_unit_after_trying_all(node):
    result, calls = node("power", f"{UUID0}=9999\n{UUID1}=500")
    assert result.returncode == 1
    assert calls[1:] == [f"-i {UUID0} -pl 9999", f"-i {UUID1} -pl 500"]
    assert "not a valid power limit" in result.stderr


def test_node_script_without_driver_fails(node):
    result, calls = node("power", f"{UUID0}=500", SMI_DOWN="1")
    assert result.returncode == 1
    assert calls == ["--query-gpu=uuid,power.limit --format=csv,noheader,nounits"]
    assert "cannot list the GPUs" in result.stderr


def test_node_script_records_the_clock_locks_it_applied(node):
    result, calls = node("clocks", f"# comment\n{UUID0}=1500,1980\nGPU-gone=1500,1980\n")
    assert result.returncode == 0, result.stderr
    assert calls[1:] == [f"-i {UUID0} -lgc 1500,1980"]
    assert (node.tmp_path / "run" / "locked").read_text() == f"{UUID0}=1500,1980\n"


def test_refusal_while_executing_fails_only_this_host(monkeypatch):
    monkeypatch.setattr(State, "is_executing", True)  # an exception now would stop the run on every host
    commands, _ = run(inventory(gpu(0, UUID0, 700.0)), {UUID1: 500})
    assert commands == [f"echo 'gpufleet: error: power.limits: GPU {UUID1} is not on testhost (its GPUs: {UUID0})' "
                        ">&2; exit 1"]
