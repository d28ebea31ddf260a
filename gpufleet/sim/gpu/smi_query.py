"""``--query-gpu`` and ``--query-compute-apps`` in ``--format=csv[,noheader][,nounits]``."""

from __future__ import annotations

from . import state as st
from .smi_common import (
    RC_INVALID_ARGUMENT,
    Gpu,
    SmiExit,
    for_each_gpu,
    invalid_combination,
    major,
    timestamp_csv,
    watts,
)
from .smi_fields import ALIASES, DEFAULTS, UNITS
from .smi_table import free_mib, used_mib

NA = "[N/A]"
EVENT_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}
FABRIC_STATE = {"not_started": "Not Started", "in_progress": "In Progress", "completed": "Completed"}
# --query-gpu / --query-compute-apps: the name a field is asked by -> (name it is printed as, unit)
GPU_FIELDS = {alias: (name, UNITS[name]) for alias, name in ALIASES.items()}
# 595 and later add "kmd_version" and deprecate "driver_version" (still answered; real 595.80 / 610.57.04
# --help-query-gpu); 590 and older reject kmd_version like any unknown field.
KMD_VERSION_SINCE = 595
GPU_FIELDS_595 = {**GPU_FIELDS, "kmd_version": ("kmd_version", "")}
COMPUTE_APP_FIELDS = {
    "timestamp": ("timestamp", ""),
    "gpu_name": ("gpu_name", ""),
    "gpu_bus_id": ("gpu_bus_id", ""),
    "gpu_serial": ("gpu_serial", ""),
    "gpu_uuid": ("gpu_uuid", ""),
    "pid": ("pid", ""),
    "process_name": ("process_name", ""),
    "name": ("process_name", ""),
    "used_gpu_memory": ("used_gpu_memory", "MiB"),
    "used_memory": ("used_gpu_memory", "MiB"),
}


def parse_format(fmt: str | None) -> tuple[bool, bool]:
    """(header, units) from ``--format``; csv is mandatory."""
    if fmt is None:
        raise invalid_combination()
    opts = [o.strip() for o in fmt.split(",") if o.strip()]
    if "csv" not in opts or any(o not in ("csv", "noheader", "nounits") for o in opts):
        raise invalid_combination()
    return "noheader" not in opts, "nounits" not in opts


def _placeholder(value: str) -> bool:
    return value == "" or value.startswith("[") or value == "N/A"


def _with_unit(value: str, unit: str, units: bool) -> str:
    if unit and units and not _placeholder(value):
        return f"{value} {unit}"
    return value


def _fields(spec: str, known: dict[str, tuple[str, str]]) -> list[tuple[str, str]]:
    """The (name, unit) of each field ``spec`` lists, from ``known``; an unknown field is the real tool's error."""
    fields = []
    for raw in [x.strip() for x in spec.split(",") if x.strip()]:
        if raw not in known:
            raise SmiExit(RC_INVALID_ARGUMENT, f'Field "{raw}" is not a valid field to query.', "")
        fields.append(known[raw])
    if not fields:
        raise invalid_combination()
    return fields


def _header(fields: list[tuple[str, str]], units: bool) -> str:
    return ", ".join(f"{name} [{unit}]" if unit and units else name for name, unit in fields)


def _row(values: dict[str, str], fields: list[tuple[str, str]], units: bool) -> str:
    return ", ".join(_with_unit(values[name], unit, units) for name, unit in fields)


def _enabled(flag: bool) -> str:
    return "Enabled" if flag else "Disabled"


def _ecc_counter(gpu: Gpu, field: str) -> str | None:
    """ecc.errors.{corrected,uncorrected}.{volatile,aggregate}.* from the state counters."""
    parts = field.split(".")
    if len(parts) < 5 or not gpu.flag("ecc.supported"):
        return NA if len(parts) >= 5 else None
    kind, scope, where = parts[2], parts[3], parts[4]
    if not gpu.flag("ecc.current"):
        return NA
    count = str(gpu.i(f"ecc.{scope}.{'corrected' if kind == 'corrected' else 'uncorrected'}"))
    if where in ("device_memory", "dram", "total") and len(parts) == 5:
        return count
    return None  # leave the capture's default (sram counters 0, register file [N/A], ...)


