"""A catalog model document from what a live GPU reports (``gpufleet catalog learn``).

Input is already parsed: one GPU's ``nvidia-smi -q`` tree (labels as printed), the same model's other boards (each
distinct ``Default / Min / Max Power Limit`` is a board variant), ``compute_cap`` from ``--query-gpu``, the NVLink
count from ``nvidia-smi nvlink -s`` and, on a MIG-enabled GPU, the ``mig -lgip`` / ``-lgipp`` rows. Every value read
from the node is tagged ``real: <origin>`` (host and date); what a node cannot tell (datasheet peaks, memory
bandwidth, NVSwitch baseboards) comes from ``known`` (a catalogued model of the same PCI device id, its sources
kept) or is ``null`` / ``unverified``. The document passes :func:`gpufleet.catalog.parse_model`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ._loader import ARCHITECTURES, MODEL_FIELDS, PRECISIONS, SCHEMA_VERSION, GpuModel

# NVML's GPU instance profile enum by the -lgip name's shape (nvml.h NVML_GPU_INSTANCE_PROFILE_*): Ng -> N-slice,
# "+me" -> REV1, a 1g profile with two memory slices -> REV2
_SLICE_ENUM = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
_REV1_ENUM = {1: 7, 2: 8}
_REV2_1G = 9
# Product Brand of datacenter boards; workstation boards print "NVIDIA RTX" / "Quadro", consumer ones "GeForce"
_DATACENTER_BRANDS = ("NVIDIA", "Tesla")
_UNKNOWN = "unverified: not readable from a node (gpufleet catalog learn); add it from NVIDIA's datasheet"


class LearnError(ValueError):
    """The GPU's report cannot make a model (the message says what is missing)."""


def model_key(name: str) -> str:
    """``NVIDIA GH200 480GB`` -> ``gh200-480gb``, ``Tesla V100-SXM2-16GB`` -> ``v100-sxm2-16gb``."""
    text = re.sub(r"^(NVIDIA|Tesla|GeForce)\s+", "", name.strip(), flags=re.I)
    text = re.sub(r"^(NVIDIA|GeForce)\s+", "", text, flags=re.I)
    key = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if not key:
        raise LearnError(f"no catalog key can be made of the name {name!r}")
    return key


def _number(value: Any) -> float | None:
    match = re.match(r"^\s*(-?\d+(?:\.\d+)?)", value) if isinstance(value, str) else None
    return float(match.group(1)) if match else None


def _int(value: Any) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def _get(tree: Mapping, *path: str) -> Any:
    node: Any = tree
    for step in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(step)
    return node


def _power_variants(boards: Sequence[Mapping], real: str) -> list[dict]:
    seen: dict[tuple, list[str]] = {}
    for board in boards:
        readings = board.get("GPU Power Readings") or board.get("Power Readings") or {}
        limits = tuple(_number(readings.get(f"{kind} Power Limit")) for kind in ("Default", "Min", "Max"))
        seen.setdefault(limits, []).append(str(board.get("Bus Id")))
    return [{"default_w": default, "min_w": low, "max_w": high,
             "source": f"{real}: Default / Min / Max Power Limit on {', '.join(buses)}"}
            for (default, low, high), buses in seen.items()]


def _temperatures(gpu: Mapping, real: str) -> dict[str, tuple[Any, str]]:
    temps = gpu.get("Temperature") or {}
    labels = {"temp_shutdown_c": "GPU Shutdown Temp", "temp_slowdown_c": "GPU Slowdown Temp",
              "temp_max_operating_c": "GPU Max Operating Temp", "temp_target_c": "GPU Target Temperature",
              "temp_shutdown_tlimit_c": "GPU Shutdown T.Limit Temp",
              "temp_slowdown_tlimit_c": "GPU Slowdown T.Limit Temp",
              "temp_max_operating_tlimit_c": "GPU Max Operating T.Limit Temp"}
    return {field: (_int(temps.get(label)), f"{real}: {label} {temps.get(label, 'not printed')}")
            for field, label in labels.items()}


