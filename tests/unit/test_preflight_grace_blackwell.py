"""Preflight on Grace Blackwell nodes (GB200, GB300): the rules that need the catalog to know these GPUs.

A bare node is known from lspci only (the PCI ids and bus addresses below are the real trays' of qx-gb200.xml /
qx-gb300.xml, class 0302 like every NVIDIA datacenter GPU); a node with the driver from nvidia-smi (the GPU dicts
carry the real -q -x values of the same captures).
"""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET

import pytest
from pyinfra_harness import fixture, wrap
from reference import CAPTURES

from gpufleet.config import load_node_config
from gpufleet.facts import NvidiaPciDevices, OsInfo, SecureBoot
from gpufleet.preflight import HostFacts, choose_kernel_flavour, host_gpus, preflight, required_kernel_flavour

GB200 = "NVIDIA GB200"
GB300 = "NVIDIA GB300"


def bare_node(device_id: str, buses: tuple[str, ...]) -> HostFacts:
    lspci = "\n".join(f"{bus}.0 0302: 10de:{device_id} (rev a1)" for bus in buses)
    return HostFacts(
        os=OsInfo().process(wrap("os-release", fixture("os_release_ubuntu_2204.txt")) + wrap("kernel", "6.8.0-1")),
        secure_boot=SecureBoot().process(wrap("mokutil", "SecureBoot disabled") + wrap("efi", "uefi")),
        pci=NvidiaPciDevices().process(wrap("lspci", lspci)))


def gb200_tray() -> HostFacts:
    return bare_node("2941", ("0000:29:00", "0000:3f:00", "0000:9c:00", "0000:b2:00"))


def gb300_tray(device_id: str = "31c2") -> HostFacts:
    return bare_node(device_id, ("0008:06:00", "0009:06:00", "0018:06:00", "0019:06:00"))


def with_driver(xml_name: str) -> HostFacts:
    """The node once the driver answers: GpuInventory's GPU dicts filled from the real -q -x of the tray."""
    root = ET.parse(CAPTURES / xml_name).getroot()
    gpus = []
    for i, gpu in enumerate(root.findall("gpu")):
        power = gpu.find("gpu_power_readings")
        watts = {k: float(power.findtext(f"{k}_power_limit").split()[0]) for k in ("default", "min", "max")}
        gpus.append({"index": i, "name": gpu.findtext("product_name"), "uuid": gpu.findtext("uuid"),
                     "pci_bus_id": gpu.get("id"), "pci_device_id": "0x" + gpu.findtext("pci/pci_device_id"),
                     "driver_version": root.findtext("driver_version"), "power_default_w": watts["default"],
                     "power_min_w": watts["min"], "power_max_w": watts["max"],
                     "power_limit_w": watts["default"], "mig_current": "Disabled", "mig_pending": "Disabled"})
    facts = gb200_tray() if "gb200" in xml_name else gb300_tray()
    inventory = {"status": "ok", "error": None, "exit_code": 0, "driver_version": gpus[0]["driver_version"],
                 "driver_version_field": "driver_version", "lost_gpus": [], "gpus": gpus}
    return dataclasses.replace(facts, gpu_inventory=inventory)


def messages(data: dict, facts: HostFacts) -> list[str]:
    return [e.message for e in preflight("node01", load_node_config("node01", data), facts)]


def open_only(name: str, gpus: str = "GPUs 0-3") -> list[str]:
    return [f"node01: gpufleet_driver_flavour='proprietary' on {gpus} ({name}): proprietary kernel modules "
            "requested; allowed: open or auto (Blackwell GPUs work only with NVIDIA's open kernel modules)"]


@pytest.mark.parametrize(("facts", "key", "name"), [
    (gb200_tray, "gb200", GB200), (gb300_tray, "gb300", GB300), (lambda: gb300_tray("31c3"), "gb300", GB300)],
    ids=["gb200", "gb300", "gb300-31c3"])
def test_bare_grace_blackwell_node_is_known_from_lspci(facts, key, name):
    gpus = host_gpus(facts())
    assert [(g.index, g.source, g.model.key) for g in gpus] == [(i, "pci", key) for i in range(4)]
    assert messages({"gpufleet_driver_flavour": "proprietary"}, facts()) == open_only(name)
    assert messages({"gpufleet_driver_flavour": "auto"}, facts()) == []
    assert messages({"gpufleet_driver_flavour": "open"}, facts()) == []


@pytest.mark.parametrize(("xml_name", "name"), [("qx-gb200.xml", GB200), ("qx-gb300.xml", GB300)])
def test_grace_blackwell_node_with_driver_refuses_proprietary(xml_name, name):
    facts = with_driver(xml_name)
    assert {g.source for g in host_gpus(facts)} == {"nvidia-smi"}
    assert messages({"gpufleet_driver_flavour": "proprietary"}, facts) == open_only(name)


def test_auto_chooses_open_on_grace_blackwell():
    models = [g.model for g in host_gpus(gb200_tray())] + [g.model for g in host_gpus(gb300_tray())]
    assert required_kernel_flavour(models) == "open"
    assert choose_kernel_flavour("auto", models) == "open"


def test_power_range_of_gb200_is_the_real_one():
    assert messages({"gpufleet_power_limit": 1300}, with_driver("qx-gb200.xml")) == [
        f"node01: gpufleet_power_limit=1300 W on GPUs 0-3 ({GB200}): outside this GPU's power limit range; "
        "allowed: 200-1200 W"]
    assert messages({"gpufleet_power_limit": "110%"}, gb300_tray()) == [
        f"node01: gpufleet_power_limit=110% on GPUs 0-3 ({GB300}): outside this GPU's power limit range (110% of "
        "the default limit is 1540 W); allowed: 200-1400 W"]
    assert messages({"gpufleet_power_limit": 1000}, gb200_tray()) == []


def test_mig_layout_on_gb200_is_checked_against_its_table():
    layout = {"gpufleet_mig": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.23gb": 8}}]}
    assert messages(layout, gb200_tray()) == [
        f"node01: gpufleet_mig[0].mig-devices['1g.23gb']=8 on GPUs 0-3 ({GB200}): too many instances; allowed: at "
        f"most 7 instance(s) of 1g.23gb on {GB200}"]
    # NVIDIA's own all-balanced layout for GB200 (mig-parted config-default.yaml) fits
    balanced = {"gpufleet_mig": [{"devices": "all", "mig-enabled": True,
                                  "mig-devices": {"1g.23gb": 2, "2g.47gb": 1, "3g.93gb": 1}}]}
    assert messages(balanced, gb200_tray()) == []
