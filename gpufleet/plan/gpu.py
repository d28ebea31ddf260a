"""One GPU as the plan sees it, whoever saw it (nvidia-smi, the PCI bus, the verify probe), and its catalog model."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.catalog import Catalog, GpuModel, UnknownGpuModel, load_catalog
from gpufleet.node import mig_compare

from .architecture import architecture_of_chip, architecture_of_compute_cap, chip_of


def catalog_model(name: Any = None, pci_device_id: Any = None, catalog: Catalog | None = None) -> GpuModel | None:
    """The catalog model of a GPU: by the name nvidia-smi prints (or a catalog key), else by PCI device id."""
    catalog = catalog or load_catalog()
    if isinstance(name, str):
        if name in catalog:
            return catalog.get(name)
        try:
            return catalog.by_name(name)
        except UnknownGpuModel:
            pass
    if pci_device_id:
        return catalog.by_pci_device_id(pci_device_id)
    return None


# nvidia-smi's ``Enabled``/``Disabled`` or the probe's booleans -> bool; None when not reported
_mode = mig_compare.mode_of


@dataclass(frozen=True)
class Gpu:
    """One GPU, whoever saw it: the ``GpuInventory`` fact (``source="nvidia-smi"``), the PCI bus without a driver
    (``"pci"``), or the verify probe (``"probe"``). ``None``: not reported."""

    index: int
    source: str
    model: GpuModel | None = None
    name: str | None = None
    uuid: str | None = None
    pci_device_id: str | None = None
    pci_bus_id: str | None = None
    status: str = "ok"  # the probe's per-GPU status (gpu_lost...); always "ok" from nvidia-smi
    power_limit_w: float | None = None
    power_default_w: float | None = None
    power_min_w: float | None = None
    power_max_w: float | None = None
    mig_current: bool | None = None  # None: no MIG on this GPU
    mig_pending: bool | None = None
    persistence: bool | None = None
    clocks_max_sm_mhz: int | None = None
    compute_cap: str | None = None  # nvidia-smi's, once a driver answers
    pci_name: str | None = None  # the PCI ID database's name of the device id: ``GV100GL [Tesla V100 SXM2 16GB]``

    @classmethod
    def from_fact(cls, gpu: Mapping, catalog: Catalog | None = None, pci_name: str | None = None) -> Gpu:
        """From one GPU dict of the ``GpuInventory`` fact (``pci_name``: from the ``NvidiaPciDevices`` fact)."""
        return cls(
            index=gpu.get("index", 0), source="nvidia-smi",
            model=catalog_model(gpu.get("name"), gpu.get("pci_device_id"), catalog),
            name=gpu.get("name"), uuid=gpu.get("uuid"), pci_device_id=gpu.get("pci_device_id"),
            pci_bus_id=gpu.get("pci_bus_id"), power_limit_w=gpu.get("power_limit_w"),
            power_default_w=gpu.get("power_default_w"), power_min_w=gpu.get("power_min_w"),
            power_max_w=gpu.get("power_max_w"), mig_current=_mode(gpu.get("mig_current")),
            mig_pending=_mode(gpu.get("mig_pending")), persistence=_mode(gpu.get("persistence_mode")),
            clocks_max_sm_mhz=gpu.get("clocks_max_sm_mhz"), compute_cap=gpu.get("compute_cap"), pci_name=pci_name)

    @classmethod
    def from_pci(cls, index: int, device: Mapping, catalog: Catalog | None = None) -> Gpu:
        """From one device of the ``NvidiaPciDevices`` fact (no driver: identity from the PCI device id only)."""
        return cls(index=index, source="pci", model=catalog_model(None, device.get("pci_device_id"), catalog),
                   pci_device_id=device.get("pci_device_id"), pci_bus_id=device.get("address"),
                   pci_name=device.get("pci_name"))

    @classmethod
    def from_probe(cls, gpu: Mapping, catalog: Catalog | None = None) -> Gpu:
        """From one GPU of a verify probe document (``gpufleet/probe/probe.py``)."""
        power = gpu.get("power") or {}
        mig = gpu.get("mig") or {}
        return cls(
            index=gpu["index"], source="probe", model=catalog_model(gpu.get("name"), gpu.get("pci_device_id"), catalog),
            name=gpu.get("name"), uuid=gpu.get("uuid"), pci_device_id=gpu.get("pci_device_id"),
            pci_bus_id=gpu.get("pci_bus_id"), status=gpu.get("status") or "ok",
            power_limit_w=power.get("limit_w"), power_default_w=power.get("default_limit_w"),
            power_min_w=power.get("min_limit_w"), power_max_w=power.get("max_limit_w"),
            mig_current=_mode(mig.get("mode_current")), mig_pending=_mode(mig.get("mode_pending")),
            persistence=_mode(gpu.get("persistence_mode")),
            clocks_max_sm_mhz=(gpu.get("clocks") or {}).get("max_sm_mhz"))

    @property
    def display_name(self) -> str:
        if self.name:
            return self.name
        if self.model is not None:
            return self.model.name
        if self.pci_name:
            return f"{self.pci_name} {self.pci_device_id or ''}".strip()
        return f"unknown NVIDIA GPU {self.pci_device_id or ''}".strip()

    @property
    def chip(self) -> str | None:
        """The chip code from the PCI ID database (``GV100GL``), if it has one for this device id."""
        return chip_of(self.pci_name)

    @property
    def architecture(self) -> str | None:
        """The architecture: the catalog model's, else from nvidia-smi's ``compute_cap``, else from the chip code of
        the PCI ID database; None when none of them knows this GPU."""
        if self.model is not None:
            return self.model.architecture
        return architecture_of_compute_cap(self.compute_cap) or architecture_of_chip(self.chip)

    @property
    def label(self) -> str:
        """``GPU 0 (00000000:18:00.0, NVIDIA H100 80GB HBM3)``: how operations name a GPU."""
        return f"GPU {self.index} ({self.pci_bus_id}, {self.name})"

    @property
    def default_power_w(self) -> float | None:
        """The default power limit: NVML's when reported, else the catalog's."""
        if self.power_default_w is not None:
            return float(self.power_default_w)
        return self.model.power_default_w if self.model is not None else None

    @property
    def power_range_w(self) -> tuple[float | None, float | None]:
        """(min, max) power limit: NVML's when reported, else the catalog's."""
        model = self.model
        low = self.power_min_w if self.power_min_w is not None else (model.power_min_w if model else None)
        high = self.power_max_w if self.power_max_w is not None else (model.power_max_w if model else None)
        return low, high


def gpus_from_facts(gpu_inventory: Mapping | None, pci: Mapping | None = None,
                    catalog: Catalog | None = None) -> list[Gpu]:
    """The host's GPUs: nvidia-smi's list when it answered, else the NVIDIA PCI display devices (in PCI address
    order, nvidia-smi's index order)."""
    listed = (gpu_inventory or {}).get("gpus") or []
    if listed:
        names = {d.get("pci_device_id"): d.get("pci_name") for d in (pci or {}).get("gpus") or []}
        return [Gpu.from_fact({"index": i, **gpu}, catalog, names.get(gpu.get("pci_device_id")))
                for i, gpu in enumerate(listed)]
    return [Gpu.from_pci(i, dev, catalog) for i, dev in enumerate((pci or {}).get("gpus") or [])]


def gpus_from_probe(probe: Mapping, catalog: Catalog | None = None) -> list[Gpu]:
    """The GPUs of a probe document (GPUs without an index are skipped)."""
    return [Gpu.from_probe(g, catalog) for g in probe.get("gpus") or []
            if isinstance(g, Mapping) and g.get("index") is not None]


def gpu_label(gpus: Iterable[Gpu]) -> str:
    """``GPU 0 (NAME)``, ``GPUs 0-7 (NAME)``, ``GPUs 0, 2 (NAME)``: how preflight names a group of GPUs."""
    gpus = list(gpus)
    indices = sorted(g.index for g in gpus)
    names = sorted({g.display_name for g in gpus})
    if len(indices) == 1:
        which = f"GPU {indices[0]}"
    elif indices == list(range(indices[0], indices[-1] + 1)):
        which = f"GPUs {indices[0]}-{indices[-1]}"
    else:
        which = "GPUs " + ", ".join(map(str, indices))
    return f"{which} ({', '.join(names)})"
