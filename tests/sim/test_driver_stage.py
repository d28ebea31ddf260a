"""The driver stage end to end on a simulated fleet (an HGX H100 with NVSwitch, an A100 without): first run
converges, second run changes nothing, a branch change installs the other branch and leaves the reboot to the
operator, after which the new driver is loaded and the fabric manager runs again.

State is checked through the simulator (its GPU state, nvidia-smi, dpkg, systemd on the host), not through
gpufleet's own facts. The tests run in order and share the fleet.
"""

from __future__ import annotations

import time

import pytest
from conftest import DEPLOYS, bring_up, gpufleet, grand_total, pyinfra, ssh

from gpufleet.sim import hosts
from gpufleet.sim.gpu import state

DEPLOY = DEPLOYS / "driver_stage.py"
VERSIONS = {"580": "580.95.05", "570": "570.172.08"}
NVSWITCH, PLAIN = "node01", "node02"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = bring_up(tmp_path_factory, ["h100-sxm-8", "a100-40gb-1"])
    yield fleet
    hosts.down(log=lambda *_: None)


def loaded_driver(fleet, name: str) -> str | None:
    """The driver version the simulated kernel has loaded (the simulator's GPU state, as the hardware sees it)."""
    gpus = state.parse((fleet.host(name).dir / "hw" / "gpus.state").read_text())
    return gpus.get("driver.version") if gpus.get("driver.loaded") == "1" else None


def packages(fleet, name: str) -> dict[str, str]:
    """Installed NVIDIA packages -> dpkg status+version, e.g. {"nvidia-driver-580-server-open": "hi 580.95.05"}."""
    out = ssh(fleet, name, "dpkg-query -W -f='${db:Status-Abbrev}|${Package}|${Version}\\n' 'nvidia-*'").stdout
    found = {}
    for line in out.splitlines():
        status, package, version = line.split("|")
        if status.strip() in ("ii", "hi"):
            found[package] = f"{status.strip()} {version}"
    return found


def unit_state(fleet, name: str, unit: str = "nvidia-fabricmanager.service") -> str:
    return ssh(fleet, name, f"systemctl is-active {unit}", check=False).stdout.strip()


def run(fleet, *extra):
    start = time.monotonic()
    result = pyinfra(fleet, DEPLOY, *extra)
    print(f"driver stage {' '.join(extra) or 'branch 580'}: {time.monotonic() - start:.1f} s")
    return result.stdout, grand_total(result.stdout)


def assert_branch(fleet, branch: str):
    version = VERSIONS[branch]
    # Debian revisions as the packages carry them: Ubuntu-style driver "-0ubuntu1", fabric manager "-1"
    assert packages(fleet, NVSWITCH) == {
        f"nvidia-driver-{branch}-server-open": f"hi {version}-0ubuntu1",
        f"nvidia-fabricmanager-{branch}": f"hi {version}-1",
    }
    assert packages(fleet, PLAIN) == {f"nvidia-driver-{branch}-server-open": f"hi {version}-0ubuntu1"}
    holds = ssh(fleet, NVSWITCH, "apt-mark showhold").stdout.split()
    assert sorted(holds) == sorted([f"nvidia-driver-{branch}-server-open", f"nvidia-fabricmanager-{branch}"])


def test_first_run_converges(fleet):
    for name in (NVSWITCH, PLAIN):
        assert ssh(fleet, name, "command -v nvidia-smi", check=False).returncode != 0
    output, total = run(fleet)
    assert total["error"] == "-" and total["success"] == "2", output

    listing = ssh(fleet, NVSWITCH, "nvidia-smi -L").stdout.splitlines()
    assert len(listing) == 8 and all("NVIDIA H100 80GB HBM3" in line for line in listing)
    assert "NVIDIA A100-SXM4-40GB" in ssh(fleet, PLAIN, "nvidia-smi -L").stdout
    assert loaded_driver(fleet, NVSWITCH) == loaded_driver(fleet, PLAIN) == "580.95.05"
    assert_branch(fleet, "580")

    # fabric manager of the driver's version, enabled and running, on the NVSwitch host only
    assert unit_state(fleet, NVSWITCH) == "active"
    assert ssh(fleet, NVSWITCH, "systemctl is-enabled nvidia-fabricmanager").stdout.strip() == "enabled"
    assert ssh(fleet, NVSWITCH, "cat /usr/lib/gpufleet-sim/fabricmanager-version").stdout.strip() == "580.95.05"
    assert unit_state(fleet, PLAIN) != "active"
    assert ssh(fleet, PLAIN, "test -e /usr/bin/nv-fabricmanager", check=False).returncode != 0

    for name in (NVSWITCH, PLAIN):
        blacklist = ssh(fleet, name, "cat /etc/modprobe.d/blacklist-nouveau.conf").stdout.splitlines()
        assert "blacklist nouveau" in blacklist and "options nouveau modeset=0" in blacklist
        source = ssh(fleet, name, "cat /etc/apt/sources.list.d/gpufleet-nvidia.list").stdout
        # the default key: the file NVIDIA publishes in the repository directory, armored (.asc for apt)
        assert f"deb [signed-by=/etc/apt/keyrings/gpufleet-nvidia.asc] {fleet.repo_url}/ /" in source
        assert "Pin: version /^([0-9]+:)?580\\./" in ssh(fleet, name, "cat /etc/apt/preferences.d/*").stdout
    # the simulated hosts run the control machine's kernel: no headers package exists, which is reported
    assert "kernel headers: linux-headers-" in output and "is not installed and no configured repository" in output
    assert "reboot pending" not in output


