"""The default ``nvidia-smi`` summary table (590-series layout) and ``nvidia-smi -L``."""

from __future__ import annotations

from .smi_common import RC_GPU_IS_LOST, Gpu, for_each_gpu, lost_line, timestamp_ctime

BORDER = "+-----------------------------------------------------------------------------------------+"
GRID = "+-----------------------------------------+------------------------+----------------------+"
GPU_HEADER = [
    "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
    "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
    "|                                         |                        |               MIG M. |",
    "|=========================================+========================+======================|",
]
MIG_GRID = "+------------------+----------------------------------+-----------+-----------------------+"
MIG_HEADER = [
    BORDER,
    "| MIG devices:                                                                            |",
    MIG_GRID,
    "| GPU  GI  CI  MIG |              Shared Memory-Usage |        Vol|        Shared         |",
    "|      ID  ID  Dev |                Shared BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |",
    "|                  |                                  |        ECC|                       |",
    "|==================+==================================+===========+=======================|",
]
PROC_HEADER = [
    BORDER,
    "| Processes:                                                                              |",
    "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
    "|        ID   ID                                                               Usage      |",
    "|=========================================================================================|",
]
COMPUTE_MODE_SHORT = {
    "Default": "Default",
    "Exclusive_Process": "E. Process",
    "Exclusive_Thread": "E. Thread",
    "Prohibited": "Prohibited",
}


def display_name(name: str) -> str:
    return name if len(name) <= 27 else name[:24] + "..."


def gi_overhead_mib(compute_slices: int) -> int:
    """Framebuffer a GPU instance uses with nothing running (real H100: 1g 9, 2g 17, 3g 26 MiB)."""
    return round(8.67 * compute_slices)


def used_mib(gpu: Gpu) -> int:
    """memory.used as nvidia-smi prints it: base + GPU-instance overhead + processes."""
    total = gpu.i("memory.used_mib") + sum(p["used"] for p in gpu.procs())
    if gpu.mig_on:
        profiles = gpu.gip()
        for profile_id, _start, _size in gpu.gis().values():
            prof = profiles.get(profile_id)
            if prof:
                total += gi_overhead_mib(prof["compute_slices"])
    return total


def free_mib(gpu: Gpu) -> int:
    """memory.free as real nvidia-smi prints it: total - reserved - used + 1 in every real capture (rounding)."""
    return gpu.i("memory.total_mib") - gpu.i("memory.reserved_mib") - used_mib(gpu) + 1


def ecc_cell(gpu: Gpu) -> str:
    if not gpu.flag("ecc.supported"):
        return "N/A"
    if gpu.mig_on:
        return "On"
    if not gpu.flag("ecc.current"):
        return "Off"
    return str(gpu.i("ecc.volatile.uncorrected"))


def gpu_rows(gpu: Gpu) -> list[str]:
    pm = "On" if gpu.flag("persistence") else "Off"
    if gpu.s("persistence.supported", "1") == "0":
        pm = "N/A"
    fan = f"{gpu.i('fan')}%" if gpu.has("fan") else "N/A"
    temp = str(gpu.i("temp.gpu"))
    usage = f"{gpu.i('power.draw_mw') // 1000}W"
    cap = f"{enforced_limit_mw(gpu) // 1000}W"
    util = "N/A" if gpu.mig_on else f"{gpu.i('util.gpu')}%"
    compute = COMPUTE_MODE_SHORT.get(gpu.s("compute_mode", "Default"), gpu.s("compute_mode"))
    mig = ("Enabled" if gpu.flag("mig.current") else "Disabled") if gpu.flag("mig.supported") else "N/A"
    disp = "On" if gpu.flag("display.active") else "Off"
    used = f"{used_mib(gpu)}MiB"
    total = f"{gpu.i('memory.total_mib')}MiB"
    return [
        f"|{gpu.index:>4}  {display_name(gpu.name):<31}{pm:<3} |{gpu.bus_id:>19} {disp:>3} |{ecc_cell(gpu):>21} |",
        f"|{fan:>4} {temp:>4}C    {gpu.s('pstate', 'P0'):<3}{usage:>15} / {cap:>5} |{used:>11} / {total:>9} |"
        f"{util:>8}{compute:>13} |",
        f"|{'':41}|{'':24}|{mig:>21} |",
        GRID,
    ]


