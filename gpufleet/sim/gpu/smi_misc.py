"""``nvidia-smi nvlink -s``, ``topo -m`` and ``--version``."""

from __future__ import annotations

import os

from .smi_common import Gpu, bad_option, for_each_gpu, invalid_combination, major, select

TOPO_LEGEND = [
    "",
    "Legend:",
    "",
    "  X    = Self",
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    "  PIX  = Connection traversing at most a single PCIe bridge",
    "  NV#  = Connection traversing a bonded set of # NVLinks",
]


def version_banner(version: str, cuda: str) -> list[str]:
    nvml = ".".join(version.split(".")[:2])
    if major(version) >= 610:  # real 610.57.04: DRIVER / CUDA version deprecated for KMD / CUDA UMD version
        return [
            f"NVIDIA-SMI version  : {version}",
            f"NVML version        : {nvml}",
            'DRIVER version      : Deprecated, see "KMD version" instead',
            'CUDA version        : Deprecated, see "CUDA UMD version" instead',
            f"KMD version         : {version}",
            f"CUDA UMD version    : {cuda}",
        ]
    return [
        f"NVIDIA-SMI version  : {version}",
        f"NVML version        : {nvml}",
        f"DRIVER version      : {version}",
        f"CUDA Version        : {cuda}",
    ]


def nvlink(argv: list[str], state: dict[str, str]) -> tuple[list[str], int]:
    id_arg = None
    status = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-s", "--status"):
            status = True
        elif arg in ("-i", "--id") and i + 1 < len(argv):
            id_arg = argv[i + 1]
            i += 1
        elif arg.startswith("--id="):
            id_arg = arg[5:]
        else:
            raise bad_option(arg)
        i += 1
    if not status:
        raise invalid_combination()

    def links(g: Gpu) -> list[str]:
        title = f"GPU {g.index}: {g.name} (UUID: {g.uuid})"
        if g.mig_on:
            return [title, "Nvlink queries are not supported for Devices in MIG mode"]
        count = g.i("nvlink.count")
        if count == 0:
            return [title, "Device does not have or support Nvlink"]
        down = {int(x) for x in g.s("nvlink.down").split(",") if x.strip().isdigit()}
        speed = g.s("nvlink.speed_gbps", "26.562")
        return [title, *(f"\t Link {link}: " + ("<inactive>" if link in down else f"{speed} GB/s")
                         for link in range(count))]

    out: list[str] = []
    rc = for_each_gpu(select(state, id_arg), out, links)
    return out, rc


def _numa(g: Gpu, gpus: list[Gpu]) -> int:
    if len(gpus) < 4:
        return 0
    return 0 if g.index < len(gpus) // 2 else 1


def topo(argv: list[str], state: dict[str, str]) -> tuple[list[str], int]:
    if argv not in (["-m"], ["--matrix"]):
        raise invalid_combination() if not argv else bad_option(argv[0])
    gpus = [g for g in select(state, None) if not g.lost]
    cpus = os.cpu_count() or 1
    nodes = 2 if len(gpus) >= 4 and cpus >= 2 else 1
    per_node = max(cpus // nodes, 1)
    names = [f"GPU{g.index}" for g in gpus]
    out = ["\t\x1b[4m" + "\t".join(names + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]) + "\x1b[0m"]
    for a in gpus:
        cells = []
        for b in gpus:
            if a.index == b.index:
                cells.append(" X ")
            elif a.i("nvlink.count") and b.i("nvlink.count") and not a.mig_on and not b.mig_on:
                cells.append(f"NV{min(a.i('nvlink.count'), b.i('nvlink.count'))}")
            else:
                cells.append("NODE" if _numa(a, gpus) == _numa(b, gpus) else "SYS")
        node = _numa(a, gpus) if nodes == 2 else 0
        affinity = f"{node * per_node}-{node * per_node + per_node - 1}"
        out.append("\t".join([f"GPU{a.index}", *cells, affinity, str(node), "", "N/A"]))
    return out + TOPO_LEGEND, 0
