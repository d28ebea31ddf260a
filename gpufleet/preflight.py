"""Preflight: the checks that need facts, for every host, before any host is changed (DESIGN.md §3).

:func:`preflight` is a pure function of a host's validated :class:`~gpufleet.config.NodeConfig` and its parsed
facts (:class:`HostFacts`); :func:`gather_facts` reads those facts from a pyinfra host (one command per fact).
It checks:

* power limits, MIG layout and clocks: :meth:`gpufleet.plan.NodePlan.problems` (the node plan the operations and
  verify use): each GPU's resolved limit within its min/max (NVML's when the driver answers, the catalog's
  otherwise), per-UUID limits naming a GPU of the host; MIG profiles, instance counts, slices and placements,
  device indices, a GPU selected twice, MIG on a GPU without MIG; a clock lock above the GPU's max SM clock;
* driver: open kernel modules required (Blackwell, Grace) but ``proprietary`` requested (and ``open`` on
  pre-Turing GPUs); DKMS-built modules with Secure Boot on and no signing set up; an OS the driver stage does not
  support.

Without a driver the GPUs are known from their PCI device ids (``catalog.by_pci_device_id``), in PCI address
order (nvidia-smi's index order). Where a check cannot run (model unknown, range unknown) it is skipped and a
note says so (:func:`run_preflight`). Every error names host, key, value and what is allowed::

    node01: gpufleet_power_limit=800 W on GPU 0 (NVIDIA H100 80GB HBM3): outside this GPU's power limit range;
    allowed: 200-700 W
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpufleet.config import NodeConfig
from gpufleet.facts.nvidia import GpuInventory
from gpufleet.facts.packages import NvidiaPackages
from gpufleet.facts.pci import NvidiaPciDevices
from gpufleet.facts.system import OsInfo, SecureBoot
from gpufleet.plan import (
    PRE_TURING_ARCHITECTURES,
    DriverPlan,
    Gpu,
    NodePlan,
    Problem,
    driver_on_branch,
    gpu_label,
    gpus_from_facts,
    required_kernel_flavour,
)
from gpufleet.plan import choose_kernel_flavour as choose_kernel_flavour  # the plan's decision, re-exported

# OS (ID, VERSION_ID major) the driver stage supports
SUPPORTED_OS = {
    "ubuntu": ("22.04", "24.04"),
    "debian": ("12", "13"),
    "rhel": ("9",),
    "rocky": ("9",),
    "almalinux": ("9",),
}
SUPPORTED_OS_TEXT = "Ubuntu 22.04 / 24.04, Debian 12 / 13, RHEL / Rocky / AlmaLinux 9"


# ----------------------------------------------------------------------------------------------- results


# A preflight error is a plan problem: host, key, value, what is allowed, why, which GPUs.
PreflightError = Problem


class PreflightFailed(RuntimeError):
    """Raised by :func:`check_inventory` with every preflight error of every host."""

    def __init__(self, errors: Iterable[PreflightError]):
        self.errors = list(errors)
        hosts = sorted({e.host for e in self.errors})
        head = f"preflight failed: {len(self.errors)} error(s) on {len(hosts)} host(s) ({', '.join(hosts)}); " \
               "no host was changed:"
        self.message = "\n".join([head, *(f"  - {e.message}" for e in self.errors)])
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


@dataclass
class PreflightResult:
    errors: list[PreflightError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # checks skipped and why
    warnings: list[str] = field(default_factory=list)  # shown to the user; the run goes on


# ------------------------------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class HostFacts:
    """The parsed facts preflight reads (defaults: nothing known, as from a host without any NVIDIA software)."""

    os: Mapping = field(default_factory=OsInfo.default)
    pci: Mapping = field(default_factory=NvidiaPciDevices.default)
    secure_boot: Mapping = field(default_factory=SecureBoot.default)
    packages: Mapping = field(default_factory=NvidiaPackages.default)
    gpu_inventory: Mapping = field(default_factory=GpuInventory.default)


def gather_facts(host) -> HostFacts:
    """Read the facts preflight needs from a pyinfra host (5 commands, each cached by pyinfra)."""
    return HostFacts(
        os=host.get_fact(OsInfo),
        pci=host.get_fact(NvidiaPciDevices),
        secure_boot=host.get_fact(SecureBoot),
        packages=host.get_fact(NvidiaPackages),
        gpu_inventory=host.get_fact(GpuInventory),
    )


def host_gpus(facts: HostFacts) -> list[Gpu]:
    """The host's GPUs: nvidia-smi's list when it answered, else the NVIDIA PCI display devices."""
    return gpus_from_facts(facts.gpu_inventory, facts.pci)


# ------------------------------------------------------------------------------------------------ checks


def dkms_needed(config: NodeConfig, os_fact: Mapping) -> bool:
    """Whether the driver's kernel modules are built on the host by DKMS (so unsigned under Secure Boot): the
    driver plan's decision (:class:`gpufleet.plan.DriverPlan`)."""
    return DriverPlan.resolve(config, [], os_fact.get("id")).dkms


