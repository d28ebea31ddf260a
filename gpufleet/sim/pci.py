"""The simulated hosts' NVIDIA PCI devices: a sysfs-style tree that `lspci` reads like the real one.

A container shows the control machine's PCI devices; a GPU server shows its GPUs and NVSwitches even before
any driver is installed. ``write_devices`` lays out ``/sys/bus/pci/devices/<address>/{config,vendor,device,
class,...}`` for the host's GPUs (from its state file) and NVSwitches in the host's hardware directory, and a
boot unit inside the host bind-mounts it over ``/sys/bus/pci/devices`` before anything runs.
"""

from __future__ import annotations

import struct
from pathlib import Path

from .gpu import state as gpu_state
from .hosts_paths import HW_MOUNT

NVIDIA = 0x10DE
CLASS_3D = 0x030200  # datacenter GPUs: 3D controller
CLASS_VGA = 0x030000  # GeForce: VGA compatible controller
CLASS_BRIDGE = 0x068000  # NVSwitch: bridge
# NVSwitch device ids by GPU architecture: H100 NVSwitch 22a3 and A100 NVSwitch 1af1 as lspci shows them on
# HGX boards; the Blackwell NVLink switch id is unverified.
NVSWITCH_DEVICE = {"Hopper": 0x22A3, "Ampere": 0x1AF1, "Blackwell": 0x2901}
# NVSwitch bus numbers: HGX H100/H200 boards put them at 05-08; DGX A100 at c4-c9 (its GPUs use 07 and 0f).
NVSWITCH_BUSES = {"Ampere": (0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9)}
DEFAULT_NVSWITCH_BUSES = (0x05, 0x06, 0x07, 0x08, 0x09, 0x0A)
UNIT = "gpufleet-sim-pci.service"
UNIT_TEXT = f"""\
[Unit]
Description=Simulated hardware: NVIDIA PCI devices
DefaultDependencies=no
Before=sysinit.target
ConditionPathIsDirectory={HW_MOUNT}/pci

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/mount --bind -o ro {HW_MOUNT}/pci /sys/bus/pci/devices

[Install]
WantedBy=sysinit.target
"""


def _device(root: Path, address: str, device_id: int, cls: int, sub_device: int) -> None:
    path = root / address
    path.mkdir(parents=True)
    config = bytearray(256)
    struct.pack_into("<HH", config, 0, NVIDIA, device_id)
    config[8] = 0xA1  # revision
    config[9:12] = cls.to_bytes(3, "little")
    struct.pack_into("<HH", config, 0x2C, NVIDIA, sub_device)
    (path / "config").write_bytes(bytes(config))
    for name, value in (("vendor", f"0x{NVIDIA:04x}"), ("device", f"0x{device_id:04x}"), ("class", f"0x{cls:06x}"),
                        ("subsystem_vendor", f"0x{NVIDIA:04x}"), ("subsystem_device", f"0x{sub_device:04x}"),
                        ("revision", "0xa1"), ("irq", "0"), ("numa_node", "-1")):
        (path / name).write_text(value + "\n")
    (path / "resource").write_text("0x0000000000000000 0x0000000000000000 0x0000000000000000\n" * 13)


def _address(nvml_bus_id: str) -> str:
    """NVML's ``00000000:18:00.0`` → sysfs' ``0000:18:00.0``."""
    domain, rest = nvml_bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def write_devices(state: dict[str, str], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    architecture = ""
    for index in range(gpu_state.gpu_count(state)):
        gpu = gpu_state.gpu(state, index)
        architecture = gpu.get("architecture", "")
        cls = CLASS_VGA if gpu.get("brand") == "GeForce" else CLASS_3D
        _device(dest, _address(gpu["pci.bus_id"]), int(gpu["pci.device_id"], 16) >> 16, cls,
                int(gpu.get("pci.sub_device_id", "0x0"), 16) >> 16)
    taken = {path.name for path in dest.iterdir()}
    buses = [b for b in NVSWITCH_BUSES.get(architecture, DEFAULT_NVSWITCH_BUSES) if f"0000:{b:02x}:00.0" not in taken]
    for bus in buses[: int(state.get("nvswitch.count", "0"))]:
        _device(dest, f"0000:{bus:02x}:00.0", NVSWITCH_DEVICE.get(architecture, 0x22A3), CLASS_BRIDGE, 0x1796)


def install_mount_unit(root: Path) -> None:
    """Install the boot unit into a host's root (before it boots)."""
    units = root / "etc/systemd/system"
    (units / "sysinit.target.wants").mkdir(parents=True, exist_ok=True)
    (units / UNIT).write_text(UNIT_TEXT)
    link = units / "sysinit.target.wants" / UNIT
    if not link.is_symlink():
        link.symlink_to(f"/etc/systemd/system/{UNIT}")
