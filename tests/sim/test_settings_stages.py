"""Persistence, power limits, NCCL and clocks stages end to end on a simulated fleet.

State is checked through the simulator (its nvidia-smi, its GPU state file), never through gpufleet's facts.
"""

from __future__ import annotations

import subprocess
import time

import pytest
from conftest import BIN, DEPLOYS, REPO, bring_up, gpufleet, grand_total, pyinfra, ssh

from gpufleet.sim import hosts
from gpufleet.sim.gpu import state as sim_state

DEPLOY = DEPLOYS / "settings_stages.py"
HOSTS = ("node01", "node02", "node03")
LOCK = "--data=settings_clocks=1200,1410"  # within every GPU of the fleet (A100: max SM 1410 MHz)
NCCL_TEXT = ["NCCL_DEBUG=WARN", "NCCL_IB_DISABLE=1", "NCCL_SOCKET_IFNAME==eth0"]
BOOT_UNITS = ("gpufleet-power-limits.service", "gpufleet-gpu-clocks.service")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = bring_up(tmp_path_factory, ["h100-sxm-8", "a100-40gb-1", "rtx4090-1"], driver="preinstalled")
    yield fleet
    hosts.down(log=lambda *_: None)


def gpus(fleet, name: str) -> list[dict]:
    """The simulator's nvidia-smi: uuid, persistence, power limit and default per GPU."""
    out = ssh(
        fleet,
        name,
        "nvidia-smi --query-gpu=uuid,persistence_mode,power.limit,power.default_limit --format=csv,noheader,nounits",
    ).stdout
    rows = [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]
    return [{"uuid": u, "persistence": p, "limit": float(lim), "default": float(d)} for u, p, lim, d in rows]


def clock_locks(fleet, name: str) -> list[tuple[int, int]]:
    """The simulated hardware's clock locks (no nvidia-smi field shows them, as on real GPUs)."""
    hw = sim_state.read_state(str(fleet.host(name).dir / "hw" / "gpus.state"))
    return [
        (int(hw[f"gpu.{i}.clocks.locked.min"]), int(hw[f"gpu.{i}.clocks.locked.max"]))
        for i in range(sim_state.gpu_count(hw))
    ]


def assert_converged(fleet, name: str) -> None:
    listed = gpus(fleet, name)
    assert listed, name
    for gpu in listed:
        assert gpu["persistence"] == "Enabled", (name, gpu)
        assert gpu["limit"] == round(gpu["default"] * 0.8), (name, gpu)
    assert clock_locks(fleet, name) == [(1200, 1410)] * len(listed)


