"""`gpufleet drift` end to end: a converged fleet has no drift; changes made behind the tool's back (a power limit
set with nvidia-smi, nvidia-persistenced stopped, /etc/nccl.conf edited), one per host, are listed as exactly those
settings on exactly those hosts, in text and JSON, and drift changes nothing (the changes are still there)."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import BIN, REPO, bring_up, ssh

from gpufleet.sim import hosts

INVENTORY = "inventories/sim.py"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = bring_up(tmp_path_factory, ["rtx4090-1"] * 3, driver="preinstalled")
    converge = subprocess.run([str(BIN / "pyinfra"), "-y", INVENTORY, "deploys/gpu_node.py"], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert converge.returncode == 0, converge.stdout[-3000:]
    yield fleet
    hosts.down(log=lambda *_: None)


def drift(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "gpufleet"), "drift", INVENTORY, *extra], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def test_converged_fleet_has_no_drift(fleet):
    result = drift()
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == ["gpufleet drift: 0 of 3 host(s) differ from the configuration",
                                          "in sync: node01, node02, node03"]


def test_changes_behind_the_tools_back_are_listed_exactly(fleet):
    ssh(fleet, "node01", "nvidia-smi -i 0 -pl 300")
    ssh(fleet, "node02", "systemctl stop nvidia-persistenced")
    ssh(fleet, "node03", "echo NCCL_DEBUG=INFO >> /etc/nccl.conf")
    result = drift("--json")
    assert result.returncode == 1, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["hosts"] == {"node01": ["GPU power limits"], "node02": ["nvidia-persistenced with persistence mode"],
                             "node03": ["/etc/nccl.conf"]}
    assert data["settings"] == {"nvidia-persistenced with persistence mode": ["node02"],
                                "GPU power limits": ["node01"], "/etc/nccl.conf": ["node03"]}
    assert data["in_sync"] == [] and data["unreachable"] == {}
    text = drift()
    assert text.returncode == 1
    assert "  node01: GPU power limits" in text.stdout and "  /etc/nccl.conf: node03" in text.stdout
    # drift changed nothing: the changes are all still there
    assert "300.00 W" in ssh(fleet, "node01", "nvidia-smi -q -d POWER").stdout
    assert ssh(fleet, "node02", "systemctl is-active nvidia-persistenced", check=False).stdout.strip() != "active"
    assert "NCCL_DEBUG=INFO" in ssh(fleet, "node03", "cat /etc/nccl.conf").stdout


def test_unreachable_host_means_drift_could_not_be_told(fleet):
    subprocess.run([str(BIN / "gpufleet"), "sim", "fault", "node03", "host-down"], check=True, timeout=60)
    try:
        result = drift()
    finally:
        subprocess.run([str(BIN / "gpufleet"), "sim", "fault", "node03", "clear"], check=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "[node03] Could not connect" in result.stdout