def _mig(gpu: Mapping, profiles: Sequence[Mapping], placements: Mapping[int, Sequence[tuple[int, int]]],
         known: GpuModel | None, real: str, known_source: str | None) -> tuple[Any, str]:
    mode = _get(gpu, "MIG Mode", "Current")
    if mode in (None, "N/A"):
        return None, f"{real}: MIG Mode {mode or 'not printed'} (not MIG-capable)"
    if not profiles:
        if known is not None and known.mig is not None:
            return _known_mig(known), f"{known_source}; MIG Mode {mode} here (profiles listed only in MIG mode)"
        raise LearnError(f"the GPU is MIG-capable (MIG Mode {mode}) but its profiles are listed only in MIG mode "
                         "and no catalogued model has them: learn again with MIG enabled")
    smallest = min(float(row["memory_gib"]) for row in profiles)
    rows = []
    for row in profiles:
        match = re.match(r"^(\d+)g\.(\d+)gb(\+me)?", row["name"])
        if not match:
            raise LearnError(f"MIG profile name {row['name']!r} is not like '1g.10gb'")
        compute = int(match.group(1))
        spots = list(placements.get(row["id"]) or [])
        # without a -lgipp placement: the memory's multiple of the smallest profile's, to a power of two
        memory_slices = spots[0][1] if spots else 1 << round(math.log2(float(row["memory_gib"]) / smallest))
        enum, enum_source = _nvml_enum(row["name"], compute, memory_slices, bool(match.group(3)), known)
        rows.append({
            "name": row["name"], "id": row["id"], "nvml_profile_enum": enum, "max_instances": row["total"],
            "memory_mib": None, "memory_gib_printed": f"{float(row['memory_gib']):.2f}", "compute_slices": compute,
            "memory_slices": memory_slices, "sm_count": row["sm"], "copy_engines": row["ce"], "decoders": row["dec"],
            "encoders": row["enc"], "jpeg": row["jpeg"], "ofa": row["ofa"], "p2p": row["p2p"],
            "placements": [list(p) for p in spots],
            "verified": f"{real}: mig -lgip / -lgipp; nvml_profile_enum {enum_source}"})
    slices = max(r["compute_slices"] for r in rows)
    memory = max((start + size for r in rows for start, size in r["placements"]), default=slices)
    return ({"compute_slices": slices, "memory_slices": memory, "gpu_instance_profiles": rows},
            f"{real}: nvidia-smi mig -lgip and -lgipp")


def _nvml_enum(name: str, compute: int, memory_slices: int, media: bool, known: GpuModel | None) -> tuple[int, str]:
    if known is not None and known.mig is not None:
        for prof in known.mig.gpu_instance_profiles:
            if prof.name == name:
                return prof.nvml_profile_enum, f"from the catalogued {known.key}"
    if media and compute in _REV1_ENUM:
        return _REV1_ENUM[compute], "from the name (+me: NVML's *_REV1)"
    if compute == 1 and memory_slices == 2:
        return _REV2_1G, "from the name (1g with two memory slices: NVML's 1_SLICE_REV2)"
    if compute in _SLICE_ENUM:
        return _SLICE_ENUM[compute], f"from the name (NVML's {compute}_SLICE)"
    raise LearnError(f"MIG profile {name!r}: no NVML profile enum is known for {compute} slices")


def _known_mig(model: GpuModel) -> dict:
    mig = model.mig
    fields = ("name", "id", "nvml_profile_enum", "max_instances", "memory_mib", "memory_gib_printed",
              "compute_slices", "memory_slices", "sm_count", "copy_engines", "decoders", "encoders", "jpeg", "ofa",
              "p2p", "verified")
    return {"compute_slices": mig.compute_slices, "memory_slices": mig.memory_slices,
            "gpu_instance_profiles": [{**{f: getattr(p, f) for f in fields},
                                       "placements": [list(x) for x in p.placements]}
                                      for p in mig.gpu_instance_profiles]}