def test_second_run_changes_nothing(fleet):
    output, total = run(fleet)
    assert total["success"] == "-" and total["error"] == "-", output
    assert total["no_change"] == "2"


def test_branch_change_installs_the_other_branch_and_leaves_the_reboot_pending(fleet):
    output, total = run(fleet, "--data", "gpufleet_test_driver_branch=570")
    assert total["error"] == "-" and total["success"] == "2", output
    assert_branch(fleet, "570")
    # the kernel keeps the old module until a reboot; nothing rebooted the hosts
    assert loaded_driver(fleet, NVSWITCH) == loaded_driver(fleet, PLAIN) == "580.95.05"
    for name in (NVSWITCH, PLAIN):
        assert f"[{name}] reboot pending: the loaded NVIDIA kernel module is not the installed driver 570.172.08" in (
            output
        )
    assert "[node01] nvidia-fabricmanager.service starts after the reboot" in output

    # still pending on the next run: reported again, nothing changed
    output, total = run(fleet, "--data", "gpufleet_test_driver_branch=570")
    assert total["success"] == "-" and total["error"] == "-", output
    assert "reboot pending" in output


def test_after_the_reboot_the_new_driver_and_fabric_manager_run(fleet):
    for name in (NVSWITCH, PLAIN):
        gpufleet("sim", "reboot", name)
    assert loaded_driver(fleet, NVSWITCH) == loaded_driver(fleet, PLAIN) == "570.172.08"
    version = ssh(fleet, NVSWITCH, "nvidia-smi --query-gpu=driver_version --format=csv,noheader -i 0").stdout
    assert version.strip() == "570.172.08"
    deadline = time.monotonic() + 30
    while unit_state(fleet, NVSWITCH) != "active" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert unit_state(fleet, NVSWITCH) == "active"
    assert ssh(fleet, NVSWITCH, "cat /usr/lib/gpufleet-sim/fabricmanager-version").stdout.strip() == "570.172.08"

    output, total = run(fleet, "--data", "gpufleet_test_driver_branch=570")
    assert total["success"] == "-" and total["error"] == "-", output
    assert "reboot pending" not in output


def test_flavour_change_flags_the_reboot_the_version_cannot_show(fleet):
    flavour = ("--data", "gpufleet_test_driver_branch=570", "--data", "gpufleet_test_driver_flavour=proprietary")
    output, total = run(fleet, *flavour, "--limit", PLAIN)
    assert total["error"] == "-" and total["success"] == "1", output
    assert packages(fleet, PLAIN) == {"nvidia-driver-570-server": "hi 570.172.08-0ubuntu1"}
    assert f"[{PLAIN}] reboot pending: the system flags a pending reboot (/var/run/reboot-required)" in output
    gpufleet("sim", "reboot", PLAIN)
    output, total = run(fleet, *flavour, "--limit", PLAIN)
    assert total["success"] == "-" and total["error"] == "-", output
    assert "reboot pending" not in output


def test_nvidias_naming_installs_the_guides_packages_with_the_pinning_package(fleet):
    """NVIDIA's driver installation guide on the simulated repository generated from the record
    (nvidia-driver-guide/facts.json): the unsuffixed metapackage, the branch's pinning package and the kernel module
    package it pulls, held; Ubuntu's names removed in the same transaction; a second run changes nothing."""
    nvidia = ("--data", "gpufleet_test_driver_style=nvidia", "--limit", PLAIN)
    output, total = run(fleet, *nvidia)
    assert total["error"] == "-" and total["success"] == "1", output
    version = f"hi {VERSIONS['580']}-1"
    assert packages(fleet, PLAIN) == {"nvidia-open": version, "nvidia-driver-pinning-580": version,
                                      "nvidia-dkms-580-open": version}
    assert sorted(ssh(fleet, PLAIN, "apt-mark showhold").stdout.split()) == [
        "nvidia-dkms-580-open", "nvidia-driver-pinning-580", "nvidia-open"]
    assert f"[{PLAIN}] reboot pending: the loaded NVIDIA kernel module is not the installed driver 580.95.05" in output
    output, total = run(fleet, *nvidia)
    assert total["success"] == "-" and total["error"] == "-", output
