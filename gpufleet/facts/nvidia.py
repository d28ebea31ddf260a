"""Facts read from ``nvidia-smi``: parse, never decide."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

# Query fields and the keys they are parsed into (one nvidia-smi call per host, not per GPU).
GPU_FIELDS = {
    "index": "index",
    "name": "name",
    "uuid": "uuid",
    "pci.bus_id": "pci_bus_id",
    "driver_version": "driver_version",
    "memory.total": "memory_total_mib",
    "persistence_mode": "persistence_mode",
    "power.limit": "power_limit_w",
    "power.default_limit": "power_default_w",
    "power.min_limit": "power_min_w",
    "power.max_limit": "power_max_w",
    "temperature.gpu": "temperature_c",
    "mig.mode.current": "mig_current",
    "mig.mode.pending": "mig_pending",
}
NUMERIC = {"index": int, "memory_total_mib": int, "temperature_c": int, "power_limit_w": float,
           "power_default_w": float, "power_min_w": float, "power_max_w": float}
NOT_AVAILABLE = {"[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]"}
EXIT_MARKER = "gpufleet-nvidia-smi-exit="


def parse_csv_value(key: str, raw: str):
    value = raw.strip()
    if value in NOT_AVAILABLE:
        return None
    convert = NUMERIC.get(key)
    return convert(value) if convert else value


class GpuInventory(FactBase):
    """
    The GPUs nvidia-smi sees, one query for all of them.

    .. code:: python

        {"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-…", "power_limit_w": 700.0, …}],
         "error": None}

    ``error`` carries nvidia-smi's message when it fails (driver not loaded, version mismatch…);
    ``gpus`` is empty when nvidia-smi is not installed.
    """

    requires_command = "nvidia-smi"

    @staticmethod
    def default():
        return {"gpus": [], "error": "nvidia-smi not found"}

    def command(self) -> str:
        query = shlex.quote("--query-gpu=" + ",".join(GPU_FIELDS))
        return f"nvidia-smi {query} --format=csv,noheader,nounits 2>&1; echo {EXIT_MARKER}$?"

    def process(self, output):
        lines = [line for line in output if line.strip()]
        exit_code = 0
        if lines and lines[-1].startswith(EXIT_MARKER):
            exit_code = int(lines.pop()[len(EXIT_MARKER):])
        if exit_code != 0:
            return {"gpus": [], "error": " ".join(lines) or f"nvidia-smi exited {exit_code}"}
        keys = list(GPU_FIELDS.values())
        gpus = []
        for line in lines:
            values = [v.strip() for v in line.split(",")]
            if len(values) != len(keys):
                return {"gpus": [], "error": f"unexpected nvidia-smi output: {line!r}"}
            gpus.append({key: parse_csv_value(key, raw) for key, raw in zip(keys, values, strict=True)})
        return {"gpus": gpus, "error": None}
