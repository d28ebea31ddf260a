"""Simulated hardware profiles: which GPUs a simulated host has, and its initial GPU state file.

``build_state(profile, hostname)`` returns the full state (keys of gpufleet/sim/gpu/STATE.md) of a freshly
powered host with no driver loaded. Models come from the GPU catalog; idle readings (power draw,
temperatures, clocks, P-state) follow the real idle captures in reference/captures (H100: 69.85 W, 41 C,
P0, SM 345 MHz, memory clock at max, event reasons 0x1). Identities (UUIDs, serials, bus ids) are
deterministic functions of the host name and GPU index, so a rebuilt host keeps its GPUs.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

from gpufleet.catalog import GpuModel, MigProfile, PowerLimits, load_catalog

SCHEMA = "1"


@dataclass(frozen=True)
class Profile:
    name: str
    model_key: str
    gpu_count: int
    nvswitch_count: int
    description: str
    # per GPU: which of the model's power-limit board variants (catalog power_limits_w) it is; default the first
    power_variants: tuple[int, ...] = ()

    def power_limits(self, model: GpuModel, index: int) -> PowerLimits:
        variants = self.power_variants
        return model.power_limits_w[variants[index] if index < len(variants) else 0]


class UnknownProfile(ValueError):
    """No hardware profile of that name; the message lists the known ones."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"unknown hardware profile {name!r}; known profiles: {', '.join(sorted(PROFILES))}")


_PROFILE_LIST = [
    Profile("h100-sxm-8", "h100-sxm", 8, 4, "HGX H100 8-GPU: 8x H100 80GB HBM3 SXM5, 4 NVSwitch (DGX H100 class)"),
    Profile("h200-8", "h200", 8, 4, "HGX H200 8-GPU: 8x H200 141GB SXM, 4 NVSwitch"),
    Profile("a100-80gb-8", "a100-sxm4-80gb", 8, 6, "HGX A100 8-GPU: 8x A100-SXM4-80GB, 6 NVSwitch (DGX A100 class)"),
    Profile("a100-40gb-1", "a100-sxm4-40gb", 1, 0, "1x A100-SXM4-40GB, no NVSwitch (cloud VM, e.g. a2-highgpu-1g)"),
    Profile("l40s-4", "l40s", 4, 0, "4x L40S PCIe, no NVLink"),
    Profile("rtx4090-1", "rtx4090", 1, 0, "1x GeForce RTX 4090 workstation"),
    # pre-Turing (closed kernel modules only, last branch 580) and a GPU whose MIG Mode is N/A
    # the boards' minimum power limits as in the real 8x V100 server: 150 W on GPUs 0, 4, 6, 7, 100 W on the others
    Profile("v100-16gb-8", "v100-sxm2-16gb", 8, 0, "8x Tesla V100-SXM2-16GB, no NVSwitch (DGX-1 class)",
            (0, 1, 1, 1, 0, 1, 0, 0)),
    Profile("l4-1", "l4", 1, 0, "1x NVIDIA L4 PCIe (cloud VM, e.g. g2-standard-8)"),
    Profile("b200-8", "b200", 8, 2, "HGX B200 8-GPU: 8x B200, 2 NVLink Switch chips (DGX B200 class)"),
    # A compute tray sees no NVSwitch on its PCI bus (the switches sit in separate NVLink switch trays), so the
    # simulated host has neither NVLink nor fabric manager.
    Profile("gb200-4", "gb200", 4, 0, "GB200 NVL compute tray: 4x GB200 on 2 Grace Blackwell superchips"),
    # model_key is unused without GPUs; a server of the fleet that is no GPU node (monitoring, login)
    Profile("cpu-only", "h100-sxm", 0, 0, "a server without GPUs (e.g. the monitoring host)"),
]

