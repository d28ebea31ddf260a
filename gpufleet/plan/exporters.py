"""Which GPU exporter a host runs (DCGM or gpufleet's NVML exporter) and what it collects."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpufleet.catalog import GpuModel
from gpufleet.config import (
    NodeConfig,
)

from .gpu import Gpu

# DCGM's profiling metrics (DCGM_FI_PROF_*) on this architecture and earlier need NVIDIA's proprietary DCGM package
# (dcgm-exporter's README: "for Ampere and earlier generation GPUs, profiling metrics depend on the
# datacenter-gpu-manager-4-proprietary package").
PROFILING_PACKAGE_UP_TO = "Ampere"


def choose_gpu_exporter(setting: str, models: Iterable[GpuModel | None], dcgm_offered: bool) -> str:
    """``auto``: DCGM on datacenter GPUs when the repository offers it, else gpufleet's NVML exporter."""
    if setting != "auto":
        return setting
    models = list(models)
    datacenter = bool(models) and all(model is not None and model.datacenter for model in models)
    return "dcgm" if datacenter and dcgm_offered else "nvml"


@dataclass(frozen=True)
class ExportersPlan:
    """Which GPU exporter a host runs (``kind``: dcgm, nvml or none) and what it collects: profiling counters where
    every GPU has them (datacenter GPUs), the proprietary DCGM module where profiling needs it (by GPU generation),
    and how often dcgm-exporter collects."""

    profiling: bool
    profiling_package: bool
    collect_interval_ms: int
    kind: str = "nvml"

    @classmethod
    def resolve(cls, config: NodeConfig, gpus: Iterable[Gpu], dcgm_offered: bool = False) -> ExportersPlan:
        """``dcgm_offered``: a repository of the host offers dcgm-exporter (``auto`` chooses DCGM only then)."""
        models = [gpu.model for gpu in gpus]
        profiling = bool(models) and all(m is not None and m.datacenter for m in models)
        package = profiling and any(m.architecture_at_most(PROFILING_PACKAGE_UP_TO) for m in models if m)
        return cls(profiling, package, config.exporters.collect_interval_ms,
                   choose_gpu_exporter(config.exporters.gpu, models, dcgm_offered))


