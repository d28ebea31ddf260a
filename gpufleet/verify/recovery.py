"""The GPU recovery action (NVML ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, dcgm-exporter's
``DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION``): what the driver says a GPU needs after an uncorrectable error, and how
gpufleet rates it. verify's ``health.recovery_action`` (from the probe) and the alerts ``GpuRecoveryActionRequired``
(critical) / ``GpuRecoveryActionDrain`` (warning) share this table.

Values are NVML's ``nvmlDeviceGpuRecoveryAction_t`` (nvidia-ml-py's ``NVML_GPU_RECOVERY_ACTION_*``; the names
here are those constants' suffixes in lower case). Severity is gpufleet's: critical where the GPU cannot be used
until the action is done; warning where work is drained first and the GPU keeps serving the rest.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RecoveryAction:
    value: int
    name: str
    severity: str | None  # None (no action), "warning" or "critical"
    todo: str


RECOVERY_ACTIONS: dict[int, RecoveryAction] = {a.value: a for a in (
    RecoveryAction(0, "none", None, "nothing: the GPU can be used by a new process"),
    RecoveryAction(1, "gpu_reset", "critical", "stop the GPU's processes and reset it (nvidia-smi -r)"),
    RecoveryAction(2, "node_reboot", "critical", "reboot the node"),
    RecoveryAction(3, "drain_p2p", "warning",
                   "stop the processes that use peer-to-peer traffic, then read the recovery action again"),
    RecoveryAction(4, "drain_and_reset", "warning", "drain the GPU's work, then reset it (nvidia-smi -r)"),
    RecoveryAction(5, "recover_imex_domain", "warning", "recover the IMEX domain (multi-node NVLink)"),
    RecoveryAction(6, "bus_reset", "critical", "reset the GPU's PCIe bus"),
    RecoveryAction(7, "system_reboot", "critical", "reboot the system"),
)}


def recovery_action(value: int) -> RecoveryAction:
    """The action of ``value``; a value newer than this table is critical (unknown: act on the driver's word)."""
    return RECOVERY_ACTIONS.get(value) or RecoveryAction(value, "unknown", "critical",
                                                         "a recovery action gpufleet does not know: see NVML's "
                                                         "nvmlDeviceGpuRecoveryAction_t")