def learn_model(gpu: Mapping, *, origin: str, boards: Sequence[Mapping] = (), compute_cap: str | None = None,
                nvlinks: int | None = None, mig_profiles: Sequence[Mapping] = (),
                mig_placements: Mapping[int, Sequence[tuple[int, int]]] | None = None,
                known: GpuModel | None = None, key: str | None = None) -> dict:
    """The model document (``{"schema": 1, "key": ..., field: {"value", "source"}}``) of ``gpu``.

    + origin: what read it, for every ``real:`` source (``nvidia-smi 550.90.07 on node01, 2026-12-08``)
    + boards: every GPU tree of this model on the host (power variants); default ``[gpu]``
    + known: the catalogued model of this PCI device id, for what a node cannot tell
    """
    real = f"real: {origin}"
    name = gpu.get("Product Name")
    device = _get(gpu, "PCI", "Device Id")
    if not name or not device:
        raise LearnError("the GPU report has no Product Name or PCI Device Id")
    architecture = gpu.get("Product Architecture")
    if architecture not in ARCHITECTURES:
        if known is None:
            raise LearnError(f"{name}: architecture {architecture!r} is not one of {', '.join(ARCHITECTURES)}")
        architecture = known.architecture
    if compute_cap is None and known is None:
        raise LearnError(f"{name}: compute capability unknown (nvidia-smi --query-gpu=compute_cap gave none)")
    brand = gpu.get("Product Brand")
    link = _get(gpu, "PCI", "GPU Link Info") or {}
    clocks = gpu.get("Max Clocks") or {}
    memory = gpu.get("FB Memory Usage") or {}
    ecc = _get(gpu, "ECC Mode", "Current")
    remapped = gpu.get("Remapped Rows")
    mig_on = _get(gpu, "MIG Mode", "Current") == "Enabled"

    def from_known(field: str, fallback: Any, source: str = _UNKNOWN) -> tuple[Any, str]:
        if known is not None:
            return getattr(known, field), f"{known.sources[field]} (catalogued {known.key})"
        return fallback, source

    values: dict[str, tuple[Any, str]] = {
        "name": (name, f"{real}: Product Name"),
        "pci_device_id": (device.upper().replace("0X", "0x"), f"{real}: PCI Device Id"),
        "architecture": (architecture, f"{real}: Product Architecture {gpu.get('Product Architecture')}"),
        "compute_capability": (compute_cap, f"{real}: --query-gpu=compute_cap") if compute_cap
        else from_known("compute_capability", None),
        "datacenter": (brand in _DATACENTER_BRANDS, f"{real}: Product Brand {brand}"),
        "form_factor": from_known("form_factor", "SXM" if "SXM" in name.upper() else "PCIe",
                                  "unverified: from the product name"),
        "sm_count": from_known("sm_count", None),
        "memory_mib": (_int(memory.get("Total")), f"{real}: FB Memory Usage Total"),
        "memory_type": from_known("memory_type", "unknown"),
        "memory_bandwidth_gbs": from_known("memory_bandwidth_gbs", None),
        "power_limits_w": (_power_variants(list(boards) or [gpu], real), f"{real}: each board's power limits"),
        "clocks_max_sm_mhz": (_int(clocks.get("SM")), f"{real}: Max Clocks SM"),
        "clocks_max_mem_mhz": (_int(clocks.get("Memory")), f"{real}: Max Clocks Memory"),
        "clocks_max_graphics_mhz": (_int(clocks.get("Graphics")), f"{real}: Max Clocks Graphics"),
        "pcie_gen_max": (_int(_get(link, "PCIe Generation", "Device Max") or _get(link, "PCIe Generation", "Max")),
                         f"{real}: PCIe Generation Device Max"),
        "pcie_width_max": (_int(_get(link, "Link Width", "Max")), f"{real}: Link Width Max"),
        "nvlink_count": (nvlinks, f"{real}: nvidia-smi nvlink -s links") if nvlinks is not None
        else from_known("nvlink_count", 0),
        "nvswitch_systems": from_known("nvswitch_systems", False),
        "ecc_supported": (ecc not in (None, "N/A"), f"{real}: ECC Mode Current {ecc}"),
        "row_remap_supported": from_known("row_remap_supported", False) if mig_on
        else (isinstance(remapped, Mapping), f"{real}: Remapped Rows {'counted' if remapped else 'N/A'}"),
        "persistence_supported": (gpu.get("Persistence Mode") in ("Enabled", "Disabled"),
                                  f"{real}: Persistence Mode {gpu.get('Persistence Mode')}"),
        **_temperatures(gpu, real),
        "dense_tflops": from_known("dense_tflops", dict.fromkeys(PRECISIONS)),
        "sparse_tflops": from_known("sparse_tflops", dict.fromkeys(PRECISIONS)),
        "mig": _mig(gpu, mig_profiles, mig_placements or {}, known, real,
                    known.sources["mig"] if known is not None else None),
        "brand": (brand, f"{real}: Product Brand"),
        "other_pci_device_ids": ([], f"{real}: one device id seen"),
        "pci_sub_device_id_example": (_get(gpu, "PCI", "Sub System Id"), f"{real}: Sub System Id"),
        "vbios_example": (gpu.get("VBIOS Version"), f"{real}: VBIOS Version"),
        "memory_reserved_mib": (_int(memory.get("Reserved")), f"{real}: FB Memory Usage Reserved"),
        "clocks_max_video_mhz": (_int(clocks.get("Video")), f"{real}: Max Clocks Video"),
        "nvlink_speed_gbs": from_known("nvlink_speed_gbs", None),
    }
    missing = set(MODEL_FIELDS) - set(values)
    if missing:  # pragma: no cover - kept in step with the loader
        raise LearnError(f"learn does not fill {sorted(missing)}")
    doc: dict[str, Any] = {"schema": SCHEMA_VERSION, "key": key or model_key(name)}
    for field in MODEL_FIELDS:
        value, source = values[field]
        doc[field] = {"value": value, "source": source}
    return doc
