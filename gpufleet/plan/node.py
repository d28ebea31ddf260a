"""The node plan: every part of a host's plan, resolved once."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from gpufleet.catalog import Catalog
from gpufleet.config import (
    NodeConfig,
)

from .clocks import ClocksPlan
from .driver import DriverPlan
from .exporters import ExportersPlan
from .gpu import Gpu, catalog_model
from .mig import MigPlan
from .nccl import NcclPlan
from .persistence import PersistencePlan
from .power import PowerPlan
from .problems import Problems
from .stages import stage_order


@dataclass(frozen=True)
class NodePlan:
    """A host's configuration resolved against its GPUs; a part is None where its stage is off or unset.
    ``stages``: the enabled stages in the order they run (:data:`STAGE_ORDER`)."""

    host: str
    gpus: tuple[Gpu, ...]
    power: PowerPlan | None = None
    mig: MigPlan | None = None
    clocks: ClocksPlan | None = None
    mig_unused: bool = False  # a MIG layout is configured but the mig stage is off
    stages: tuple[str, ...] = ()
    driver: DriverPlan | None = None
    persistence: PersistencePlan | None = None
    exporters: ExportersPlan | None = None
    nccl: NcclPlan | None = None

    @classmethod
    def resolve(cls, config: NodeConfig, gpus: Iterable[Gpu], catalog: Catalog | None = None, *,
                os_id: str | None = None, nvswitch: bool = False, dcgm_offered: bool = False) -> NodePlan:
        """``os_id``: the OS (``ID`` of os-release), which names the driver's packages; ``nvswitch``: the host has
        NVSwitches (fabric manager); ``dcgm_offered``: a repository offers dcgm-exporter (the exporter choice)."""
        gpus = tuple(gpus)
        if catalog is not None:  # models from another catalog than the default one
            gpus = tuple(_with_model(g, catalog) for g in gpus)
        power = PowerPlan.resolve(config, gpus) if config.stage_enabled("power") and config.power.managed else None
        mig = MigPlan.resolve(config.mig, gpus) if config.stage_enabled("mig") and config.mig is not None else None
        clocks = None
        if config.stage_enabled("clocks") and config.clocks.mode is not None:
            clocks = ClocksPlan(config.clocks.lock_gpu_mhz if config.clocks.mode == "lock" else None)
        driver = DriverPlan.resolve(config, gpus, os_id, nvswitch) if config.stage_enabled("driver") else None
        persistence = PersistencePlan() if config.stage_enabled("persistence") else None
        exporters = ExportersPlan.resolve(config, gpus, dcgm_offered) if config.stage_enabled("exporters") else None
        nccl = NcclPlan(dict(config.nccl.settings)) if config.stage_enabled("nccl") else None
        return cls(config.host, gpus, power, mig, clocks,
                   mig_unused=config.mig is not None and not config.stage_enabled("mig"), stages=stage_order(config),
                   driver=driver, persistence=persistence, exporters=exporters, nccl=nccl)

    def problems(self, lost: list[str] | None = None) -> Problems:
        """Everything preflight reports about power, MIG and clocks on this host."""
        lost = list(lost or [])
        out = Problems()
        gpus = list(self.gpus)
        if self.mig_unused:
            out.warnings.append(f"{self.host}: a MIG layout is configured (gpufleet_mig) but gpufleet_stages leaves "
                                "out 'mig': the layout is not applied")
        if self.power is not None:
            out.extend(self.power.problems(self.host, gpus, lost))
        if self.mig is not None:
            out.extend(self.mig.problems(self.host, gpus, lost=len(lost)))
        if self.clocks is not None:
            out.extend(self.clocks.problems(self.host, gpus))
        return out


def _with_model(gpu: Gpu, catalog: Catalog) -> Gpu:
    return replace(gpu, model=catalog_model(gpu.name, gpu.pci_device_id, catalog))
