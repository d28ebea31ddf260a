"""The order the GPU node's stages run in."""

from __future__ import annotations

from gpufleet.config import (
    NodeConfig,
)

# The order the GPU node's stages run in (the deploy follows it): the driver first (the GPU stages need the GPUs it
# lists); MIG before power limits and clocks (a MIG mode change resets the GPU, which then loses its power limit and
# locked clocks; the boot units are ordered the same way); Slurm's gres.conf after the MIG layout it describes; the
# exporters last (they publish what the stages set).
STAGE_ORDER = ("driver", "persistence", "mig", "power", "nccl", "clocks", "slurm", "exporters")
# The stages that set the GPUs: planned from the GPUs the driver lists
GPU_STAGES = ("persistence", "mig", "power", "nccl", "clocks", "slurm")


def stage_order(config: NodeConfig) -> tuple[str, ...]:
    """The host's enabled stages (``gpufleet_stages``), in the order they run."""
    return tuple(stage for stage in STAGE_ORDER if config.stage_enabled(stage))
