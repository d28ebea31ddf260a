"""GpuInventory on one simulated host per driver generation: 580 (no kmd_version, like 590) and 610 (kmd_version,
driver_version deprecated but still answered, so the fact's one query asks driver_version on both), read over SSH
by pyinfra and judged by the simulator's own state file.

The 610 host is a GB200 compute tray (gb200-4), so the new profile is brought up end to end as well.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import BIN, REPO, bring_up, ssh

from gpufleet.sim import hosts
from gpufleet.sim.gpu import state as simstate

GENERATIONS = {"580": ("a100-40gb-1", False), "610": ("gb200-4", True)}  # profile, knows kmd_version


@pytest.fixture(scope="module", params=sorted(GENERATIONS))
def generation(request, tmp_path_factory):
    branch = request.param
    profile, knows_kmd = GENERATIONS[branch]
    fleet = bring_up(tmp_path_factory, [profile], driver=f"preinstalled:{branch}")
    yield fleet, branch, knows_kmd
    hosts.down(log=lambda *_: None)


def gpu_inventory(fleet) -> dict:
    result = subprocess.run(
        [str(BIN / "pyinfra"), "--json", str(fleet.inventory), "fact", "gpufleet.facts.nvidia.GpuInventory"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)["gpufleet.facts.nvidia.GpuInventory"]["node01"]


def test_inventory_reads_the_driver_version_on_each_generation(generation):
    fleet, branch, knows_kmd = generation
    state = simstate.parse(ssh(fleet, "node01", f"cat {simstate.DEFAULT_PATH}").stdout)
    fact = gpu_inventory(fleet)
    assert fact["status"] == "ok", fact
    assert fact["driver_version_field"] == "driver_version"
    assert state["driver.version"].startswith(branch + ".")
    assert fact["driver_version"] == state["driver.version"]
    count = int(state["gpu.count"])
    assert [(g["index"], g["uuid"], g["name"], g["driver_version"]) for g in fact["gpus"]] == [
        (i, state[f"gpu.{i}.uuid"], state[f"gpu.{i}.name"], state["driver.version"]) for i in range(count)]
    # the host's own nvidia-smi draws the line the fact relies on
    kmd = ssh(fleet, "node01", "nvidia-smi --query-gpu=kmd_version --format=csv,noheader -i 0", check=False)
    if knows_kmd:
        assert (kmd.returncode, kmd.stdout.strip()) == (0, state["driver.version"])
    else:
        assert kmd.returncode != 0 and 'Field "kmd_version" is not a valid field to query.' in kmd.stdout
