"""The expected state of a node, from the SAME validated configuration the converge deploy uses.

    from gpufleet.verify.expected import expected_state
    expected = expected_state(node_config, probe_doc, pci=pci_fact)     # or ExpectedState.from_node_config(...)

Each field is resolved the way ``gpufleet.deploys.gpu_node`` resolves it, against the GPUs the probe found, and
only for the stages the host's ``gpufleet_stages`` enables (a stage that is off is not gpufleet's business, so
it is not checked):

* ``driver``: the driver branch (``gpufleet_driver_branch``).
* ``persistence``: persistence mode on every GPU, and ``nvidia-persistenced`` active.
* ``power``: a limit per GPU UUID through :func:`gpufleet.config.resolve_power_limits` (uuid > model >
  fleet-wide; ``"80%"`` of *this* GPU's default limit as NVML reports it), only where a limit is set.
* ``mig``: the layout per GPU index through :func:`gpufleet.deploys.gpu_node.mig_layout` (mig-parted entries,
  device filters, ``devices: all``), only for the GPUs an entry selects.
* ``nccl``: the ``KEY=VALUE`` pairs of ``/etc/nccl.conf`` (none set: no file expected, as the deploy removes it).
* services: ``nvidia-fabricmanager`` active where the host has NVSwitches (from the ``NvidiaPciDevices`` fact,
  or ``nvswitch=`` given by the caller), whatever the stages: GPUs on an NVSwitch board are unusable without it.
* GPU count: the number of NVIDIA GPUs on the PCI bus (when the fact is given), so a GPU the driver no longer
  lists is still missed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.config import ConfigError, NodeConfig, resolve_power_limits
from gpufleet.deploys.gpu_node import mig_layout

from .checks import ExpectedState
from .exporter_checks import expected_exporters

PERSISTENCED = "nvidia-persistenced"
FABRICMANAGER = "nvidia-fabricmanager"


def inventory_gpus(probe: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The probe's GPUs in the shape of the ``GpuInventory`` fact's GPU dicts (what the deploy resolves against):
    index, uuid, name, pci_device_id, power_default_w. GPUs that did not answer carry only their index."""
    gpus = []
    for gpu in probe.get("gpus") or []:
        if not isinstance(gpu, Mapping) or gpu.get("index") is None:
            continue
        power = gpu.get("power") or {}
        gpus.append({
            "index": gpu["index"],
            "uuid": gpu.get("uuid"),
            "name": gpu.get("name"),
            "pci_device_id": gpu.get("pci_device_id"),
            "power_default_w": power.get("default_limit_w"),
            "status": gpu.get("status"),
        })
    return gpus


def _power_limits(config: NodeConfig, gpus: list[dict[str, Any]]) -> dict[str, float]:
    """{uuid: watts} like the deploy; a GPU whose relative limit cannot be resolved (default limit unknown to both
    NVML and the catalog; preflight refuses such a deploy) is left unchecked instead of failing the others."""
    limits: dict[str, float] = {}
    for gpu in gpus:
        if gpu.get("status") not in (None, "ok") or not gpu.get("uuid"):
            continue
        try:
            limits.update(resolve_power_limits(config, [gpu]))
        except ConfigError:
            continue
    return limits


def _nvswitch(pci: Mapping[str, Any] | None, nvswitch: bool | None) -> bool | None:
    if nvswitch is not None:
        return nvswitch
    if pci and not pci.get("error") and pci.get("source"):
        return bool(pci.get("nvswitch_present"))
    return None


def expected_state(config: NodeConfig, probe: Mapping[str, Any], *, pci: Mapping[str, Any] | None = None,
                   nvswitch: bool | None = None) -> ExpectedState:
    """The :class:`ExpectedState` of one node: ``config`` (its validated NodeConfig) resolved against the GPUs in
    ``probe`` (its probe document). ``pci``: the host's ``NvidiaPciDevices`` fact (NVSwitches, GPU count);
    ``nvswitch`` overrides what the fact says. Without either, fabric manager and GPU count are not checked."""
    gpus = inventory_gpus(probe)
    services: dict[str, str] = {}
    if config.stage_enabled("persistence"):
        services[PERSISTENCED] = "active"
    if _nvswitch(pci, nvswitch):
        services[FABRICMANAGER] = "active"
    power: dict[str, float] = {}
    if config.stage_enabled("power") and config.power.managed:
        power = _power_limits(config, gpus)
    mig = None
    if config.stage_enabled("mig") and config.mig is not None:
        mig = mig_layout(config, gpus)
    gpu_count = None
    if pci and not pci.get("error") and pci.get("gpus"):
        gpu_count = len(pci["gpus"])
    return ExpectedState(
        driver_branch=config.driver.branch if config.stage_enabled("driver") else None,
        persistence=True if config.stage_enabled("persistence") else None,
        power_limits_w=power,
        mig=mig,
        nccl=dict(config.nccl.settings) if config.stage_enabled("nccl") else None,
        gpu_count=gpu_count,
        services=services,
        exporters=expected_exporters(config),
    )


def _from_node_config(cls, config: NodeConfig, probe: Mapping[str, Any], *, pci: Mapping[str, Any] | None = None,
                      nvswitch: bool | None = None) -> ExpectedState:
    """``ExpectedState.from_node_config(config, probe, pci=..., nvswitch=...)``: see :func:`expected_state`."""
    return expected_state(config, probe, pci=pci, nvswitch=nvswitch)


# ExpectedState lives in checks.py (the checks own it); the constructor from a NodeConfig lives here, beside the
# deploy-side resolution it reuses, and is attached as a classmethod when gpufleet.verify.expected is imported.
ExpectedState.from_node_config = classmethod(_from_node_config)  # type: ignore[attr-defined]

__all__ = ["FABRICMANAGER", "PERSISTENCED", "expected_state", "inventory_gpus"]