# PCI bus numbers as on real boards (HGX H100/H200 baseboards, DGX A100, DGX B200, 4-GPU PCIe servers)
_BUS_IDS = {
    ("Hopper", 8): ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"],
    ("Ampere", 8): ["07", "0F", "47", "4E", "87", "90", "B7", "BD"],
    ("Blackwell", 8): ["1B", "43", "52", "61", "9D", "C3", "D1", "DF"],
    ("Blackwell", 4): ["29", "3F", "9C", "B2"],  # real 4x GB200 tray (qx-gb200.xml)
    ("Volta", 8): ["04", "05", "06", "07", "08", "09", "0A", "0B"],  # real 8x V100 VM (00000000:00:04.0 ...)
    4: ["17", "65", "CA", "E3"],
    2: ["17", "CA"],
    1: ["01"],
}
# idle readings per architecture (real idle captures where available: H100 / H200 / L40S / RTX 4080 SUPER)
_IDLE = {
    "Hopper": {"pstate": "P0", "sm": 345, "video": 765, "temp": 33, "mem_temp": 40, "pcie_idle_gen": None},
    "Blackwell": {"pstate": "P0", "sm": 345, "video": 765, "temp": 31, "mem_temp": 36, "pcie_idle_gen": None},
    "Ampere": {"pstate": "P0", "sm": 210, "video": 585, "temp": 30, "mem_temp": 33, "pcie_idle_gen": None},
    "Ada Lovelace": {"pstate": "P8", "sm": 210, "video": 1185, "temp": 34, "mem_temp": None, "pcie_idle_gen": 1},
    "Volta": {"pstate": "P0", "sm": 135, "video": 555, "temp": 37, "mem_temp": 33, "pcie_idle_gen": None},
}
_IDLE_DRAW_W = {"h100-sxm": 69.85, "h200": 77.71, "b200": 142.5, "a100-sxm4-80gb": 61.2, "a100-sxm4-40gb": 54.3,
               "v100-sxm2-16gb": 44.5, "l4": 16.47}
_VBIOS = {"Ampere": "92.00.45.00.03", "Hopper": "96.00.A5.00.01", "Blackwell": "97.00.FA.00.09",
          "Ada Lovelace": "95.02.3C.40.5E"}  # fmt: skip
_NVLINK_SPEED = {"Ampere": "25.781", "Hopper": "26.562", "Blackwell": "53.125"}
# per architecture, or per model where a real board says otherwise (a real L4: 33 C current + 53 C T.Limit)
_MAX_OPERATING_C = {"Hopper": 87, "Blackwell": 87, "Ampere": 85, "Ada Lovelace": 88, "l4": 86}
# HBM's own limit where nvidia-smi prints it absolute (real 8x V100 550.127.05: "Memory Max Operating Temp : 85 C")
_MEMORY_MAX_OPERATING_C = {"Volta": 85}
# fallbacks for models whose catalog entry lacks a captured value (listed in the sim's documentation)
_FALLBACK_SUBSYS = {"a100-sxm4-80gb": 0x147F10DE, "h200": 0x18BE10DE, "rtx4090": 0x16F010DE}

# Board identity as real nvidia-smi prints it per model (Board / GPU Part Number, Inforom Image / OEM / ECC object,
# row-remapper histogram max banks): the 590.48.01 H100 / H200 captures (reference/captures) and the real
# `nvidia-smi -q -x` of NVIDIA/k8s-test-infra (qx-b200 / qx-a100 / qx-l40s / qx-gb200.xml). Models absent here keep
# the H100 capture's values (smi_fields DEFAULTS).
_IDENTITY = {
    "h100-sxm": ("692-2G520-0200-000", "2330-885-A1", "G520.0200.00.05", "2.1", "7.16", 2560),
    "h200": ("695-2G520-0280-001", "2335-895-A1", "G520.0280.02.02", "2.1", "7.16", 3072),
    "b200": ("692-2G525-0220-500", "2901-886-A1", "G525.0220.00.03", "2.1", "7.16", 3840),
    "a100-sxm4-40gb": ("692-2G506-0200-003", "20B0-884-A1", "G506.0200.00.04", "2.0", "6.16", 640),
    "l40s": ("900-2G133-A880-000", "26B9-896-A1", "G133.0242.00.03", "2.1", "6.16", 192),
    "gb200": ("900-2G548-A801-000", "2941-892-A1", "G548.0201.00.06", "2.1", "7.16", 3968),
    "v100-sxm2-16gb": ("900-2G503-0300-000", "1DB1-895-A1", "G503.0201.00.03", "1.1", "5.0", 0),
    "l4": ("900-2G193-0000-000", "27B8-895-A1", "G193.0200.00.01", "2.1", "6.16", 96),
}

PROFILES: dict[str, Profile] = {p.name: p for p in _PROFILE_LIST}


