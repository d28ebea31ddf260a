"""``nvidia-smi -q [-d TYPE[,TYPE]]``: the 590-series NVSMI LOG layout (key column 55 wide)."""

from __future__ import annotations

from . import state as st
from .smi_common import DEPRECATED, Gpu, for_each_gpu, invalid_combination, major, timestamp_ctime, watts
from .smi_fields import DEFAULTS
from .smi_query import EVENT_BITS, FABRIC_STATE
from .smi_table import bar1_slice_mib, free_mib, gi_overhead_mib, used_mib

DISPLAY_TYPES = {
    "MEMORY", "UTILIZATION", "ECC", "TEMPERATURE", "POWER", "CLOCK", "COMPUTE", "PIDS", "PERFORMANCE",
    "SUPPORTED_CLOCKS", "PAGE_RETIREMENT", "ACCOUNTING", "ENCODER_STATS", "SUPPORTED_GPU_TARGET_TEMP",
    "VOLTAGE", "FBC_STATS", "ROW_REMAPPER", "GSP_FIRMWARE_VERSION", "POWER_SMOOTHING", "POWER_PROFILES",
}  # fmt: skip
KEY_WIDTH = 55
NA = "N/A"
# pre-Turing GPUs print the older ECC / retired-pages / absolute-temperature sections (real 8x V100, 550.127.05)
PRE_TURING = ("Kepler", "Maxwell", "Pascal", "Volta")
_VOLTA_ECC_UNITS = ("Device Memory", "Register File", "L1 Cache", "L2 Cache", "Texture Memory", "Texture Shared", "CBU")


def line(level: int, label: str, value: str | None = None, width: int = KEY_WIDTH) -> str:
    text = "    " * level + label
    return text if value is None else f"{text:<{width}}: {value}"


def _en(flag: bool) -> str:
    return "Enabled" if flag else "Disabled"


def _w(mw: int) -> str:
    return f"{watts(mw)} W"


def _reasons(g: Gpu) -> list[str]:
    bits = g.i("clocks.event_reasons")

    def act(name: str) -> str:
        return "Active" if bits & EVENT_BITS[name] else "Not Active"

    return [
        line(1, "Clocks Event Reasons"),
        line(2, "Idle", act("gpu_idle")),
        line(2, "Applications Clocks Setting", act("applications_clocks_setting")),
        line(2, "SW Power Cap", act("sw_power_cap")),
        line(2, "HW Slowdown", act("hw_slowdown")),
        line(3, "HW Thermal Slowdown", act("hw_thermal_slowdown")),
        line(3, "HW Power Brake Slowdown", act("hw_power_brake_slowdown")),
        line(2, "Sync Boost", act("sync_boost")),
        line(2, "SW Thermal Slowdown", act("sw_thermal_slowdown")),
        line(2, "Display Clock Setting", "Active" if bits & 0x100 else "Not Active"),
        line(1, "Clocks Event Reasons Counters"),
        line(2, "SW Power Capping", "0 us"),
        line(2, "Sync Boost", "0 us"),
        line(2, "SW Thermal Slowdown", "0 us"),
        line(2, "HW Thermal Slowdown", "0 us"),
        line(2, "HW Power Braking", "0 us"),
    ]


def _memory(g: Gpu) -> list[str]:
    total, reserved, used = g.i("memory.total_mib"), g.i("memory.reserved_mib"), used_mib(g)
    bar1 = g.i("bar1.total_mib")
    bar1_used = total - reserved if g.mig_on else 1
    return [
        line(1, "FB Memory Usage"),
        line(2, "Total", f"{total} MiB"),
        line(2, "Reserved", f"{reserved} MiB"),
        line(2, "Used", f"{used} MiB"),
        line(2, "Free", f"{free_mib(g)} MiB"),
        line(1, "BAR1 Memory Usage"),
        line(2, "Total", f"{bar1} MiB"),
        line(2, "Used", f"{bar1_used} MiB"),
        line(2, "Free", f"{bar1 - bar1_used} MiB"),
        line(1, "Conf Compute Protected Memory Usage"),
        line(2, "Total", "0 MiB"),
        line(2, "Used", "0 MiB"),
        line(2, "Free", "0 MiB"),
    ]


