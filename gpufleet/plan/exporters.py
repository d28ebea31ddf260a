"""Which GPU exporter a host runs (DCGM or gpufleet's NVML exporter) and what it collects."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpufleet.catalog import GpuModel
from gpufleet.config import (
    NodeConfig,
)

from .gpu import Gpu

# DCGM's profiling metrics (DCGM_FI_PROF_*) on this architecture and earlier need NVIDIA's proprietary DCGM package
# (dcgm-exporter's README: "for Ampere and earlier generation GPUs, profiling metrics depend on the
# datacenter-gpu-manager-4-proprietary package").
PROFILING_PACKAGE_UP_TO = "Ampere"


def choose_gpu_exporter(setting: str, models: Iterable[GpuModel | None], dcgm_offered: bool,
                        why_not_offered: str = "") -> tuple[str, str]:
    """(kind, why): ``auto`` is DCGM on datacenter GPUs where apt has dcgm-exporter for the host (its candidate,
    or the NVIDIA repository the stage configures offers it), else gpufleet's NVML exporter; ``why_not_offered``:
    why apt has none, said when that decides."""
    if setting != "auto":
        return setting, f"gpufleet_exporters_gpu={setting}"
    models = list(models)
    if not (bool(models) and all(model is not None and model.datacenter for model in models)):
        return "nvml", "auto: not every GPU is a datacenter GPU: the NVML exporter"
    if not dcgm_offered:
        return "nvml", f"auto: no dcgm-exporter for this host ({why_not_offered or 'apt has no candidate'}): " \
                       "the NVML exporter"
    return "dcgm", "auto: datacenter GPUs and apt has dcgm-exporter for this host"


@dataclass(frozen=True)
class ExportersPlan:
    """Which GPU exporter a host runs (``kind``: dcgm, nvml or none) and what it collects: profiling counters where
    every GPU has them (datacenter GPUs), the proprietary DCGM module where profiling needs it (by GPU generation),
    and how often dcgm-exporter collects."""

    profiling: bool
    profiling_package: bool
    collect_interval_ms: int
    kind: str = "nvml"
    why: str = field(default="", compare=False)  # why this kind (auto's reason), for people

    @classmethod
    def resolve(cls, config: NodeConfig, gpus: Iterable[Gpu], dcgm_offered: bool = False,
                why_not_offered: str = "") -> ExportersPlan:
        """``dcgm_offered``: apt has dcgm-exporter for the host (``auto`` chooses DCGM only then; else
        ``why_not_offered`` says why not)."""
        models = [gpu.model for gpu in gpus]
        profiling = bool(models) and all(m is not None and m.datacenter for m in models)
        package = profiling and any(m.architecture_at_most(PROFILING_PACKAGE_UP_TO) for m in models if m)
        kind, why = choose_gpu_exporter(config.exporters.gpu, models, dcgm_offered, why_not_offered)
        return cls(profiling, package, config.exporters.collect_interval_ms, kind, why)