def enforced_limit_mw(gpu: Gpu) -> int:
    return gpu.i("power.limit_mw")


def bar1_slice_mib(gpu: Gpu) -> float:
    slices = gpu.i("mig.slices.memory", 8) or 8
    return max(gpu.i("bar1.total_mib") - gpu.i("memory.total_mib"), 0) / slices


def mig_rows(gpu: Gpu) -> list[str]:
    rows = []
    procs = gpu.procs()
    ecc = str(gpu.i("ecc.volatile.uncorrected")) if gpu.ecc_on else "N/A"
    for dev in gpu.mig_devices():
        prof = dev["profile"]
        used = gi_overhead_mib(prof["compute_slices"]) + sum(p["used"] for p in procs if p["gi"] == dev["gi"])
        total = f"{prof['memory_mib']}MiB"
        bar1 = f"{int(bar1_slice_mib(gpu) * prof['memory_slices'])}MiB"
        width = 19 - max(len(total) - 8, 0)
        sm = dev["sm"]
        rows += [
            f"|{gpu.index:>3}{dev['gi']:>5}{dev['ci']:>4}{dev['index']:>4}  |{f'{used}MiB':>{width}} / {total:>8}    |"
            f" {sm:<3}{ecc:>6} |{prof['ce']:>3}{prof['enc']:>4}{prof['dec']:>5}{prof['ofa']:>5}{prof['jpeg']:>5} |",
            f"|{'':18}|{'0MiB':>{width}} / {bar1:>8}    |{'':11}|{'':23}|",
            MIG_GRID,
        ]
    return rows


def proc_rows(gpus: list[Gpu]) -> list[str]:
    rows = []
    for gpu in gpus:
        for p in gpu.procs():
            # numbers sit one column left of where N/A ends (real: "    0   N/A  N/A" / "    0    2    0")
            gi = f"{'N/A':>6}" if p["gi"] is None or not gpu.mig_on else f"{p['gi']:>5} "
            ci = f"{'N/A':>5}" if p["ci"] is None or not gpu.mig_on else f"{p['ci']:>4} "
            name = p["name"] if len(p["name"]) <= 38 else "..." + p["name"][-35:]
            rows.append(
                f"|{gpu.index:>5}{gi}{ci}{p['pid']:>16}{p['type']:>7}   {name:<38}{str(p['used']) + 'MiB':>8} |"
            )
    return rows


def summary(gpus: list[Gpu], version: str, cuda: str) -> tuple[list[str], int]:
    """The default table (the lost GPUs' lines first) and the exit code."""
    out: list[str] = []
    live = [g for g in gpus if not g.lost]
    lost = [g for g in gpus if g.lost]
    out += [lost_line(g) for g in lost]
    rc = RC_GPU_IS_LOST if lost else 0
    if not live:
        return out, rc
    out += [
        timestamp_ctime() + "       ",
        BORDER,
        f"| NVIDIA-SMI {version:<23}Driver Version: {version:<15}CUDA Version: {cuda:<9}|",
        GRID,
        *GPU_HEADER,
    ]
    for gpu in live:
        out += gpu_rows(gpu)
    mig_gpus = [g for g in live if g.mig_on]
    if mig_gpus:
        out += ["", *MIG_HEADER]
        rows = [row for g in mig_gpus for row in mig_rows(g)]
        if rows:
            out += rows
        else:
            out += [f"|  {'No MIG devices found':<87}|", BORDER]
    out += ["", *PROC_HEADER]
    procs = proc_rows(live)
    out += procs or [f"|  {'No running processes found':<87}|"]
    out.append(BORDER)
    return out, rc


def list_gpus(gpus: list[Gpu]) -> tuple[list[str], int]:
    """``-L`` and the exit code."""

    def entries(gpu: Gpu) -> list[str]:
        return [
            f"GPU {gpu.index}: {gpu.name} (UUID: {gpu.uuid})",
            *(f"  {'MIG ' + dev['name']:<15} Device {dev['index']:>2}: (UUID: {dev['uuid']})"
              for dev in (gpu.mig_devices() if gpu.mig_on else [])),
        ]

    out: list[str] = []
    rc = for_each_gpu(gpus, out, entries)
    return out, rc
