"""Where the simulated fleet keeps its state on the control machine."""

from __future__ import annotations

import os
from pathlib import Path


def sim_dir() -> Path:
    """Runtime state of the fleet: hosts' overlays, keys, inventory, pids."""
    return Path(os.environ.get("GPUFLEET_SIM_DIR", "/var/lib/gpufleet-sim"))


def cache_dir() -> Path:
    """Survives `sim down`: the base image tarball and the built package repository."""
    return Path(os.environ.get("GPUFLEET_SIM_CACHE", "/var/cache/gpufleet-sim"))


def host_dir(name: str) -> Path:
    return sim_dir() / "hosts" / name
