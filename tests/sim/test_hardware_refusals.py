"""What a GPU cannot take is refused at preflight, before any host changes, on bare simulated hosts: a driver
branch newer than the last that supports Volta on the V100 host, and a MIG layout on the L4 host (an L4 has no
MIG). Both hosts are checked untouched through the simulator (its hosts' files and packages), not through
gpufleet's facts."""

from __future__ import annotations

import subprocess

import pytest
from conftest import BIN, REPO, bring_up, save_deb_cache, ssh
from test_gpu_node import untouched

from gpufleet.facts import NvidiaPciDevices
from gpufleet.sim import hosts

INVENTORY = REPO / "inventories" / "sim.py"
DEPLOY = REPO / "deploys" / "gpu_node.py"
PROFILES = ["v100-16gb-8", "l4-1"]
V100, L4 = "node01", "node02"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = bring_up(tmp_path_factory, PROFILES)
    yield fleet
    save_deb_cache(fleet)
    hosts.down(log=lambda *_: None)


def run_gpu_node(tmp_path, data: str) -> subprocess.CompletedProcess:
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "gpu_nodes.py").write_text(data)
    return subprocess.run([str(BIN / "pyinfra"), "-y", "--group-data", str(tmp_path / "group_data"),
                           str(INVENTORY), str(DEPLOY)], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=900)


def test_bare_hosts_name_their_chips_from_debians_pci_ids(fleet):
    """The simulated hosts have Debian's pci.ids as a real Debian node does (pciutils depends on it); gpufleet's one
    PCI command names each GPU's chip from it, before any driver exists."""
    assert ssh(fleet, V100, "dpkg-query -W -f '${Status}' pci.ids").stdout == "install ok installed"
    names = {}
    for name in (V100, L4):
        fact = NvidiaPciDevices().process(ssh(fleet, name, NvidiaPciDevices().command()).stdout.splitlines())
        names[name] = {g["pci_name"] for g in fact["gpus"]}
    assert names == {V100: {"GV100GL [Tesla V100 SXM2 16GB]"}, L4: {"AD104GL [L4]"}}


def test_branch_590_on_the_v100_host_is_refused_before_any_change(fleet, tmp_path):
    result = run_gpu_node(tmp_path, 'gpufleet_driver_branch = "590"\n')
    assert result.returncode != 0
    assert ("node01: gpufleet_driver_branch='590' on GPUs 0-7 (Tesla V100-SXM2-16GB): driver branch 590 does not "
            "support Volta GPUs; allowed: 580 or an older branch (NVIDIA: the 580 series is the last to support "
            "Volta GPUs)") in result.stdout, result.stdout[-4000:]
    assert "node02: gpufleet_driver_branch='590' on GPU" not in result.stdout  # Ada: 590 supports it
    assert "no host was changed" in result.stdout
    assert untouched(fleet, V100) and untouched(fleet, L4)


def test_mig_layout_on_the_l4_host_is_refused_at_preflight(fleet, tmp_path):
    layout = ('gpufleet_mig = [{"devices": "all", "device-filter": ["0x27B810DE"], "mig-enabled": True, '
              '"mig-devices": {"1g.6gb": 4}}]\n')
    result = run_gpu_node(tmp_path, layout)
    assert result.returncode != 0
    assert "node02: gpufleet_mig[0].mig-enabled=True on GPU 0 (NVIDIA L4): MIG requested on a GPU without MIG" \
           in result.stdout, result.stdout[-4000:]
    assert "profiles are unknown" not in result.stdout
    assert "no host was changed" in result.stdout
    assert untouched(fleet, V100) and untouched(fleet, L4)
