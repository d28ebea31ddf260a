"""GPU persistence mode through nvidia-persistenced."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .gpu import Gpu

PERSISTENCED = "nvidia-persistenced"


@dataclass(frozen=True)
class PersistencePlan:
    """GPU persistence mode through the ``nvidia-persistenced`` daemon, which must be active: ``mode`` True runs it
    with ``--persistence-mode``; False with ``--no-persistence-mode`` (a mode set by hand is then left alone)."""

    mode: bool = True
    service: str = PERSISTENCED

    def differs(self, gpu: Gpu) -> bool | None:
        """Whether ``gpu``'s persistence mode is not the planned one (None: not reported)."""
        return None if gpu.persistence is None else gpu.persistence != self.mode

    def diff(self, gpus: Iterable[Gpu]) -> list[str]:
        """UUIDs (index order) of the GPUs the daemon must be restarted for: persistence off where it should be on
        (with ``mode`` False gpufleet does not switch it off)."""
        return [g.uuid for g in sorted(gpus, key=lambda g: g.index) if self.mode and self.differs(g) and g.uuid]
