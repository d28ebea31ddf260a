"""clocks.locked: lock where not locked at the range, record, boot unit; reset path."""

from __future__ import annotations

import pytest
from pyinfra.api import OperationValueError
from pyinfra_harness import gpu_inventory, managed_state, run_operation

from gpufleet.facts.files import ManagedState
from gpufleet.facts.nvidia import GpuInventory
from gpufleet.operations import clocks
from gpufleet.operations.gpu_settings import GPU_SETTINGS_SCRIPT, gpu_settings_unit
from gpufleet.operations.managed_files import node_script

UNIT_PATH = f"/etc/systemd/system/{clocks.UNIT}"
UUID0 = "GPU-0c5ef656-7642-5c6a-a509-453b0e5cca1e"
UUID1 = "GPU-61da76c4-0cad-5e7c-83d5-994bce5c83e1"


def inventory(*uuids: str, status: str = "ok", max_mhz: int = 1980) -> dict:
    gpus = [{"index": i, "uuid": u, "name": "NVIDIA H100 80GB HBM3", "clocks_max_sm_mhz": max_mhz}
            for i, u in enumerate(uuids)]
    return gpu_inventory(gpus, status=status)


def run(inv: dict, lock_mhz, files=None, units=None):
    managed = managed_state(files, units, executables=(GPU_SETTINGS_SCRIPT,))
    return run_operation(clocks.locked, facts={GpuInventory: inv, ManagedState: managed}, lock_mhz=lock_mhz)


def converged(locks: dict) -> dict:
    return {
        clocks.LOCKED: clocks.locked_text(locks),
        clocks.CONF: clocks.conf_text(locks),
        GPU_SETTINGS_SCRIPT: node_script("gpu-settings.sh"),
        UNIT_PATH: gpu_settings_unit(clocks.UNIT, clocks.DESCRIPTION, "clocks", clocks.CONF),
    }


ACTIVE = {clocks.UNIT: {"unit_file_state": "enabled", "active_state": "active", "sub_state": "exited"}}


def test_fresh_host_locks_every_gpu_records_and_installs_the_boot_unit():
    commands, noops = run(inventory(UUID0, UUID1), (1500, 1980))
    locks = {UUID0: "1500,1980", UUID1: "1500,1980"}
    assert commands[:4] == [
        f"nvidia-smi -i {UUID0} -lgc 1500,1980 && nvidia-smi -i {UUID1} -lgc 1500,1980",
        "mkdir -p /run/gpufleet",
        f"upload {clocks.LOCKED}\n{clocks.locked_text(locks)}",
        f"chown root:root {clocks.LOCKED} && chmod 644 {clocks.LOCKED}",
    ]
    assert f"upload {clocks.CONF}\n{clocks.conf_text(locks)}" in commands
    assert commands[-3:] == ["systemctl daemon-reload", "systemctl enable gpufleet-gpu-clocks.service",
                             "systemctl start gpufleet-gpu-clocks.service"]
    assert f"ExecStart={GPU_SETTINGS_SCRIPT} clocks {clocks.CONF}" in gpu_settings_unit(
        clocks.UNIT, clocks.DESCRIPTION, "clocks", clocks.CONF).splitlines()
    assert noops == []


def test_locked_at_the_range_is_noop():
    locks = {UUID0: "1500,1980", UUID1: "1500,1980"}
    commands, noops = run(inventory(UUID0, UUID1), (1500, 1980), converged(locks), ACTIVE)
    assert commands == []
    assert noops == ["clocks locked at 1500,1980 MHz on 2 GPU(s)"]


def test_only_gpus_not_locked_at_the_range_are_locked():
    files = {**converged({UUID0: "1500,1980", UUID1: "1500,1980"}),
             clocks.LOCKED: clocks.locked_text({UUID0: "1500,1980", UUID1: "1200,1400"})}
    commands, _ = run(inventory(UUID0, UUID1), (1500, 1980), files, ACTIVE)
    assert commands == [
        f"nvidia-smi -i {UUID1} -lgc 1500,1980",
        f"upload {clocks.LOCKED}\n{clocks.locked_text({UUID0: '1500,1980', UUID1: '1500,1980'})}",
    ]