def gpu_values(gpu: Gpu, names: list[str], ctx: dict) -> dict[str, str]:
    """The value of each canonical field in ``names`` for ``gpu`` (without unit)."""
    simple = _simple_values(gpu, ctx)
    return {name: simple[name] if name in simple else _other_value(gpu, name, ctx) for name in names}


def _simple_values(g: Gpu, ctx: dict) -> dict[str, str]:
    """The fields one state value (or a short formula) answers, all at once: a query asks for many."""
    bus = g.bus_id
    mig = g.mig_on
    reasons = g.i("clocks.event_reasons")
    return {
        "timestamp": ctx["timestamp"],
        "driver_version": ctx["version"],
        "kmd_version": ctx["version"],
        "count": str(ctx["count"]),
        "name": g.name,
        "serial": g.s("serial") or NA,
        "uuid": g.uuid,
        "pci.bus_id": bus,
        "pci.domain": "0x" + bus[4:8],
        "pci.bus": "0x" + bus[9:11],
        "pci.device": "0x" + bus[12:14],
        "pci.subClass": "0x0" if g.geforce else "0x2",
        "pci.device_id": g.s("pci.device_id"),
        "pci.sub_device_id": g.s("pci.sub_device_id"),
        "pcie.link.gen.current": g.s("pcie.gen_current"),
        "pcie.link.gen.gpucurrent": g.s("pcie.gen_current"),
        "pcie.link.gen.max": g.s("pcie.gen_max"),
        "pcie.link.gen.gpumax": g.s("pcie.gen_max"),
        "pcie.link.gen.hostmax": g.s("pcie.gen_hostmax") or NA,
        "pcie.link.width.current": g.s("pcie.width_current"),
        "pcie.link.width.max": g.s("pcie.width_max"),
        "index": str(g.index),
        "display_active": _enabled(g.flag("display.active")),
        "persistence_mode": _enabled(g.flag("persistence")) if g.s("persistence.supported", "1") != "0" else NA,
        "addressing_mode": "None" if g.s("architecture") in ("Hopper", "Blackwell") else "HMM",
        "vbios_version": g.s("vbios"),
        "inforom.img": g.s("inforom.img", DEFAULTS["inforom.img"]),
        "inforom.oem": g.s("inforom.oem", DEFAULTS["inforom.oem"]),
        "inforom.ecc": g.s("inforom.ecc", DEFAULTS["inforom.ecc"]),
        "fan.speed": g.s("fan") or NA,
        "pstate": g.s("pstate", "P0"),
        "clocks_event_reasons.active": f"0x{reasons:016X}",
        "memory.total": str(g.i("memory.total_mib")),
        "memory.reserved": str(g.i("memory.reserved_mib")),
        "memory.used": str(used_mib(g)),
        "memory.free": str(free_mib(g)),
        "compute_mode": g.s("compute_mode", "Default"),
        "compute_cap": g.s("compute_cap"),
        "utilization.gpu": NA if mig else str(g.i("util.gpu")),
        "utilization.memory": NA if mig else str(g.i("util.memory")),
        "ecc.mode.current": _enabled(g.flag("ecc.current")) if g.flag("ecc.supported") else NA,
        "ecc.mode.pending": _enabled(g.flag("ecc.pending")) if g.flag("ecc.supported") else NA,
        "retired_pages.single_bit_ecc.count": NA,
        "retired_pages.double_bit.count": NA,
        "retired_pages.pending": NA,
        "temperature.gpu": g.s("temp.gpu"),
        "temperature.gpu.tlimit": (
            str(g.i("temp.max_operating") - g.i("temp.gpu")) if g.has("temp.max_operating") and not g.geforce else NA
        ),
        "temperature.memory": g.s("temp.memory") or "N/A",
        "power.draw": watts(g.i("power.draw_mw")),
        "power.draw.average": watts(g.i("power.draw_mw")),
        "power.draw.instant": watts(g.i("power.draw_mw") * 9967 // 10000),
        "power.limit": watts(g.i("power.limit_mw")),
        "enforced.power.limit": watts(g.i("power.limit_mw")),
        "power.default_limit": watts(g.i("power.default_mw")),
        "power.min_limit": watts(g.i("power.min_mw")),
        "power.max_limit": watts(g.i("power.max_mw")),
        "edpp_multiplier": DEFAULTS["edpp_multiplier"] if g.s("architecture") in ("Hopper", "Blackwell") else NA,
        "clocks.current.graphics": g.s("clocks.graphics"),
        "clocks.current.sm": g.s("clocks.sm"),
        "clocks.current.memory": g.s("clocks.mem"),
        "clocks.current.video": g.s("clocks.video"),
        "clocks.max.graphics": g.s("clocks.max.graphics"),
        "clocks.max.sm": g.s("clocks.max.sm"),
        "clocks.max.memory": g.s("clocks.max.mem"),
        "mig.mode.current": _enabled(g.flag("mig.current")) if g.flag("mig.supported") else NA,
        "mig.mode.pending": _enabled(g.flag("mig.pending")) if g.flag("mig.supported") else NA,
        "c2c.mode": "Disabled" if g.s("architecture") in ("Hopper", "Blackwell") else NA,
        "platform.module_id": str(g.index + 1),
    }


def _other_value(g: Gpu, field: str, ctx: dict) -> str:
    """A field :func:`_simple_values` does not answer: event reasons, ECC and remapping counters, fabric."""
    mig = g.mig_on
    reasons = g.i("clocks.event_reasons")
    if field.startswith(("clocks_event_reasons.", "clocks_throttle_reasons.")):
        bit = EVENT_BITS.get(field.split(".", 1)[1])
        if bit is not None:
            return "Active" if reasons & bit else "Not Active"
    if field.startswith("utilization.") and mig:
        return NA
    if field.startswith("ecc.errors."):
        value = _ecc_counter(g, field)
        if value is not None:
            return value
        if not g.flag("ecc.supported"):
            return NA
    if field.startswith("remapped_rows."):
        if not g.flag("remap.supported"):
            return NA
        if field.startswith("remapped_rows.histogram."):
            # printed in MIG mode too (real H200 / H100 MIG captures): banks without remapped rows
            if field == "remapped_rows.histogram.max":
                return g.s("remap.histogram_max", DEFAULTS[field])
            return DEFAULTS[field]
        if mig:  # the counters are per GPU instance in MIG mode: [N/A] for the whole GPU (real MIG captures)
            return NA
        remap = {
            "remapped_rows.correctable": str(g.i("remap.correctable")),
            "remapped_rows.uncorrectable": str(g.i("remap.uncorrectable")),
            "remapped_rows.pending": "Yes" if g.i("remap.pending") else "No",
            "remapped_rows.failure": "Yes" if g.i("remap.failure") else "No",
        }
        if field in remap:
            return remap[field]
    if field.startswith("fabric."):
        fabric = ctx["fabric"]
        if fabric in ("", "none"):
            return "N/A"
        if field == "fabric.state":
            return FABRIC_STATE.get(fabric, "N/A")
        if fabric != "completed":
            return "N/A"
    return DEFAULTS[field]


def query_gpu(
    state: dict[str, str], gpus: list[Gpu], spec: str, fmt: str | None, version: str
) -> tuple[list[str], int]:
    header, units = parse_format(fmt)
    fields = _fields(spec, GPU_FIELDS_595 if major(version) >= KMD_VERSION_SINCE else GPU_FIELDS)
    out = [_header(fields, units)] if header else []
    ctx = {
        "timestamp": timestamp_csv(),
        "version": version,
        "count": st.gpu_count(state),
        "fabric": state.get("fabric.state", "none"),
    }

    def row(gpu: Gpu) -> list[str]:
        return [_row(gpu_values(gpu, [name for name, _unit in fields], ctx), fields, units)]

    rc = for_each_gpu(gpus, out, row)
    return out, rc


def query_compute_apps(gpus: list[Gpu], spec: str, fmt: str | None) -> tuple[list[str], int]:
    header, units = parse_format(fmt)
    fields = _fields(spec, COMPUTE_APP_FIELDS)
    out = [_header(fields, units)] if header else []
    stamp = timestamp_csv()

    def rows(gpu: Gpu) -> list[str]:
        return [
            _row(
                {
                    "timestamp": stamp,
                    "gpu_name": gpu.name,
                    "gpu_bus_id": gpu.bus_id,
                    "gpu_serial": gpu.s("serial") or NA,
                    "gpu_uuid": gpu.uuid,
                    "pid": str(proc["pid"]),
                    "process_name": proc["name"],
                    "used_gpu_memory": str(proc["used"]),
                },
                fields,
                units,
            )
            for proc in gpu.procs()
        ]

    rc = for_each_gpu(gpus, out, rows)
    return out, rc


ACCOUNTED_APP_FIELDS = {
    "timestamp": ("timestamp", ""),
    "gpu_name": ("gpu_name", ""),
    "gpu_bus_id": ("gpu_bus_id", ""),
    "gpu_serial": ("gpu_serial", ""),
    "gpu_uuid": ("gpu_uuid", ""),
    "vgpu_instance": ("vgpu_instance", ""),
    "pid": ("pid", ""),
    "gpu_utilization": ("gpu_utilization", "%"),
    "gpu_util": ("gpu_utilization", "%"),
    "mem_utilization": ("mem_utilization", "%"),
    "mem_util": ("mem_utilization", "%"),
    "max_memory_usage": ("max_memory_usage", "MiB"),
    "time": ("time", "ms"),
}
RETIRED_PAGE_FIELDS = {
    name: (name, "")
    for name in ("timestamp", "gpu_name", "gpu_bus_id", "gpu_serial", "gpu_uuid", "retired_pages.address",
                 "retired_pages.timestamp", "retired_pages.cause")
}  # fmt: skip


def query_accounted_apps(gpus: list[Gpu], spec: str, fmt: str | None) -> tuple[list[str], int]:
    """The header only: accounting mode is Disabled on every simulated GPU (as in the real H100 captures, whose
    accounted-apps query prints just the header), so no process is ever accounted."""
    header, units = parse_format(fmt)
    fields = _fields(spec, ACCOUNTED_APP_FIELDS)
    out = [_header(fields, units)] if header else []
    rc = for_each_gpu(gpus, out, lambda gpu: [])
    return out, rc


def query_retired_pages(gpus: list[Gpu], spec: str, fmt: str | None) -> tuple[list[str], int]:
    """Two rows per GPU with [N/A] address and timestamp, causes Single / Double Bit ECC: what the real 590 / 595
    drivers print on every captured GPU (H100, H200, L40S, GeForce), which retire no pages (row remapping)."""
    header, units = parse_format(fmt)
    fields = _fields(spec, RETIRED_PAGE_FIELDS)
    out = [_header(fields, units)] if header else []
    stamp = timestamp_csv()

    def rows(gpu: Gpu) -> list[str]:
        base = {"timestamp": stamp, "gpu_name": gpu.name, "gpu_bus_id": gpu.bus_id, "gpu_serial": gpu.s("serial") or NA,
                "gpu_uuid": gpu.uuid, "retired_pages.address": NA, "retired_pages.timestamp": NA}
        return [_row({**base, "retired_pages.cause": cause}, fields, units)
                for cause in ("Single Bit ECC", "Double Bit ECC")]

    rc = for_each_gpu(gpus, out, rows)
    return out, rc
