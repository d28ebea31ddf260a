"""MIG stage end to end on a simulated fleet: converge, no-op, reboot, layout change, a busy GPU.

State is checked through the simulator's nvidia-smi on the hosts (``nvidia-smi mig -lgi``, ``-L``,
``--query-gpu``), never through gpufleet's own facts.
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import DEPLOYS, bring_up, gpufleet, grand_total, pyinfra, ssh

from gpufleet.sim import hosts

pytestmark = pytest.mark.sim

DEPLOY = DEPLOYS / "mig_stage.py"
H100, A100 = "node01", "node02"
MIXED = ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
# tests/sim/deploys/mig_stage.py's default layouts, as the simulator lists them (sorted profiles per GPU)
DEFAULT = {
    H100: {0: MIXED, 1: MIXED, 2: ["1g.10gb"] * 7},
    A100: {0: ["3g.20gb", "3g.20gb"]},
}
_LGI_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+\d+\s+\d+\s+\d+:\d+\s*\|$")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = bring_up(tmp_path_factory, ["h100-sxm-8", "a100-40gb-1"], driver="preinstalled")
    yield fleet
    hosts.down(log=lambda *_: None)


def gpu_instances(fleet, host: str) -> dict[int, list[str]]:
    """``nvidia-smi mig -lgi`` on the host -> {GPU index: sorted profiles}."""
    out = ssh(fleet, host, "nvidia-smi mig -lgi", check=False).stdout
    found: dict[int, list[str]] = {}
    for line in out.splitlines():
        m = _LGI_ROW.match(line.strip())
        if m:
            found.setdefault(int(m[1]), []).append(m[2])
    return {index: sorted(profiles) for index, profiles in found.items()}


def mig_devices(fleet, host: str) -> dict[int, int]:
    """``nvidia-smi -L`` -> {GPU index: number of MIG devices listed under it}."""
    counts: dict[int, int] = {}
    current = None
    for line in ssh(fleet, host, "nvidia-smi -L").stdout.splitlines():
        if line.startswith("GPU "):
            current = int(line.split()[1].rstrip(":"))
            counts[current] = 0
        elif line.strip().startswith("MIG ") and current is not None:
            counts[current] += 1
    return counts


def mig_modes(fleet, host: str) -> dict[int, str]:
    out = ssh(fleet, host, "nvidia-smi --query-gpu=index,mig.mode.current --format=csv,noheader").stdout
    return {int(i): mode.strip() for i, mode in (line.split(",") for line in out.splitlines() if line.strip())}


def main_pid(fleet, host: str, unit: str) -> str:
    return ssh(fleet, host, f"systemctl show -p MainPID --value {unit}").stdout.strip()


def active(fleet, host: str, unit: str) -> str:
    return ssh(fleet, host, f"systemctl is-active {unit}", check=False).stdout.strip()


def data(layout: dict) -> tuple[str, str]:
    return "--data", "mig_layout=" + json.dumps({str(k): v for k, v in layout.items()})


def test_first_run_converges(fleet):
    fm_before = main_pid(fleet, H100, "nvidia-fabricmanager.service")
    result = pyinfra(fleet, DEPLOY)
    assert grand_total(result.stdout)["error"] == "-", result.stdout
    for host, layout in DEFAULT.items():
        assert gpu_instances(fleet, host) == layout
    assert mig_modes(fleet, H100) == {i: "Enabled" if i < 3 else "Disabled" for i in range(8)}
    assert mig_devices(fleet, H100) == {0: 4, 1: 4, 2: 7, 3: 0, 4: 0, 5: 0, 6: 0, 7: 0}
    assert mig_modes(fleet, A100) == {0: "Enabled"}
    assert mig_devices(fleet, A100) == {0: 2}
    # the fabric manager held the H100s: it was stopped for the mode change and runs again
    assert active(fleet, H100, "nvidia-fabricmanager.service") == "active"
    assert main_pid(fleet, H100, "nvidia-fabricmanager.service") != fm_before
    for host in (H100, A100):
        assert active(fleet, host, "nvidia-persistenced.service") == "active"
        assert ssh(fleet, host, "systemctl is-enabled gpufleet-mig.service").stdout.strip() == "enabled"
        assert ssh(fleet, host, "test ! -e /run/gpufleet/mig-reboot-required", check=False).returncode == 0
    layout = json.loads(ssh(fleet, H100, "cat /etc/gpufleet/mig-layout.json").stdout)
    assert [g["pci_bus_id"] for g in layout["gpus"]] == [
        line.strip()
        for line in ssh(fleet, H100, "nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader").stdout.splitlines()
    ]


def test_second_run_reports_zero_changes(fleet):
    fm_before = main_pid(fleet, H100, "nvidia-fabricmanager.service")
    totals = grand_total(pyinfra(fleet, DEPLOY).stdout)
    assert (totals["success"], totals["error"], totals["no_change"]) == ("-", "-", "4")
    assert main_pid(fleet, H100, "nvidia-fabricmanager.service") == fm_before  # not restarted


def test_reboot_brings_the_layout_back_without_rerunning_the_deploy(fleet):
    for host in (H100, A100):
        gpufleet("sim", "reboot", host)
    for host, layout in DEFAULT.items():
        # the instances were destroyed by the power cycle: gpufleet-mig.service recreated them at boot
        assert gpu_instances(fleet, host) == layout
        out = ssh(fleet, host, "systemctl show -p ActiveState -p SubState -p Result gpufleet-mig.service").stdout
        state = dict(line.split("=", 1) for line in out.split())
        assert state == {"Result": "success", "ActiveState": "active", "SubState": "exited"}
    assert mig_devices(fleet, H100)[2] == 7
    assert active(fleet, H100, "nvidia-fabricmanager.service") == "active"
    totals = grand_total(pyinfra(fleet, DEPLOY).stdout)
    # nvidia-persistenced is a unit the persistence stage (not this test) makes start at boot: started again
    assert (totals["error"], totals["no_change"]) == ("-", "2"), totals


def test_changed_layout_recreates_instances_and_disables_mig(fleet):
    layout = {0: {"1g.10gb": 7}, 1: {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}, 2: None}
    result = pyinfra(fleet, DEPLOY, "--limit", H100, *data(layout))
    assert grand_total(result.stdout)["error"] == "-", result.stdout
    assert gpu_instances(fleet, H100) == {0: ["1g.10gb"] * 7, 1: MIXED}
    assert mig_modes(fleet, H100)[2] == "Disabled"
    assert active(fleet, H100, "nvidia-fabricmanager.service") == "active"
    totals = grand_total(pyinfra(fleet, DEPLOY, "--limit", H100, *data(layout)).stdout)
    assert (totals["success"], totals["error"]) == ("-", "-")


def test_busy_gpu_needs_a_reboot_and_nothing_changes_on_it(fleet):
    layout = {0: {"1g.10gb": 7}, 1: {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}, 2: None, 3: {"7g.80gb": 1}}
    gpufleet("sim", "fault", H100, "busy", "--gpu", "3")
    try:
        before = (gpu_instances(fleet, H100), mig_modes(fleet, H100))
        fm_before = main_pid(fleet, H100, "nvidia-fabricmanager.service")
        result = pyinfra(fleet, DEPLOY, "--limit", H100, *data(layout))
        out = result.stdout
        assert grand_total(out)["error"] == "-", out
        assert re.search(
            r"GPU 3 \(\S+, NVIDIA H100 80GB HBM3\): MIG mode is Disabled \(pending Disabled\), the "
            r"layout needs Enabled: in use by pid \d+ \(python3\)\. Reboot required",
            out,
        ), out
        assert "GPU 0 (" not in out and "GPU 1 (" not in out
        # nothing changed on GPU 3 (nor elsewhere), and the fabric manager was not stopped for nothing
        assert (gpu_instances(fleet, H100), mig_modes(fleet, H100)) == before
        assert mig_modes(fleet, H100)[3] == "Disabled"
        assert main_pid(fleet, H100, "nvidia-fabricmanager.service") == fm_before
        assert ssh(fleet, H100, "cut -f1 /run/gpufleet/mig-reboot-required").stdout.split() == ["3"]
    finally:
        gpufleet("sim", "fault", H100, "clear")
    # the reboot it asked for: the boot unit switches GPU 3 and creates its instance
    gpufleet("sim", "reboot", H100)
    assert mig_modes(fleet, H100)[3] == "Enabled"
    assert gpu_instances(fleet, H100) == {0: ["1g.10gb"] * 7, 1: MIXED, 3: ["7g.80gb"]}
    assert active(fleet, H100, "nvidia-fabricmanager.service") == "active"
    totals = grand_total(pyinfra(fleet, DEPLOY, "--limit", H100, *data(layout)).stdout)
    assert totals["error"] == "-" and totals["success"] in ("-", "1"), totals  # only persistenced started
