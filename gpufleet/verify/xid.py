"""NVIDIA Xid events from kernel log text (``dmesg``, ``journalctl -k``), matched to GPUs by PCI address, and what
NVIDIA's Xid catalog says of each (:func:`xid_info`: its resolution bucket and gpufleet's class of it, from
``xid_catalog.json`` beside this module; verify's ``health.xid`` and the alert rules both judge an Xid by it).

Real line shapes (the driver prints ``NVRM: Xid (PCI:DDDD:BB:DD): CODE, ...``; newer drivers add pid/name)::

    [ 1399.140323] NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000009 intr 00800000
    2026-09-14T20:30:27-0400 host kernel: NVRM: Xid (PCI:0000:01:00): 79, pid=0, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:01:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error ...
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

_XID_RE = re.compile(
    r"NVRM: Xid \(PCI:(?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):(?P<device>[0-9a-fA-F]{2})"
    r"(?:\.(?P<function>[0-9a-fA-F]))?\):\s*(?P<code>\d+)(?:,\s*(?P<message>.*))?$"
)


@dataclass(frozen=True)
class XidEvent:
    code: int
    domain: int
    bus: int
    device: int
    message: str
    line: str

    @property
    def pci(self) -> str:
        """The address as the kernel log prints it: ``0000:18:00``."""
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}"

    def matches_bus_id(self, bus_id: str | None) -> bool:
        """True when ``bus_id`` (NVML form ``00000000:18:00.0``) is this event's GPU."""
        address = parse_bus_id(bus_id)
        return address is not None and address == (self.domain, self.bus, self.device)


def parse_bus_id(bus_id: str | None) -> tuple[int, int, int] | None:
    """(domain, bus, device) of an NVML / nvidia-smi PCI bus id, None when it is not one."""
    if not bus_id:
        return None
    m = re.fullmatch(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-9a-fA-F])?", bus_id.strip())
    if not m:
        return None
    return int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16)


def parse_xid_lines(text: str | list[str] | tuple[str, ...]) -> list[XidEvent]:
    """Every Xid event in ``text`` (a string or a list of lines), in order."""
    lines = text.splitlines() if isinstance(text, str) else list(text)
    events = []
    for line in lines:
        m = _XID_RE.search(line.rstrip())
        if not m:
            continue
        events.append(XidEvent(code=int(m.group("code")), domain=int(m.group("domain"), 16),
                               bus=int(m.group("bus"), 16), device=int(m.group("device"), 16),
                               message=(m.group("message") or "").strip(), line=line.rstrip()))
    return events


UNKNOWN_CLASS = "unknown"


@dataclass(frozen=True)
class XidInfo:
    """One Xid as NVIDIA's catalog describes it (``resolution``: the Immediate Action bucket, e.g. RESET_GPU) and
    gpufleet's class of that bucket (``critical``: the GPU needs a reset, a reboot or service)."""

    code: int
    mnemonic: str | None
    resolution: str | None
    xid_class: str
    critical: bool
    means: str


@cache
def xid_catalog() -> dict[str, Any]:
    """``xid_catalog.json``: {"classes": {class: {critical, resolutions, means}}, "xids": {code: {...}}, ...}."""
    return json.loads(resources.files("gpufleet.verify").joinpath("xid_catalog.json").read_text(encoding="utf-8"))


def xid_info(code: int) -> XidInfo:
    """What the catalog says of Xid ``code``; an Xid it does not list is of class ``unknown``, not critical."""
    catalog = xid_catalog()
    row = catalog["xids"].get(str(code))
    if row is None:
        return XidInfo(code, None, None, UNKNOWN_CLASS, False, "not in NVIDIA's Xid catalog")
    for name, xid_class in catalog["classes"].items():
        if row["resolution"] in xid_class["resolutions"]:
            return XidInfo(code, row["mnemonic"], row["resolution"], name, xid_class["critical"], xid_class["means"])
    raise ValueError(f"xid_catalog.json: Xid {code}: resolution {row['resolution']!r} is in no class")


def critical_xids() -> tuple[int, ...]:
    """Every Xid of a critical class, ascending."""
    return tuple(sorted(int(code) for code in xid_catalog()["xids"] if xid_info(int(code)).critical))