def _check_driver(host: str, config: NodeConfig, facts: HostFacts, gpus: list[Gpu],
                  result: PreflightResult) -> None:
    models = [g.model for g in gpus]
    requested = config.driver.flavour
    need = required_kernel_flavour(models)
    if need == "open" and requested == "proprietary":
        needing = [g for g in gpus if required_kernel_flavour([g.model]) == "open"]
        arch = needing[0].model.architecture if needing and needing[0].model else "this GPU"
        result.errors.append(PreflightError(
            host, "gpufleet_driver_flavour", requested,
            f"open or auto ({arch} GPUs work only with NVIDIA's open kernel modules)",
            "proprietary kernel modules requested", gpu_label(needing)))
    if requested == "open":
        old = [g for g in gpus if g.model is not None and g.model.architecture in PRE_TURING_ARCHITECTURES]
        if old:
            result.errors.append(PreflightError(
                host, "gpufleet_driver_flavour", requested,
                "proprietary or auto (the open kernel modules support Turing and newer GPUs only)",
                "open kernel modules requested", gpu_label(old)))

    os_fact = facts.os or {}
    os_id, version = os_fact.get("id"), os_fact.get("version_id") or ""
    if os_id is None:
        result.notes.append("OS not identified (/etc/os-release); OS support not checked")
    else:
        versions = SUPPORTED_OS.get(os_id)
        if versions is None or not any(version == v or version.startswith(v + ".") for v in versions):
            result.errors.append(PreflightError(
                host, "gpufleet_stages", list(config.stages),
                f"the driver stage on {SUPPORTED_OS_TEXT}, or gpufleet_stages without 'driver'",
                f"the driver stage does not support {os_fact.get('pretty_name') or os_id + ' ' + version}"))

    sb = (facts.secure_boot or {}).get("state", "unknown")
    inventory = facts.gpu_inventory or {}
    loaded = inventory.get("driver_version") or ""
    driver_ok = inventory.get("status") == "ok" and driver_on_branch(loaded, config.driver.branch)
    if sb == "enabled" and dkms_needed(config, os_fact) and not config.driver.secure_boot_signing and not driver_ok:
        result.errors.append(PreflightError(
            host, "gpufleet_driver_secure_boot_signing", False,
            "true once a Machine Owner Key is enrolled (mokutil --import) and DKMS signs modules with it, or "
            "gpufleet_driver_packages_style: ubuntu on Ubuntu (Canonical-signed precompiled modules)",
            "Secure Boot is enabled and the NVIDIA kernel modules would be built by DKMS, unsigned: they would "
            "not load"))
    elif sb == "unknown":
        result.notes.append("Secure Boot state unknown (no mokutil, no EFI variables); DKMS signing not checked")


# ----------------------------------------------------------------------------------------------- entry points


def run_preflight(host_name: str, config: NodeConfig, facts: HostFacts) -> PreflightResult:
    """All fact-dependent checks of one host: errors, plus notes on checks that could not run."""
    result = PreflightResult()
    gpus = host_gpus(facts)
    inventory = facts.gpu_inventory or {}
    if not gpus:
        result.notes.append("no NVIDIA GPU detected (nvidia-smi: "
                            f"{inventory.get('status', 'absent')}, PCI: none); GPU checks skipped")
    elif gpus[0].source == "pci":
        result.notes.append(f"driver not answering (nvidia-smi: {inventory.get('status')}); GPUs identified from "
                            "PCI device ids")
    for lost in inventory.get("lost_gpus") or []:
        result.notes.append(f"GPU at {lost} is lost (fallen off the bus); it is not checked")
    if config.stage_enabled("driver"):
        _check_driver(host_name, config, facts, gpus, result)
    problems = NodePlan.resolve(config, gpus).problems(lost=inventory.get("lost_gpus") or [])
    result.errors += problems.errors
    result.notes += problems.notes
    result.warnings += problems.warnings
    return result


def preflight(host_name: str, config: NodeConfig, facts: HostFacts) -> list[PreflightError]:
    """The preflight errors of one host (empty: nothing stops the run)."""
    return run_preflight(host_name, config, facts).errors


def check_inventory(items: Iterable[tuple[str, NodeConfig, HostFacts]]) -> dict[str, PreflightResult]:
    """Preflight every host; raise ONE :class:`PreflightFailed` with all errors of all hosts."""
    results = {name: run_preflight(name, config, facts) for name, config, facts in items}
    errors = [e for result in results.values() for e in result.errors]
    if errors:
        raise PreflightFailed(errors)
    return results