def _utilization(g: Gpu) -> list[str]:
    def pct(value: int) -> str:
        return NA if g.mig_on else f"{value} %"

    return [
        line(1, "Utilization"),
        line(2, "GPU", pct(g.i("util.gpu"))),
        line(2, "Memory", pct(g.i("util.memory"))),
        *(line(2, name, pct(0)) for name in ("Encoder", "Decoder", "JPEG", "OFA")),
    ]


def _pre_turing(g: Gpu) -> bool:
    return g.s("architecture") in PRE_TURING


def _ecc_by_unit(g: Gpu) -> list[str]:
    """The pre-Turing ECC Errors section: single and double bit counts per memory unit."""
    out = []
    for scope in ("Volatile", "Aggregate"):
        out.append(line(2, scope))
        for bits, key in (("Single Bit", "corrected"), ("Double Bit", "uncorrected")):
            count = g.i(f"ecc.{scope.lower()}.{key}") if g.ecc_on else None
            out.append(line(3, bits, "").rstrip(": ") + " " * 12)
            for unit in _VOLTA_ECC_UNITS:
                texture = unit.startswith("Texture") or (unit == "CBU" and bits == "Single Bit")
                value = NA if count is None or texture else str(count if unit == "Device Memory" else 0)
                out.append(line(4, unit, value))
            out.append(line(4, "Total", NA if count is None else str(count)))
    return out


def _retired_pages(g: Gpu) -> list[str]:
    if not _pre_turing(g) or not g.ecc_on:
        return [line(1, "Retired Pages"), line(2, "Single Bit ECC", NA), line(2, "Double Bit ECC", NA),
                line(2, "Pending Page Blacklist", NA)]
    return [line(1, "Retired Pages"), line(2, "Single Bit ECC", "0"), line(2, "Double Bit ECC", "0"),
            line(2, "Pending Page Blacklist", "No")]


def _ecc(g: Gpu) -> list[str]:
    sup = g.flag("ecc.supported")
    out = [
        line(1, "ECC Mode"),
        line(2, "Current", _en(g.flag("ecc.current")) if sup else NA),
        line(2, "Pending", _en(g.flag("ecc.pending")) if sup else NA),
        line(1, "ECC Errors"),
    ]
    if _pre_turing(g):
        return out + _ecc_by_unit(g)
    for scope in ("Volatile", "Aggregate"):
        key = scope.lower()
        on = sup and g.flag("ecc.current")

        def val(n: int, on: bool = on) -> str:
            return str(n) if on else NA

        out += [
            line(2, scope),
            line(3, "SRAM Correctable", val(0)),
            line(3, "SRAM Uncorrectable Parity", val(0)),
            line(3, "SRAM Uncorrectable SEC-DED", val(0)),
            line(3, "DRAM Correctable", val(g.i(f"ecc.{key}.corrected"))),
            line(3, "DRAM Uncorrectable", val(g.i(f"ecc.{key}.uncorrected"))),
        ]
        if scope == "Aggregate":
            out.append(line(3, "SRAM Threshold Exceeded", "No" if on else NA))
    out += [line(2, "Aggregate Uncorrectable SRAM Sources")]
    out += [line(3, f"SRAM {n}", "0" if sup else NA) for n in ("L2", "SM", "Microcontroller", "PCIE", "Other")]
    out += [
        line(2, "Channel Repair Pending", "No" if sup else NA),
        line(2, "TPC Repair Pending", "No" if sup else NA),
        line(2, "Unrepairable Memory", "No" if sup else NA),
    ]
    return out


def _remap(g: Gpu) -> list[str]:
    if not g.flag("remap.supported") or g.mig_on:
        return [line(1, "Remapped Rows", NA)]
    return [
        line(1, "Remapped Rows"),
        line(2, "Correctable Error", str(g.i("remap.correctable"))),
        line(2, "Uncorrectable Error", str(g.i("remap.uncorrectable"))),
        line(2, "Pending", "Yes" if g.i("remap.pending") else "No"),
        line(2, "Remapping Failure Occurred", "Yes" if g.i("remap.failure") else "No"),
        line(2, "Bank Remap Availability Histogram"),
        line(3, "Max", f"{g.s('remap.histogram_max', DEFAULTS['remapped_rows.histogram.max'])} bank(s)"),
        *(line(3, n, "0 bank(s)") for n in ("High", "Partial", "Low", "None")),
    ]