def _seed(hostname: str, index: int, what: str) -> int:
    digest = hashlib.sha256(f"gpufleet-sim:{hostname}:{index}:{what}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def gpu_uuid(hostname: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"gpu{index}.{hostname}.gpufleet-sim"))


def gpu_serial(hostname: str, index: int) -> str:
    return str(1650000000000 + _seed(hostname, index, "serial") % 10**10)


def bus_ids(architecture: str, count: int) -> list[str]:
    table = _BUS_IDS.get((architecture, count)) or _BUS_IDS.get(count)
    if table is None:
        table = [f"{0x18 + 0x10 * i:02X}" for i in range(count)]
    return [f"00000000:{bus}:00.0" for bus in table]


def _pow2_at_least(n: int) -> int:
    size = 1
    while size < n:
        size *= 2
    return size


def _attr(model: GpuModel, name: str, default=None):
    value = getattr(model, name, None)
    return default if value is None else value


def _gip_rows(model: GpuModel) -> dict[str, str]:
    """``mig.gip.<id>`` rows (STATE.md) from the catalog; gaps (never captured) filled proportionally."""
    mig = model.mig
    if mig is None:
        return {}
    profiles: list[MigProfile] = list(mig.gpu_instance_profiles)
    one = next((p for p in profiles if p.compute_slices == 1 and p.memory_slices == 1), profiles[0])
    rows = {}
    for p in profiles:
        same_mem = next((q.memory_mib for q in profiles if q.memory_slices == p.memory_slices and q.memory_mib), None)
        memory = p.memory_mib or same_mem or (one.memory_mib or 0) * p.memory_slices
        printed = p.memory_gib_printed or f"{memory / 1024:.2f}"
        full = p.compute_slices == mig.compute_slices
        sm = p.sm_count or (model.sm_count if full else None) or (one.sm_count or 0) * p.compute_slices
        ce = p.copy_engines if p.copy_engines is not None else (one.copy_engines or 1) * p.compute_slices
        dec = p.decoders if p.decoders is not None else (one.decoders or 0) * p.compute_slices
        jpeg = p.jpeg if p.jpeg is not None else (one.jpeg or 0) * p.compute_slices
        fields = [
            p.name, p.nvml_profile_enum, p.max_instances, memory, f"{float(printed):.2f}", p.compute_slices,
            p.memory_slices, sm, ce, dec, p.encoders or 0, jpeg, p.ofa or 0, int(p.p2p),
            ";".join(f"{start}:{size}" for start, size in p.placements),
        ]  # fmt: skip
        rows[f"mig.gip.{p.id}"] = ",".join(str(f) for f in fields)
    return rows


def _gpu_state(model: GpuModel, profile: Profile, hostname: str, index: int, bus_id: str) -> dict[str, str]:
    arch = model.architecture
    idle = _IDLE.get(arch, _IDLE["Hopper"])
    brand = _attr(model, "brand", "NVIDIA" if model.datacenter else "GeForce")
    geforce = brand == "GeForce"
    jitter = _seed(hostname, index, "idle")
    max_sm, max_mem = 2520, 10501
    max_sm = _attr(model, "clocks_max_sm_mhz", max_sm)
    max_mem = _attr(model, "clocks_max_mem_mhz", max_mem)
    max_gr = _attr(model, "clocks_max_graphics_mhz", max_sm)
    max_video = _attr(model, "clocks_max_video_mhz", int(max_gr * 0.78))
    hbm = model.memory_type.upper().startswith("HBM")
    power = profile.power_limits(model, index)
    default_mw = round(power.default_w * 1000)
    if model.key in _IDLE_DRAW_W:
        idle_w = _IDLE_DRAW_W[model.key]
    else:
        idle_w = (0.08 if geforce else 0.1) * power.default_w + (3.0 if hbm else 0.0)
    draw_mw = round(idle_w * 1000) + (jitter % 2400) - 1200
    temp = idle["temp"] + (jitter >> 12) % 7
    max_op = _MAX_OPERATING_C.get(model.key, _MAX_OPERATING_C.get(arch, 87)) + (2 if geforce else 0)
    max_op = _attr(model, "temp_max_operating_c", max_op)
    shutdown_t = _attr(model, "temp_shutdown_tlimit_c", max_op - _attr(model, "temp_shutdown_c", max_op + 8))
    slowdown_t = _attr(model, "temp_slowdown_tlimit_c", max_op - _attr(model, "temp_slowdown_c", max_op + 2))
    sub = _attr(model, "pci_sub_device_id_example", _FALLBACK_SUBSYS.get(model.key, 0x000010DE))
    reserved = _attr(model, "memory_reserved_mib", 400 + model.memory_mib // 650)
    gen_max = model.pcie_gen_max
    links = model.nvlink_count if profile.nvswitch_count else 0
    mig = model.mig is not None
    g = {
        "model": model.key,
        "name": model.name,
        "brand": brand,
        "architecture": arch,
        "compute_cap": model.compute_capability,
        "uuid": gpu_uuid(hostname, index),
        "serial": "" if geforce else gpu_serial(hostname, index),
        "vbios": _attr(model, "vbios_example", _VBIOS.get(arch, "96.00.A5.00.01")),
        "minor": str(index),
        "pci.bus_id": bus_id,
        "pci.device_id": f"0x{model.pci_device_id:08X}",
        "pci.sub_device_id": f"0x{sub:08X}",
        "pcie.gen_current": str(idle["pcie_idle_gen"] or gen_max),
        "pcie.gen_max": str(gen_max),
        "pcie.width_current": str(model.pcie_width_max),
        "pcie.width_max": str(model.pcie_width_max),
        "memory.total_mib": str(model.memory_mib),
        "memory.reserved_mib": str(reserved),
        "memory.used_mib": "1" if geforce else "0",
        "bar1.total_mib": str(_pow2_at_least(model.memory_mib)),
        "power.default_mw": str(default_mw),
        "power.min_mw": str(round(power.min_w * 1000)),
        "power.max_mw": str(round(power.max_w * 1000)),
        "power.limit_mw": str(default_mw),
        "power.draw_mw": str(draw_mw),
        "persistence": "0",
        "persistence.supported": "1" if model.persistence_supported else "0",
        "temp.gpu": str(temp),
        "temp.memory": str(temp + (idle["mem_temp"] or 0) - idle["temp"]) if hbm else "",
        "temp.max_operating": str(max_op),
        "temp.slowdown": str(max_op - slowdown_t),
        "temp.shutdown": str(max_op - shutdown_t),
        "temp.target": str(_attr(model, "temp_target_c", 84 if geforce else "")),
        "temp.memory_max_operating": str(_MEMORY_MAX_OPERATING_C.get(arch, "")),
        "fan": "0" if geforce else "",
        "pstate": idle["pstate"],
        "util.gpu": "0",
        "util.memory": "0",
        "clocks.graphics": str(idle["sm"]),
        "clocks.sm": str(idle["sm"]),
        "clocks.mem": str(max_mem if idle["pstate"] == "P0" else 405),
        "clocks.video": str(idle["video"]),
        "clocks.max.graphics": str(max_gr),
        "clocks.max.sm": str(max_sm),
        "clocks.max.mem": str(max_mem),
        "clocks.max.video": str(max_video),
        "clocks.locked.min": "0",
        "clocks.locked.max": "0",
        "clocks.event_reasons": "0x0000000000000001",
        "compute_mode": "Default",
        "ecc.supported": "1" if model.ecc_supported else "0",
        "ecc.current": "1" if model.ecc_supported and not geforce else "0",
        "ecc.pending": "1" if model.ecc_supported and not geforce else "0",
        "ecc.volatile.corrected": "0",
        "ecc.volatile.uncorrected": "0",
        "ecc.aggregate.corrected": "0",
        "ecc.aggregate.uncorrected": "0",
        "remap.supported": "1" if model.row_remap_supported else "0",
        "remap.correctable": "0",
        "remap.uncorrectable": "0",
        "remap.pending": "0",
        "remap.failure": "0",
        **({} if model.key not in _IDENTITY else dict(zip(
            ("part.board", "part.gpu", "inforom.img", "inforom.oem", "inforom.ecc", "remap.histogram_max"),
            map(str, _IDENTITY[model.key]), strict=True))),
        "nvlink.count": str(links),
        "nvlink.down": "",
        "nvlink.speed_gbps": str(_attr(model, "nvlink_speed_gbs", _NVLINK_SPEED.get(arch, "26.562"))) if links else "",
        "mig.supported": "1" if mig else "0",
        "mig.current": "0",
        "mig.pending": "0",
        "lost": "0",
    }
    if mig:
        g["mig.slices.compute"] = str(model.mig.compute_slices)
        g["mig.slices.memory"] = str(model.mig.memory_slices)
        g.update(_gip_rows(model))
    return {f"gpu.{index}.{k}": v for k, v in g.items()}


def build_state(profile: str, hostname: str) -> dict[str, str]:
    """The complete state of a simulated host just built: GPUs idle, no driver loaded."""
    prof = PROFILES.get(profile)
    if prof is None:
        raise UnknownProfile(profile)
    model = load_catalog().get(prof.model_key)
    state = {
        "schema": SCHEMA,
        "profile": prof.name,
        "hostname": hostname,
        "nvswitch.count": str(prof.nvswitch_count),
        "driver.loaded": "0",
        "driver.version": "",
        "driver.cuda_version": "",
        "fabric.state": "not_started" if prof.nvswitch_count else "none",
        "gpu.count": str(prof.gpu_count),
    }
    for index, bus_id in enumerate(bus_ids(model.architecture, prof.gpu_count)):
        state.update(_gpu_state(model, prof, hostname, index, bus_id))
    return state
