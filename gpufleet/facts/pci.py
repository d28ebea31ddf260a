"""NVIDIA PCI devices (GPUs, NVSwitches) from ``lspci -n -D -d 10de:``: parse, never decide.

Works without a driver: this is how gpufleet knows which GPU models a bare server has (device id ->
``catalog.by_pci_device_id``). Where ``lspci`` (pciutils) is not installed, the same lines are produced
from sysfs (``/sys/bus/pci/devices/*/{vendor,device,class,revision}``) and parsed the same way.

The same command reads the names of those device ids from the node's PCI ID database (:data:`PCI_IDS`, Debian's
``pci.ids``, which pciutils depends on): ``GV100GL [Tesla V100 SXM2 16GB]``, whose chip code gives the architecture of
a GPU no catalog knows (:mod:`gpufleet.plan.architecture`).
"""

from __future__ import annotations

import re

from pyinfra.api import FactBase

from .sections import parse_sections, section

PCI_IDS = "/usr/share/misc/pci.ids"

NVIDIA_VENDOR = "10de"
# PCI class codes (base class + subclass)
GPU_CLASSES = {"0300": "vga", "0302": "3d", "0380": "display"}
NVSWITCH_CLASS = "0680"  # "Bridge: other" - NVSwitch chips on HGX/DGX baseboards
_LINE_RE = re.compile(
    r"^(?P<address>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+"
    r"(?P<cls>[0-9a-fA-F]{4}):\s+(?P<vendor>[0-9a-fA-F]{4}):(?P<device>[0-9a-fA-F]{4})"
    r"(?:\s+\(rev\s+(?P<rev>[0-9a-fA-F]{2})\))?"
)
# sysfs fallback: print lspci -n -D's format
_SYSFS_SCRIPT = (
    "for d in /sys/bus/pci/devices/*; do "
    '[ "$(cat "$d/vendor" 2>/dev/null)" = "0x10de" ] || continue; '
    'printf "%s %s: 10de:%s (rev %s)\\n" "${d##*/}" "$(cut -c3-6 "$d/class")" '
    '"$(cut -c3-6 "$d/device")" "$(cut -c3-4 "$d/revision")"; '
    "done"
)
# the NVIDIA device lines of pci.ids for the device ids on stdin (lspci -n lines); stops at the vendor's end
_PCI_IDS_AWK = (
    "awk 'NR == FNR { split($3, a, \":\"); want[a[2]] = 1; next } "
    "/^10de / { v = 1; next } /^[0-9a-f]/ { if (v) exit } "
    "v && /^\\t[0-9a-f][0-9a-f][0-9a-f][0-9a-f] / { if (substr($0, 2, 4) in want) print substr($0, 2) }' "
    f"- {PCI_IDS}"
)
_PCI_IDS_LINE_RE = re.compile(r"^([0-9a-f]{4})\s+(\S.*)$")


def _kind(cls: str) -> str:
    if cls in GPU_CLASSES:
        return "gpu"
    if cls == NVSWITCH_CLASS:
        return "nvswitch"
    if cls == "0403":
        return "audio"
    if cls.startswith("0c"):
        return "serial-bus"  # USB / UCSI controllers on GeForce boards
    return "other"


def parse_lspci(lines: list[str]) -> list[dict]:
    """``lspci -n -D`` lines -> device dicts (NVIDIA vendor only), sorted by PCI address."""
    devices = []
    for line in lines:
        m = _LINE_RE.match(line.strip())
        if not m or m["vendor"].lower() != NVIDIA_VENDOR:
            continue
        address = m["address"].lower()
        if address.count(":") == 1:
            address = "0000:" + address
        device = m["device"].lower()
        cls = m["cls"].lower()
        devices.append({
            "address": address,
            "class": cls,
            "vendor": NVIDIA_VENDOR,
            "device": device,
            "pci_device_id": f"0x{device.upper()}10DE",  # nvidia-smi's pci.device_id form
            "revision": m["rev"].lower() if m["rev"] else None,
            "kind": _kind(cls),
        })
    return sorted(devices, key=lambda d: d["address"])


def parse_pci_ids(lines: list[str]) -> dict[str, str]:
    """pci.ids device lines (``1db1  GV100GL [Tesla V100 SXM2 16GB]``) -> {device id: name}."""
    return {m[1]: m[2].strip() for m in map(_PCI_IDS_LINE_RE.match, lines) if m}


class NvidiaPciDevices(FactBase):
    """
    NVIDIA PCI functions of the host.

    .. code:: python

        {
            "source": "lspci",          # lspci | sysfs | None
            "devices": [{"address": "0000:18:00.0", "class": "0302", "vendor": "10de", "device": "2330",
                         "pci_device_id": "0x233010DE", "revision": "a1", "kind": "gpu",
                         "pci_name": "GH100 [H100 SXM5 80GB]"}, ...],   # pci_name: None where pci.ids lacks it
            "gpus": [...],              # kind == "gpu" (class 0300 / 0302 / 0380), by address
            "nvswitches": [...],        # class 0680 bridges
            "nvswitch_present": True,
            "error": None,
        }

    GPU order is PCI address order, which is nvidia-smi's index order.
    """

    @staticmethod
    def default():
        return {"source": None, "devices": [], "gpus": [], "nvswitches": [], "nvswitch_present": False,
                "error": None}

    def command(self) -> str:
        lspci = section("lspci", "lspci -n -D -d 10de:")
        sysfs = section("sysfs", _SYSFS_SCRIPT)
        names = section("pci_ids", f"if command -v lspci >/dev/null 2>&1; then lspci -n -d 10de:; "
                                   f"else {_SYSFS_SCRIPT}; fi | {_PCI_IDS_AWK}")
        return f"if command -v lspci >/dev/null 2>&1; then {lspci}; else {sysfs}; fi; {names}"

    def process(self, output):
        sections = parse_sections(output)
        result = self.default()
        sec = sections.get("lspci") or sections.get("sysfs")
        if sec is None:
            return {**result, "error": "no output from lspci"}
        result["source"] = sec.name
        if sec.rc != 0:
            result["error"] = sec.text or f"{sec.name} exited {sec.rc}"
        devices = parse_lspci(sec.lines)
        names = parse_pci_ids(sections["pci_ids"].lines) if "pci_ids" in sections else {}
        for device in devices:
            device["pci_name"] = names.get(device["device"])
        result["devices"] = devices
        result["gpus"] = [d for d in devices if d["kind"] == "gpu"]
        result["nvswitches"] = [d for d in devices if d["kind"] == "nvswitch"]
        result["nvswitch_present"] = bool(result["nvswitches"])
        return result
