"""The simulated fleet end to end: isolation, systemd, pyinfra, the driver package, reboot physics, faults."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time

import pytest
from conftest import DEPLOYS, gpufleet, grand_total, pyinfra, ssh

from gpufleet.sim import hosts


def test_hosts_boot_with_their_own_identity(fleet):
    rows = {row["name"]: row for row in hosts.status()}
    assert {name: row["state"] for name, row in rows.items()} == {"node01": "running", "node02": "running"}
    assert rows["node01"]["gpus"] == 8 and rows["node02"]["gpus"] == 1
    assert ssh(fleet, "node01", "hostname").stdout.strip() == "node01"
    assert ssh(fleet, "node02", "hostname").stdout.strip() == "node02"
    assert ssh(fleet, "node01", "cat /etc/machine-id").stdout != ssh(fleet, "node02", "cat /etc/machine-id").stdout
    status = json.loads(gpufleet("sim", "status", "--json").stdout)
    assert [h["profile"] for h in status] == ["h100-sxm-8", "a100-40gb-1"]


def test_gpus_and_nvswitches_are_on_the_pci_bus_before_any_driver(fleet):
    node01 = ssh(fleet, "node01", "lspci -n -D -d 10de:").stdout.splitlines()
    assert sum(" 0302: 10de:2330" in line for line in node01) == 8  # H100 SXM5 3D controllers
    assert sum(" 0680: 10de:22a3" in line for line in node01) == 4  # H100 NVSwitches
    node02 = ssh(fleet, "node02", "lspci -n -D -d 10de:").stdout.splitlines()
    assert [line.split()[1:3] for line in node02] == [["0302:", "10de:20b0"]]  # A100-SXM4-40GB, no NVSwitch


def test_pyinfra_deploy_converges_then_changes_nothing(fleet):
    first = grand_total(pyinfra(fleet, DEPLOYS / "basic.py").stdout)
    assert first["error"] == "-" and first["success"] != "-"
    second = grand_total(pyinfra(fleet, DEPLOYS / "basic.py").stdout)
    assert second["success"] == "-" and second["error"] == "-", second
    assert ssh(fleet, "node01", "cat /etc/gpufleet-test/node.conf").stdout == "node=node01\n"
    assert ssh(fleet, "node02", "cat /etc/gpufleet-test/node.conf").stdout == "node=node02\n"


def test_each_host_has_its_own_filesystem(fleet):
    ssh(fleet, "node01", "echo only-here > /root/marker")
    assert ssh(fleet, "node02", "test -e /root/marker", check=False).returncode == 1
    assert ssh(fleet, "node01", "cat /root/marker").stdout == "only-here\n"


def test_systemctl_behaves_as_on_a_server(fleet):
    for name in ("node01", "node02"):
        assert ssh(fleet, name, "systemctl is-active gpufleet-test-agent").stdout.strip() == "active"
        assert ssh(fleet, name, "systemctl is-enabled gpufleet-test-agent").stdout.strip() == "enabled"
    ssh(fleet, "node01", "systemd-run --unit=probe-oneshot --wait true")


def test_nvidia_smi_appears_only_after_the_driver_package_is_installed(fleet):
    for name in ("node01", "node02"):
        assert ssh(fleet, name, "command -v nvidia-smi", check=False).returncode != 0
    pyinfra(fleet, DEPLOYS / "install_driver.py", "--limit", "node01")
    listing = ssh(fleet, "node01", "nvidia-smi -L").stdout.splitlines()
    assert len(listing) == 8 and all("NVIDIA H100 80GB HBM3" in line for line in listing)
    assert ssh(fleet, "node02", "command -v nvidia-smi", check=False).returncode != 0
    version = ssh(fleet, "node01", "nvidia-smi --query-gpu=driver_version --format=csv,noheader -i 0").stdout
    assert version.strip() == "580.95.05"
    # NVIDIA's Ubuntu packaging's unit (tests/reference/upstream: WantedBy=multi-user.target, --verbose as root, no
    # persistence flag: the daemon's default, persistence mode on); the simulated postinst starts it, enables nothing
    assert ssh(fleet, "node01", "systemctl is-enabled nvidia-persistenced", check=False).stdout.strip() == "disabled"
    assert ssh(fleet, "node01", "systemctl is-active nvidia-persistenced").stdout.strip() == "active"
    assert "Disabled" not in ssh(fleet, "node01",
                                 "nvidia-smi --query-gpu=persistence_mode --format=csv,noheader").stdout


def _query(fleet, name: str, fields: str, gpu: int = 0) -> list[str]:
    out = ssh(fleet, name, f"nvidia-smi -i {gpu} --query-gpu={fields} --format=csv,noheader,nounits").stdout
    return [v.strip() for v in out.strip().split(",")]


def test_power_limit_is_lost_at_reboot(fleet):
    ssh(fleet, "node01", "nvidia-smi -i 3 -pl 500")
    assert _query(fleet, "node01", "power.limit", gpu=3) == ["500.00"]
    refused = ssh(fleet, "node01", "nvidia-smi -i 3 -pl 800", check=False)
    assert refused.returncode != 0
    assert "is not a valid power limit which should be between 200.00 W and 700.00 W" in refused.stdout
    gpufleet("sim", "reboot", "node01")
    assert _query(fleet, "node01", "power.limit", gpu=3) == ["700.00"]


def test_reboot_from_inside_the_host_resets_gpus_and_commits_pending_mig(fleet):
    ssh(fleet, "node01", "systemctl stop nvidia-persistenced; nvidia-smi -i 1 -mig 1 && nvidia-smi mig -i 1 -cgi 19 -C")
    assert "MIG 1g.10gb" in ssh(fleet, "node01", "nvidia-smi -L").stdout
    ssh(fleet, "node01", "nvidia-smi -i 2 -pl 450")
    ssh(fleet, "node01", "systemctl reboot", check=False)
    time.sleep(1)
    hosts.wait_ready(hosts.Fleet.load(), ["node01"])
    assert _query(fleet, "node01", "power.limit,mig.mode.current", gpu=2) == ["700.00", "Disabled"]
    assert _query(fleet, "node01", "mig.mode.current", gpu=1) == ["Enabled"]
    assert "MIG 1g.10gb" not in ssh(fleet, "node01", "nvidia-smi -L").stdout  # instances never survive


def test_mig_mode_change_refused_while_a_process_holds_the_gpu(fleet):
    gpufleet("sim", "fault", "node01", "busy", "--gpu", "4")
    try:
        refused = ssh(fleet, "node01", "nvidia-smi -i 4 -mig 1", check=False)
        assert refused.returncode != 0
        assert "In use by another client" in refused.stdout
        apps = ssh(fleet, "node01", "nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader").stdout
        assert "python3" in apps
    finally:
        gpufleet("sim", "fault", "node01", "clear")
    assert _query(fleet, "node01", "mig.mode.current", gpu=4) == ["Disabled"]


def test_overheat_fault_sets_thermal_slowdown_bits(fleet):
    gpufleet("sim", "fault", "node01", "overheat", "--gpu", "5")
    try:
        temp, hw_thermal, sw_thermal = _query(
            fleet, "node01",
            "temperature.gpu,clocks_event_reasons.hw_thermal_slowdown,clocks_event_reasons.sw_thermal_slowdown", gpu=5)
        assert int(temp) >= 90 and hw_thermal == "Active" and sw_thermal == "Active"
        assert int(_query(fleet, "node01", "temperature.gpu", gpu=4)[0]) < 60
    finally:
        gpufleet("sim", "fault", "node01", "clear")
    assert int(_query(fleet, "node01", "temperature.gpu", gpu=5)[0]) < 60


def test_ecc_fault_shows_uncorrectable_errors_and_pending_remap(fleet):
    gpufleet("sim", "fault", "node01", "ecc", "--gpu", "6")
    try:
        errors, pending = _query(fleet, "node01", "ecc.errors.uncorrected.volatile.total,remapped_rows.pending", 6)
        assert int(errors) > 0 and pending.lower() in ("yes", "1")
    finally:
        gpufleet("sim", "fault", "node01", "clear")
    assert _query(fleet, "node01", "ecc.errors.uncorrected.volatile.total", 6) == ["0"]


def test_lost_gpu_answers_like_a_gpu_fallen_off_the_bus(fleet):
    gpufleet("sim", "fault", "node01", "lost", "--gpu", "7")
    try:
        out = ssh(fleet, "node01", "nvidia-smi -L", check=False)
        assert "Unable to determine the device handle for GPU0000:DB:00.0: GPU is lost" in out.stdout + out.stderr
        assert ssh(fleet, "node01", "nvidia-smi -i 0 -L").stdout.startswith("GPU 0:")
    finally:
        gpufleet("sim", "fault", "node01", "clear")
    assert len(ssh(fleet, "node01", "nvidia-smi -L").stdout.splitlines()) == 8


def test_driver_unloaded_fault(fleet):
    gpufleet("sim", "fault", "node01", "driver-unloaded")
    try:
        out = ssh(fleet, "node01", "nvidia-smi", check=False)
        assert out.returncode == 9
        assert "couldn't communicate with the NVIDIA driver" in out.stdout + out.stderr
    finally:
        gpufleet("sim", "fault", "node01", "clear")
    assert ssh(fleet, "node01", "nvidia-smi -L").returncode == 0


def test_host_down_fault_makes_sshd_unreachable(fleet):
    address = fleet.host("node02").address
    gpufleet("sim", "fault", "node02", "host-down")
    try:
        with pytest.raises(OSError):
            socket.create_connection((address, 22), timeout=2).close()
    finally:
        gpufleet("sim", "fault", "node02", "clear")
    socket.create_connection((address, 22), timeout=5).close()
    # back as it was: its default route through the fleet's NAT, and apt fetches the Debian mirror's indexes again
    # (issue 20: it used to come back with its link route only, reaching the simulator's repository but no mirror)
    assert f"default via {fleet.net}.1 dev eth0" in ssh(fleet, "node02", "ip route").stdout
    update = ssh(fleet, "node02", "apt-get update -o Acquire::Retries=0 2>&1", check=False)
    assert update.returncode == 0 and "Failed to fetch" not in update.stdout, update.stdout
    assert re.search(r"^(Get|Hit):\d+ http\S+/debian bookworm InRelease", update.stdout, re.M), update.stdout


def test_bad_input_is_refused_with_a_clear_message(fleet):
    unknown = gpufleet("sim", "up", "--hosts", "1", "--profile", "h100-pcie-99", check=False)
    assert unknown.returncode == 2
    assert "unknown hardware profile 'h100-pcie-99'" in unknown.stderr and "rtx4090-1" in unknown.stderr
    again = gpufleet("sim", "up", "--hosts", "1", check=False)
    assert again.returncode == 2 and "already up" in again.stderr
    bad_driver = gpufleet("sim", "up", "--force", "--driver", "preinstalled:123", check=False)
    assert bad_driver.returncode == 2 and "preinstalled:580" in bad_driver.stderr
    no_host = gpufleet("sim", "fault", "node09", "lost", check=False)
    assert no_host.returncode == 2 and "no simulated host 'node09'" in no_host.stderr
    # the fleet is untouched by the refused commands
    assert [row["state"] for row in hosts.status()] == ["running", "running"]


def test_zz_down_leaves_nothing_behind(fleet):
    assert hosts.down() == []
    assert hosts.leftovers() == []
    assert hosts.status() == []
    leftover = subprocess.run(["pgrep", "-af", str(hosts.sim_dir())], capture_output=True, text=True).stdout
    assert leftover == ""
    mounts = open("/proc/mounts").read()
    assert str(hosts.sim_dir()) not in mounts
