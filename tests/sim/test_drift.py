"""`gpufleet drift` end to end: a converged fleet has no drift; changes made behind the tool's back (a power limit
set with nvidia-smi, nvidia-persistenced stopped, /etc/nccl.conf edited, a MIG instance destroyed), one per host,
are listed as exactly those settings on exactly those hosts, in text and JSON, and drift changes nothing (the
changes are still there)."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import BIN, REPO, bring_up, ssh

from gpufleet.sim import hosts

INVENTORY = """from gpufleet.sim.inventory import sim_groups

MIG = [{"devices": [0], "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}]
gpu_nodes = [(name, dict(data, gpufleet_power_limit=350) if data["gpufleet_sim_profile"] == "rtx4090-1" else
              dict(data, gpufleet_mig=MIG)) for name, data in sim_groups({})["gpu_nodes"]]
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = bring_up(tmp_path_factory, ["rtx4090-1"] * 3 + ["a100-40gb-1"], driver="preinstalled")
    fleet.drift_inventory = tmp_path_factory.mktemp("drift") / "inventory.py"
    fleet.drift_inventory.write_text(INVENTORY)
    converge = subprocess.run([str(BIN / "pyinfra"), "-y", str(fleet.drift_inventory), "deploys/gpu_node.py"], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert converge.returncode == 0, converge.stdout[-3000:]
    yield fleet
    hosts.down(log=lambda *_: None)


def drift(fleet, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "gpufleet"), "drift", str(fleet.drift_inventory), *extra], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_converged_fleet_has_no_drift(fleet):
    result = drift(fleet)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == ["gpufleet drift: 0 of 4 host(s) differ from the configuration",
                                          "in sync: node01, node02, node03, node04"]


def test_changes_behind_the_tools_back_are_listed_exactly(fleet):
    ssh(fleet, "node01", "nvidia-smi -i 0 -pl 300")
    ssh(fleet, "node02", "systemctl stop nvidia-persistenced")
    ssh(fleet, "node03", "echo NCCL_DEBUG=INFO >> /etc/nccl.conf")
    ssh(fleet, "node04", "nvidia-smi mig -dci -gi 1 -i 0 && nvidia-smi mig -dgi -gi 1 -i 0")
    result = drift(fleet, "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["hosts"] == {"node01": ["GPU power limits"], "node02": ["nvidia-persistenced with persistence mode"],
                             "node03": ["/etc/nccl.conf"], "node04": ["MIG layout"]}
    assert data["settings"] == {"nvidia-persistenced with persistence mode": ["node02"], "MIG layout": ["node04"],
                                "GPU power limits": ["node01"], "/etc/nccl.conf": ["node03"]}
    assert data["in_sync"] == [] and data["unreachable"] == {}
    text = drift(fleet)
    assert text.returncode == 1
    assert "  node01: GPU power limits" in text.stdout and "  /etc/nccl.conf: node03" in text.stdout
    # drift changed nothing: the changes are all still there
    assert "300.00 W" in ssh(fleet, "node01", "nvidia-smi -q -d POWER").stdout
    assert ssh(fleet, "node02", "systemctl is-active nvidia-persistenced", check=False).stdout.strip() != "active"
    assert "NCCL_DEBUG=INFO" in ssh(fleet, "node03", "cat /etc/nccl.conf").stdout
    assert "3g.20gb          9        1" not in ssh(fleet, "node04", "nvidia-smi mig -lgi").stdout


def test_unreachable_host_means_drift_could_not_be_told(fleet):
    subprocess.run([str(BIN / "gpufleet"), "sim", "fault", "node03", "host-down"], check=True, timeout=60)
    try:
        result = drift(fleet)
    finally:
        subprocess.run([str(BIN / "gpufleet"), "sim", "fault", "node03", "clear"], check=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "[node03] Could not connect" in result.stdout