def _temperature(g: Gpu) -> list[str]:
    temp = g.i("temp.gpu")

    def c(key: str) -> str:
        return f"{g.i(key)} C" if g.has(key) else NA

    if g.geforce or _pre_turing(g):
        return [
            line(1, "Temperature"),
            line(2, "GPU Current Temp", f"{temp} C"),
            line(2, "GPU T.Limit Temp", NA),
            line(2, "GPU Shutdown Temp", c("temp.shutdown")),
            line(2, "GPU Slowdown Temp", c("temp.slowdown")),
            line(2, "GPU Max Operating Temp", c("temp.max_operating")),
            line(2, "GPU Target Temperature", c("temp.target")),
            line(2, "Memory Current Temp", c("temp.memory")),
            line(2, "Memory Max Operating Temp", c("temp.memory_max_operating")),
        ]
    limit = g.i("temp.max_operating")

    def rel(key: str) -> str:
        return f"{limit - g.i(key)} C" if g.has(key) and g.has("temp.max_operating") else NA

    mem = g.has("temp.memory")
    return [
        line(1, "Temperature"),
        line(2, "GPU Current Temp", f"{temp} C"),
        line(2, "GPU T.Limit Temp", f"{limit - temp} C" if g.has("temp.max_operating") else NA),
        line(2, "GPU Shutdown T.Limit Temp", rel("temp.shutdown")),
        line(2, "GPU Slowdown T.Limit Temp", rel("temp.slowdown")),
        line(2, "GPU Max Operating T.Limit Temp", "0 C" if g.has("temp.max_operating") else NA),
        line(2, "GPU Target Temperature", c("temp.target")),
        line(2, "Memory Current Temp", c("temp.memory")),
        line(2, "Memory Max Operating T.Limit Temp", "0 C" if mem else NA),
    ]


def _samples(title: str, count: str, high: str, low: str, avg: str) -> list[str]:
    """A ``-q -d POWER`` / ``-d CLOCK`` samples block."""
    return [
        line(1, title),
        line(2, "Duration", "2.38 sec"),
        line(2, "Number of Samples", count),
        line(2, "Max", high),
        line(2, "Min", low),
        line(2, "Avg", avg),
    ]


