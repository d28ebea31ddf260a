"""The simulated hosts' control-side pieces that need no containers."""

from __future__ import annotations

import os
import subprocess

import pytest
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory

from gpufleet.sim import hardware, hosts, network, pci, repo


def test_requirements_name_the_package_to_install(monkeypatch):
    monkeypatch.setattr(hosts.os, "geteuid", lambda: 0)
    monkeypatch.setattr(hosts.shutil, "which", lambda cmd: None if cmd in ("systemd-nspawn", "lxcfs") else "/x")
    with pytest.raises(hosts.SimError, match="missing system packages: apt-get install lxcfs systemd-container"):
        hosts.check_requirements()


def test_requirements_need_root(monkeypatch):
    monkeypatch.setattr(hosts.os, "geteuid", lambda: 1000)
    with pytest.raises(hosts.SimError, match="needs root"):
        hosts.check_requirements()


@pytest.mark.parametrize("option, branch", [(None, None), ("none", None), ("preinstalled", repo.DEFAULT_BRANCH),
                                            ("preinstalled:570", "570")])
def test_driver_option(option, branch):
    assert repo.parse_driver_option(option) == branch


@pytest.mark.parametrize("option", ["preinstalled:999", "installed", "preinstalled:"])
def test_driver_option_rejects_unknown(option):
    if option == "preinstalled:":
        assert repo.parse_driver_option(option) == repo.DEFAULT_BRANCH
        return
    allowed = "allowed none, preinstalled, preinstalled:570, preinstalled:580, preinstalled:610"
    with pytest.raises(ValueError, match=allowed):
        repo.parse_driver_option(option)


def test_network_names_fit_linux_limits_and_differ_per_fleet():
    for net in ("10.77.0", "10.77.255"):
        assert len(network.veth_name(31, net)) <= 15 and len(network.bridge_name(net)) <= 15
    assert network.netns_name("node01", "10.77.0") != network.netns_name("node01", "10.77.9")
    assert network.host_address("10.77.0", 0) == "10.77.0.11"


def _routes(ns: str) -> list[str]:
    out = subprocess.run(["ip", "-n", ns, "route", "show"], capture_output=True, text=True, check=True).stdout
    return [line.replace(" linkdown", "").strip() for line in out.splitlines()]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a network namespace")
def test_host_down_and_back_keeps_the_hosts_addresses_and_routes():
    """The 'host-down' fault and its 'clear' on a real namespace laid out as setup_host lays it (no bridge: a unit
    test must not touch a fleet's): after the link is back the host has every route it had, the default route to
    the mirror included (issue 20: it used to come back with its link route only)."""
    net, index = "10.77.ut", os.getpid() % 100000  # a tag no fleet uses (not a number): names of this test only
    ns, veth = network.netns_name(f"t{index}", net), network.veth_name(index, net)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for args in (["link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns],
                     ["link", "set", veth, "up"], ["-n", ns, "addr", "add", "10.99.7.11/24", "dev", "eth0"],
                     ["-n", ns, "link", "set", "eth0", "up"], ["-n", ns, "route", "add", "default", "via", "10.99.7.1"],
                     ["-n", ns, "route", "add", "10.98.0.0/16", "via", "10.99.7.2"]):
            subprocess.run(["ip", *args], check=True, capture_output=True)
        before = _routes(ns)
        assert "default via 10.99.7.1 dev eth0" in before
        network.set_host_link(index, net, up=False)
        link = subprocess.run(["ip", "-n", ns, "link", "show", "eth0"], capture_output=True, text=True).stdout
        assert "state DOWN" in link  # the host is cut off
        network.set_host_link(index, net, up=True)
        assert _routes(ns) == before
    finally:
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_written_inventory_loads_in_pyinfra_with_profile_groups(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_SIM_DIR", str(tmp_path))
    fleet = hosts.Fleet(
        hosts=[hosts.Host("node01", 0, "10.77.0.11", "h100-sxm-8"), hosts.Host("node02", 1, "10.77.0.12", "rtx4090-1"),
               hosts.Host("node03", 2, "10.77.0.13", "h100-sxm-8")],
        net="10.77.0", repo_url="http://10.77.0.1:8731", driver=None)
    path = tmp_path / "inventory.py"
    hosts.write_inventory(fleet, path)
    with ctx_state.use(State()):
        inventory = make_inventory(str(path), cwd=str(tmp_path))
    node02 = inventory.get_host("node02")
    assert node02.data.ssh_hostname == "10.77.0.12"
    assert node02.data.gpufleet_sim_profile == "rtx4090-1"
    assert node02.data.ssh_known_hosts_file == str(tmp_path / "known_hosts")
    assert node02.data.gpufleet_driver_repo_url == "http://10.77.0.1:8731/"
    assert sorted(h.name for h in inventory.get_group("sim_h100_sxm_8")) == ["node01", "node03"]
    assert sorted(h.name for h in inventory.get_group("gpu_nodes")) == ["node01", "node02", "node03"]


@pytest.mark.parametrize("profile", sorted(hardware.PROFILES))
def test_every_profile_has_distinct_pci_devices_for_gpus_and_nvswitches(profile, tmp_path):
    state = hardware.build_state(profile, "node01")
    pci.write_devices(state, tmp_path / "pci")
    devices = {d.name: (d / "class").read_text().strip() for d in (tmp_path / "pci").iterdir()}
    spec = hardware.PROFILES[profile]
    assert sum(cls.startswith("0x03") for cls in devices.values()) == spec.gpu_count
    assert sum(cls == "0x068000" for cls in devices.values()) == spec.nvswitch_count


def test_leftovers_count_this_fleets_mounts_not_a_sibling_fleets(monkeypatch, tmp_path):
    from pathlib import Path as RealPath

    from gpufleet.sim import cgroups, network, repo

    fleet = tmp_path / "sim"
    monkeypatch.setenv("GPUFLEET_SIM_DIR", str(fleet))
    mounts = f"overlay {fleet}/hosts/a/root overlay rw 0 0\noverlay {fleet}-2/hosts/a/root overlay rw 0 0\n"

    class FakePath(type(RealPath())):
        def read_text(self, *args, **kwargs):
            return mounts if str(self) == "/proc/mounts" else super().read_text(*args, **kwargs)

    monkeypatch.setattr(hosts, "Path", FakePath)
    monkeypatch.setattr(network, "leftovers", lambda net: [])
    monkeypatch.setattr(cgroups, "fleet_cgroups", lambda tag: [])
    monkeypatch.setattr(repo, "server_pid", lambda: None)
    assert hosts.leftovers("10.77.250") == [f"mount {fleet}/hosts/a/root"]