def test_after_reboot_without_record_gpus_are_locked_again():
    files = converged({UUID0: "1500,1980"})
    files[clocks.LOCKED] = None  # /run emptied at boot
    commands, _ = run(inventory(UUID0), (1500, 1980), files, ACTIVE)
    assert commands[0] == f"nvidia-smi -i {UUID0} -lgc 1500,1980"


def test_reset_path_resets_what_gpufleet_locked_and_removes_file_and_unit():
    files = converged({UUID0: "1500,1980", UUID1: "1500,1980"})
    commands, _ = run(inventory(UUID0), None, files, ACTIVE)  # UUID1 no longer on the host: nothing to reset
    assert commands == [
        f"nvidia-smi -i {UUID0} -rgc",
        f"rm -f {clocks.LOCKED}",
        "systemctl stop gpufleet-gpu-clocks.service",
        "systemctl disable gpufleet-gpu-clocks.service",
        f"rm -f {UNIT_PATH}",
        "systemctl daemon-reload",
        f"rm -f {clocks.CONF}",
    ]


def test_reset_with_nothing_locked_is_noop():
    commands, noops = run(inventory(UUID0), None, {}, {clocks.UNIT: {"load_state": "not-found"}})
    assert commands == []
    assert noops == ["no GPU clocks locked by gpufleet"]


def test_no_gpu_reachable_changes_nothing():
    commands, noops = run(inventory(status="driver_not_loaded"), (1500, 1980))
    assert commands == []
    assert noops == ["no GPU reachable (driver_not_loaded): clocks are locked by the next run"]


def test_uuid_is_quoted():
    odd = "GPU-x y"
    commands, _ = run(inventory(odd), (1500, 1500), converged({odd: "1500,1500"}) | {clocks.LOCKED: ""}, ACTIVE)
    assert commands[0] == "nvidia-smi -i 'GPU-x y' -lgc 1500,1500"


@pytest.mark.parametrize(
    ("lock", "message"),
    [
        ((1980, 1500), "need 0 < min <= max"),
        ((0, 1500), "need 0 < min <= max"),
        ((1500,), "must be \\(min MHz, max MHz\\)"),
        (("1500", "1980"), "must be \\(min MHz, max MHz\\)"),
        ((1500.0, 1980), "must be \\(min MHz, max MHz\\)"),
        ((True, 1980), "must be \\(min MHz, max MHz\\)"),
        (1500, "must be \\(min MHz, max MHz\\)"),
    ],
)
def test_bad_lock_is_refused(lock, message):
    with pytest.raises(OperationValueError, match=message):
        run(inventory(UUID0), lock)


def test_lock_above_the_gpus_max_clock_fails_the_host_naming_it():
    from pyinfra.api import OperationError

    with pytest.raises(OperationError) as err:
        run(inventory(UUID0, UUID1, max_mhz=1410), (1500, 1980))
    assert str(err.value) == ("clocks.locked: testhost: GPUs 0-1 (NVIDIA H100 80GB HBM3): lock_mhz 1500,1980 starts "
                              "above the GPU's max SM clock 1410 MHz")


def test_deprecated_name_is_the_same_operation():
    assert clocks.gpu_clocks is clocks.locked


def test_boot_file_keeps_a_lost_gpus_lock(caplog):
    locks = {UUID0: "1500,1980", UUID1: "1500,1980"}
    inv = gpu_inventory([{"index": 0, "uuid": UUID0, "name": "NVIDIA H100 80GB HBM3", "clocks_max_sm_mhz": 1980}],
                        lost=("00000000:19:00.0",))
    files = {**converged(locks), clocks.LOCKED: clocks.locked_text({UUID0: "1500,1980"})}
    commands, noops = run(inv, (1500, 1980), files, ACTIVE)
    assert commands == [] and noops  # GPU 1 stays in the boot file, its lock applied at boot when it is back
    assert f"GPU {UUID1} is missing" in caplog.text