def _power(g: Gpu, samples: bool) -> list[str]:
    draw = g.i("power.draw_mw")
    hbm = g.s("architecture") in ("Hopper", "Blackwell") and not g.geforce
    out = [
        line(1, "GPU Power Readings"),
        line(2, "Average Power Draw", _w(draw)),
        line(2, "Instantaneous Power Draw", _w(draw * 9967 // 10000)),
        line(2, "Current Power Limit", _w(g.i("power.limit_mw"))),
        line(2, "Requested Power Limit", _w(g.i("power.limit_mw"))),
        line(2, "Default Power Limit", _w(g.i("power.default_mw"))),
        line(2, "Min Power Limit", _w(g.i("power.min_mw"))),
        line(2, "Max Power Limit", _w(g.i("power.max_mw"))),
    ]
    if samples:
        out += _samples("Power Samples", "119", _w(draw * 102 // 100), _w(draw * 98 // 100), _w(draw))
    out += [
        line(1, "GPU Memory Power Readings "),
        line(2, "Average Power Draw", _w(draw * 618 // 1000) if hbm else NA),
        line(2, "Instantaneous Power Draw", NA),
        line(1, "Module Power Readings"),
        *(
            line(2, n, NA)
            for n in (
                "Average Power Draw",
                "Instantaneous Power Draw",
                "Current Power Limit",
                "Requested Power Limit",
                "Default Power Limit",
                "Min Power Limit",
                "Max Power Limit",
            )
        ),  # fmt: skip
        line(1, "Power Smoothing", NA),
        line(1, "Workload Power Profiles"),
        line(2, "Requested Profiles", NA),
        line(2, "Enforced Profiles", NA),
        line(1, "EDPp Multiplier", "100.00%" if hbm else NA),
    ]
    return out


def _clocks(g: Gpu, samples: bool) -> list[str]:
    def mhz(key: str) -> str:
        return f"{g.i(key)} MHz"

    out = [
        line(1, "Clocks"),
        line(2, "Graphics", mhz("clocks.graphics")),
        line(2, "SM", mhz("clocks.sm")),
        line(2, "Memory", mhz("clocks.mem")),
        line(2, "Video", mhz("clocks.video")),
        line(1, "Applications Clocks"),
        line(2, "Graphics", DEPRECATED),
        line(2, "Memory", DEPRECATED),
        line(1, "Default Applications Clocks"),
        line(2, "Graphics", DEPRECATED),
        line(2, "Memory", DEPRECATED),
        line(1, "Deferred Clocks"),
        line(2, "Memory", NA),
        line(1, "Max Clocks"),
        line(2, "Graphics", mhz("clocks.max.graphics")),
        line(2, "SM", mhz("clocks.max.sm")),
        line(2, "Memory", mhz("clocks.max.mem")),
        line(2, "Video", mhz("clocks.max.video")),
        line(1, "Max Customer Boost Clocks"),
        line(2, "Graphics", NA if g.geforce else mhz("clocks.max.graphics")),
    ]
    if samples:
        for name, key in (("SM Clock Samples", "clocks.sm"), ("Memory Clock Samples", "clocks.mem")):
            out += _samples(name, "100", mhz(key), mhz(key), mhz(key))
    out += [line(1, "Clock Policy"), line(2, "Auto Boost", NA), line(2, "Auto Boost Default", NA)]
    return out


def _mig_devices(g: Gpu) -> list[str]:
    out = []
    ecc = "0" if g.ecc_on else NA
    slice_bar1 = bar1_slice_mib(g)
    for dev in g.mig_devices():
        p = dev["profile"]
        used = gi_overhead_mib(p["compute_slices"]) + sum(x["used"] for x in g.procs() if x["gi"] == dev["gi"])
        bar1 = int(slice_bar1 * p["memory_slices"])
        out += [
            line(1, "MIG Device"),
            line(2, "Index", str(dev["index"])),
            line(2, "GPU Instance ID", str(dev["gi"])),
            line(2, "Compute Instance ID", str(dev["ci"])),
            line(2, "Device Attributes"),
            line(3, "Shared"),
            line(4, "Multiprocessor count", str(dev["sm"])),
            line(4, "Copy Engine count", str(p["ce"])),
            line(4, "Encoder count", str(p["enc"])),
            line(4, "Decoder count", str(p["dec"])),
            line(4, "OFA count", str(p["ofa"])),
            line(4, "JPG count", str(p["jpeg"])),
            line(2, "ECC Errors"),
            line(3, "Volatile"),
            line(4, "SRAM Uncorrectable", ecc),
            line(2, "Shared FB Memory Usage"),
            line(3, "Total", f"{p['memory_mib']} MiB"),
            line(3, "Reserved", "0 MiB"),
            line(3, "Used", f"{used} MiB"),
            line(3, "Free", f"{p['memory_mib'] - used + 1} MiB"),  # +1 as in the real capture
            line(2, "Shared BAR1 Memory"),
            line(3, "Total", f"{bar1} MiB"),
            line(3, "Used", "0 MiB"),
            line(3, "Free", f"{bar1} MiB"),
        ]
    return out


def _processes(g: Gpu) -> list[str]:
    procs = g.procs()
    if not procs:
        return [line(1, "Processes", "None")]
    out = [line(1, "Processes")]
    for p in procs:
        gi = str(p["gi"]) if g.mig_on and p["gi"] is not None else NA
        ci = str(p["ci"]) if g.mig_on and p["ci"] is not None else NA
        out += [
            line(2, "GPU instance ID", gi, 42),
            line(2, "Compute instance ID", ci, 42),
            line(2, "Process ID", str(p["pid"]), 42),
            line(3, "Type", p["type"], 42),
            line(3, "Name", p["name"], 42),
            line(3, "Used GPU Memory", f"{p['used']} MiB", 42),
        ]
    return out


def _fabric(g: Gpu, fabric: str) -> list[str]:
    done = fabric == "completed"
    none = fabric in ("", "none")
    return [
        line(1, "Fabric"),
        line(2, "State", NA if none else FABRIC_STATE.get(fabric, NA)),
        line(2, "Status", "Success" if done else NA),
        line(2, "CliqueId", "0" if done else NA),
        line(2, "ClusterUUID", "00000000-0000-0000-0000-000000000000" if done else NA),
        line(2, "Health"),
        *(
            line(3, n, NA)
            for n in (
                "Summary",
                "Bandwidth",
                "Route Recovery in progress",
                "Route Unhealthy",
                "Access Timeout Recovery",
                "Incorrect Configuration",
            )
        ),  # fmt: skip
    ]


def gpu_block(g: Gpu, version: str, fabric: str, only: set[str] | None) -> list[str]:
    """One GPU's section; ``only`` = the -d display types (None: everything)."""
    bus = g.bus_id
    hopper = g.s("architecture") in ("Hopper", "Blackwell")
    mig = g.flag("mig.supported")
    sections: list[tuple[str, list[str]]] = [
        ("", [
            line(1, "Product Name", g.name),
            line(1, "Product Brand", g.s("brand", "NVIDIA")),
            line(1, "Product Architecture", g.s("architecture")),
            line(1, "Display Mode", DEPRECATED),
            line(1, "Display Attached", DEFAULTS["display_attached"]),
            line(1, "Display Active", _en(g.flag("display.active"))),
            line(1, "Persistence Mode", _en(g.flag("persistence"))),
            line(1, "Addressing Mode", NA if _pre_turing(g) else "None" if hopper else "HMM"),
            line(1, "MIG Mode"),
            line(2, "Current", _en(g.flag("mig.current")) if mig else NA),
            line(2, "Pending", _en(g.flag("mig.pending")) if mig else NA),
            *(_mig_devices(g) if g.mig_on else []),
        ]),
        ("ACCOUNTING", [line(1, "Accounting Mode", "Disabled"), line(1, "Accounting Mode Buffer Size", "4000")]),
        ("", [
            line(1, "Driver Model"),
            line(2, "Current", NA),
            line(2, "Pending", NA),
            line(1, "Serial Number", g.s("serial") or NA),
            line(1, "GPU UUID", g.uuid),
            line(1, "GPU PDI", "0x" + g.uuid.replace("-", "")[-16:].lower()),
            line(1, "Minor Number", g.s("minor", str(g.index))),
            line(1, "VBIOS Version", g.s("vbios")),
            line(1, "MultiGPU Board", "No"),
            line(1, "Board ID", f"0x{int(bus[9:11], 16) << 8:x}"),
            line(1, "Board Part Number", g.s("part.board") or NA),
            line(1, "GPU Part Number", g.s("part.gpu") or NA),
            line(1, "FRU Part Number", NA),
            line(1, "Platform Info"),
            *(line(2, n, NA) for n in ("Chassis Serial Number", "Slot Number", "Tray Index", "Host ID", "Peer Type")),
            line(2, "Module Id", str(g.index + 1)),
            line(2, "GPU Fabric GUID", NA),
            line(1, "Inforom Version"),
            line(2, "Image Version", g.s("inforom.img", DEFAULTS["inforom.img"])),
            line(2, "OEM Object", g.s("inforom.oem", DEFAULTS["inforom.oem"])),
            line(2, "ECC Object", g.s("inforom.ecc", DEFAULTS["inforom.ecc"])),
            line(2, "Power Management Object", DEFAULTS["inforom.pwr"].strip("[]")),
            line(1, "Inforom BBX Object Flush"),
            line(2, "Latest Timestamp", NA),
            line(2, "Latest Duration", NA),
            line(1, "GPU Operation Mode"),
            line(2, "Current", NA),
            line(2, "Pending", NA),
            line(1, "GPU C2C Mode", "Disabled" if hopper else NA),
            line(1, "GPU Virtualization Mode"),
            line(2, "Virtualization Mode", "None"),
            line(2, "Host VGPU Mode", NA),
            line(2, "vGPU Heterogeneous Mode", NA),
            line(1, "GPU Recovery Action", "None"),
        ]),
        ("GSP_FIRMWARE_VERSION", [line(1, "GSP Firmware Version", NA if _pre_turing(g) else version)]),
        ("", [
            line(1, "IBMNPU"),
            line(2, "Relaxed Ordering Mode", NA),
            line(1, "PCI"),
            line(2, "Bus", "0x" + bus[9:11]),
            line(2, "Device", "0x" + bus[12:14]),
            line(2, "Domain", "0x" + bus[4:8]),
            line(2, "Base Classcode", "0x3"),
            line(2, "Sub Classcode", "0x0" if g.geforce else "0x2"),
            line(2, "Device Id", g.s("pci.device_id")),
            line(2, "Bus Id", bus),
            line(2, "Sub System Id", g.s("pci.sub_device_id")),
            line(2, "GPU Link Info"),
            line(3, "PCIe Generation"),
            line(4, "Max", g.s("pcie.gen_max")),
            line(4, "Current", g.s("pcie.gen_current")),
            line(4, "Device Current", g.s("pcie.gen_current")),
            line(4, "Device Max", g.s("pcie.gen_max")),
            line(4, "Host Max", g.s("pcie.gen_hostmax") or NA),
            line(3, "Link Width"),
            line(4, "Max", f"{g.s('pcie.width_max')}x"),
            line(4, "Current", f"{g.s('pcie.width_current')}x"),
            line(2, "Bridge Chip"),
            line(3, "Type", NA),
            line(3, "Firmware", NA),
            line(2, "Replays Since Reset", "0"),
            line(2, "Replay Number Rollovers", "0"),
            line(2, "Tx Throughput", "352 KB/s"),
            line(2, "Rx Throughput", "329 KB/s"),
            line(2, "Atomic Caps Outbound", NA),
            line(2, "Atomic Caps Inbound", NA),
            line(1, "Fan Speed", f"{g.i('fan')} %" if g.has("fan") else NA),
        ]),
        ("PERFORMANCE", [line(1, "Performance State", g.s("pstate", "P0")), *_reasons(g)]),
        ("", [line(1, "Sparse Operation Mode", "Disabled")]),
        ("MEMORY", _memory(g)),
        ("COMPUTE", [line(1, "Compute Mode", g.s("compute_mode", "Default"))]),
        ("UTILIZATION", _utilization(g)),
        ("ENCODER_STATS", [
            line(1, "Encoder Stats"),
            line(2, "Active Sessions", "0"),
            line(2, "Average FPS", "0"),
            line(2, "Average Latency", "0"),
        ]),
        ("FBC_STATS", [
            line(1, "FBC Stats"),
            line(2, "Active Sessions", "0"),
            line(2, "Average FPS", "0"),
            line(2, "Average Latency", "0"),
        ]),
        ("", [line(1, "DRAM Encryption Mode"), line(2, "Current", NA), line(2, "Pending", NA)]),
        ("ECC", _ecc(g)),
        ("PAGE_RETIREMENT", _retired_pages(g)),
        ("ROW_REMAPPER", _remap(g)),
        ("TEMPERATURE", _temperature(g)),
        ("POWER", _power(g, only is not None)),
        ("CLOCK", _clocks(g, only is not None)),
        ("", _fabric(g, fabric)),
        ("PIDS", _processes(g)),
        ("", [line(1, "Capabilities"), line(2, "EGM", "disabled")]),
    ]  # fmt: skip
    out = [f"GPU {bus}"]
    for category, lines in sections:
        if only is None or category in only:
            out += lines
    return out


def query(state: dict[str, str], gpus: list[Gpu], display: str | None, version: str) -> tuple[list[str], int]:
    only = None
    if display is not None:
        only = {d.strip().upper() for d in display.split(",") if d.strip()}
        if not only or not only <= DISPLAY_TYPES:
            raise invalid_combination()
    fabric = state.get("fabric.state", "none")
    cuda = state.get("driver.cuda_version") or st.cuda_version_for(version)
    if major(version) >= 610:  # real 610.57.04
        versions = [
            line(0, "Driver Version", f"{version} [Deprecated; will be removed in CUDA 14.0. Use KMD Version instead]"),
            line(0, "CUDA Version", f"{cuda} [Deprecated; will be removed in CUDA 14.0. Use CUDA UMD Version instead]"),
            line(0, "KMD Version", version),
            line(0, "CUDA UMD Version", cuda),
        ]
    else:
        versions = [line(0, "Driver Version", version), line(0, "CUDA Version", cuda)]
    out = [
        "",
        "==============NVSMI LOG==============",
        "",
        line(0, "Timestamp", timestamp_ctime()),
        *versions,
        "",
        line(0, "Attached GPUs", str(st.gpu_count(state))),
    ]
    rc = for_each_gpu(gpus, out, lambda g: [*gpu_block(g, version, fabric, only), ""])
    return out, rc