def wait_for_boot_units(fleet, name: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    command = "systemctl is-active nvidia-persistenced " + " ".join(BOOT_UNITS)
    while True:
        result = ssh(fleet, name, command, check=False)
        if result.stdout.split() == ["active"] * 3:
            return
        assert time.monotonic() < deadline, f"{name}: boot units not active: {result.stdout}"
        time.sleep(0.2)


def test_first_run_converges(fleet):
    for name in HOSTS:  # the simulated driver starts like Ubuntu's: persistence off, default limits
        assert {g["persistence"] for g in gpus(fleet, name)} == {"Disabled"}
    started = time.monotonic()
    totals = grand_total(pyinfra(fleet, DEPLOY, LOCK).stdout)
    print(f"first run: {time.monotonic() - started:.2f} s")
    assert totals["error"] == "-" and totals["success"] == "12", totals
    for name in HOSTS:
        assert_converged(fleet, name)
        assert ssh(fleet, name, "stat -c '%a %U %G' /etc/nccl.conf").stdout.strip() == "644 root root"
        text = ssh(fleet, name, "cat /etc/nccl.conf").stdout
        assert [line for line in text.splitlines() if not line.startswith("#")] == NCCL_TEXT
        exec_start = ssh(fleet, name, "systemctl show -p ExecStart nvidia-persistenced").stdout
        assert "--persistence-mode" in exec_start and "--no-persistence-mode" not in exec_start
        assert ssh(fleet, name, "systemctl is-enabled " + " ".join(BOOT_UNITS)).stdout.split() == ["enabled"] * 2


def test_second_run_changes_nothing(fleet):
    started = time.monotonic()
    totals = grand_total(pyinfra(fleet, DEPLOY, LOCK).stdout)
    print(f"no-op run: {time.monotonic() - started:.2f} s")
    assert totals["success"] == "-" and totals["error"] == "-", totals


def test_persistence_switched_off_behind_our_back_is_seen_through_the_gpu(fleet):
    ssh(fleet, "node02", "nvidia-smi -pm 0")  # the unit still runs; only the GPU says Disabled
    assert gpus(fleet, "node02")[0]["persistence"] == "Disabled"
    totals = grand_total(pyinfra(fleet, DEPLOY, LOCK, "--limit", "node02").stdout)
    assert totals["success"] == "1", totals  # the persistence stage restarted the daemon, nothing else
    assert gpus(fleet, "node02")[0]["persistence"] == "Enabled"


def test_reboot_restores_settings_without_rerunning_the_deploy(fleet):
    for name in HOSTS:
        gpufleet("sim", "reboot", name)
    for name in HOSTS:
        wait_for_boot_units(fleet, name)
        assert_converged(fleet, name)
        journal = ssh(fleet, name, "journalctl -b --no-pager -u gpufleet-power-limits.service").stdout
        assert "applied" in journal  # reapplied by the boot unit in this boot


def test_run_after_reboot_changes_nothing(fleet):
    totals = grand_total(pyinfra(fleet, DEPLOY, LOCK).stdout)
    assert totals["success"] == "-" and totals["error"] == "-", totals


def test_unmanaging_resets_gpus_and_removes_files_and_units(fleet):
    args = ("--data=settings_clocks=reset", "--data=settings_power_percent=none", "--data=settings_nccl=none")
    totals = grand_total(pyinfra(fleet, DEPLOY, *args).stdout)
    assert totals["error"] == "-", totals
    for name in HOSTS:
        assert all(g["limit"] == g["default"] for g in gpus(fleet, name)), name
        assert set(clock_locks(fleet, name)) == {(0, 0)}
        gone = (
            "/etc/nccl.conf /etc/gpufleet/power-limits.conf /etc/gpufleet/gpu-clocks.conf "
            "/etc/systemd/system/gpufleet-power-limits.service /etc/systemd/system/gpufleet-gpu-clocks.service"
        )
        assert ssh(fleet, name, f"ls {gone} 2>/dev/null", check=False).stdout == "", name
    totals = grand_total(pyinfra(fleet, DEPLOY, *args).stdout)
    assert totals["success"] == "-" and totals["error"] == "-", totals


def test_uuid_not_on_a_host_fails_that_host_only(fleet):
    """Planning (--dry) refuses before anything runs; executing (-y) fails that host, the others converge."""
    bad = "--data=settings_bad_uuid_host=node02"
    message = (
        "power.limits: GPU GPU-00000000-0000-0000-0000-000000000000 is not on node02 "
        f"(its GPUs: {gpus(fleet, 'node02')[0]['uuid']})"
    )
    dry = subprocess.run(
        [str(BIN / "pyinfra"), "--dry", bad, str(fleet.inventory), str(DEPLOY)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert dry.returncode != 0 and message in dry.stdout, dry.stdout
    run = subprocess.run(
        [str(BIN / "pyinfra"), "-y", bad, str(fleet.inventory), str(DEPLOY)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert f"[node02] gpufleet: error: {message}" in run.stdout, run.stdout
    assert all(g["limit"] == g["default"] for g in gpus(fleet, "node02"))
    for name in ("node01", "node03"):
        assert all(g["limit"] == round(g["default"] * 0.8) for g in gpus(fleet, name)), name
