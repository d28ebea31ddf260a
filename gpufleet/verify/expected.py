"""The expected state of a node, from the same validated configuration the converge deploy uses.

    from gpufleet.verify.expected import expected_state
    expected = expected_state(node_config, probe_doc, pci=pci_fact)     # or ExpectedState.from_node_config(...)

Each field comes from the node plan (:class:`gpufleet.plan.NodePlan`) resolved against the GPUs the probe found,
only for the stages the host enables (a stage that is off is not checked); the fabric manager where the host has
NVSwitches and the GPU count on the PCI bus are expected whatever the stages. docs/verify.md lists the checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.config import NodeConfig
from gpufleet.plan import PERSISTENCED, NodePlan, gpus_from_probe

from .checks import ExpectedState
from .exporter_checks import expected_exporters

FABRICMANAGER = "nvidia-fabricmanager"


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
    # GPUs that did not answer have no trustworthy identity or limits: nothing is resolved for them
    plan = NodePlan.resolve(config, [g for g in gpus_from_probe(probe) if g.status == "ok"])
    services: dict[str, str] = {}
    if plan.persistence is not None:
        services[plan.persistence.service] = "active"
    if _nvswitch(pci, nvswitch):
        services[FABRICMANAGER] = "active"
    power = plan.power.limits if plan.power is not None else {}
    mig = dict(plan.mig.layout) if plan.mig is not None else None
    gpu_count = None
    if pci and not pci.get("error") and pci.get("gpus"):
        gpu_count = len(pci["gpus"])
    return ExpectedState(
        driver_branch=plan.driver.branch if plan.driver is not None else None,
        persistence=plan.persistence.mode if plan.persistence is not None else None,
        power_limits_w=power,
        mig=mig,
        nccl=dict(plan.nccl.settings) if plan.nccl is not None else None,
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

__all__ = ["FABRICMANAGER", "PERSISTENCED", "expected_state"]
