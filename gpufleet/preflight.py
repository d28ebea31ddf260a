"""Preflight: the checks that need facts, for every host, before any host is changed (DESIGN.md §3).

:func:`preflight` is a pure function of a host's validated :class:`~gpufleet.config.NodeConfig` and its parsed
facts (:class:`HostFacts`); :func:`gather_facts` reads those facts from a pyinfra host (one command per fact).
It checks:

* power limits, MIG layout and clocks: :meth:`gpufleet.plan.NodePlan.problems` (the node plan the operations and
  verify use): each GPU's resolved limit within its min/max (NVML's when the driver answers, the catalog's
  otherwise), per-UUID limits naming a GPU of the host; MIG profiles, instance counts, slices and placements,
  device indices, a GPU selected twice, MIG on a GPU without MIG; a clock lock above the GPU's max SM clock;
* driver (by each GPU's architecture: catalog, ``compute_cap``, else the PCI ID database's chip code): open kernel
  modules required (Blackwell, Grace) but ``proprietary`` requested, ``open`` on pre-Turing GPUs, ``auto`` where the
  architecture is unknown, a branch newer than the last that supports the architecture;
  DKMS-built modules with Secure Boot on and no signing set up; an OS the driver stage does not support.

Without a driver the GPUs are known from their PCI device ids (``catalog.by_pci_device_id``), in PCI address
order (nvidia-smi's index order). Where a check cannot run (model unknown, range unknown) it is skipped and a
note says so (:func:`run_preflight`). Every error names host, key, value and what is allowed::

    node01: gpufleet_power_limit=800 W on GPU 0 (NVIDIA H100 80GB HBM3): outside this GPU's power limit range;
    allowed: 200-700 W
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpufleet.config import NodeConfig, listen_problem, tls_files
from gpufleet.facts.nvidia import GpuInventory
from gpufleet.facts.packages import NvidiaPackages
from gpufleet.facts.pci import PCI_IDS, NvidiaPciDevices
from gpufleet.facts.system import OsInfo, SecureBoot
from gpufleet.plan import (
    LAST_BRANCH,
    PRE_TURING_ARCHITECTURES,
    DriverPlan,
    Gpu,
    NodePlan,
    Problem,
    branch_supported,
    driver_on_branch,
    gpu_label,
    gpus_from_facts,
    kernel_flavour_of,
)
from gpufleet.plan import choose_kernel_flavour as choose_kernel_flavour  # the plan's decision, re-exported
from gpufleet.plan import required_kernel_flavour as required_kernel_flavour

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


def _flavour_refused(requested: str, gpus: list[Gpu]) -> tuple[list[Gpu], str, str]:
    """The GPUs that cannot take the requested kernel module flavour (by architecture), what is allowed and why."""
    if requested == "proprietary":
        refused = [g for g in gpus if kernel_flavour_of(g) == "open"]
        return refused, (f"open or auto ({refused[0].architecture if refused else ''} GPUs work only with NVIDIA's "
                         "open kernel modules)"), "proprietary kernel modules requested"
    if requested == "open":
        return ([g for g in gpus if g.architecture in PRE_TURING_ARCHITECTURES],
                "proprietary or auto (the open kernel modules support Turing and newer GPUs only)",
                "open kernel modules requested")
    return ([g for g in gpus if g.architecture is None],
            "open (Turing and newer) or proprietary (before Turing), as this GPU's architecture requires",
            "the GPU's architecture is unknown (no catalog model, no compute_cap from nvidia-smi, no chip code for its "
            f"device id in the PCI ID database {PCI_IDS})")


def _check_driver(host: str, config: NodeConfig, facts: HostFacts, gpus: list[Gpu],
                  result: PreflightResult) -> None:
    refused, allowed, reason = _flavour_refused(config.driver.flavour, gpus)
    if refused:
        result.errors.append(PreflightError(host, "gpufleet_driver_flavour", config.driver.flavour, allowed, reason,
                                            gpu_label(refused)))
    for architecture in sorted({g.architecture for g in gpus if not branch_supported(g.architecture,
                                                                                      config.driver.branch)}):
        last = LAST_BRANCH[architecture]
        result.errors.append(PreflightError(
            host, "gpufleet_driver_branch", config.driver.branch,
            f"{last} or an older branch (NVIDIA: the {last} series is the last to support {architecture} GPUs)",
            f"driver branch {config.driver.branch} does not support {architecture} GPUs",
            gpu_label(g for g in gpus if g.architecture == architecture)))

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


def _check_listen_addresses(host: str, config: NodeConfig, facts: HostFacts, result: PreflightResult) -> None:
    """The exporters' listen addresses are addresses of this host (else the exporter would not start)."""
    addresses = (facts.os or {}).get("addresses") or []
    exporters = config.exporters
    for key, listen, wanted in (("gpufleet_exporters_node_listen", exporters.node_listen, exporters.node),
                                ("gpufleet_exporters_gpu_listen", exporters.gpu_listen, exporters.gpu != "none")):
        reason = listen_problem(listen, addresses) if wanted else None
        if reason:
            result.errors.append(PreflightError(
                host, key, listen, "ADDRESS:PORT with an address of this host (" + ", ".join(addresses)
                + "), 0.0.0.0, [::] or 127.0.0.1 (unset, it is ssh_hostname's: set it where ssh reaches the host "
                "through another address, e.g. NAT)", reason))


def exporter_tls_files(config: NodeConfig) -> list[tuple[str, str, str]]:
    """(setting, key, path) of every certificate and key file the exporters' TLS settings name."""
    exporters = config.exporters
    if not config.stage_enabled("exporters"):
        return []
    out = []
    for setting, tls, wanted in (("gpufleet_exporters_node_tls_server_config", exporters.node_tls, exporters.node),
                                 ("gpufleet_exporters_gpu_tls_server_config", exporters.gpu_tls,
                                  exporters.gpu != "none")):
        if wanted:
            out += [(setting, key, path) for key, path in tls_files(dict(tls))]
    return out


def tls_file_problems(host: str, files: list[tuple[str, str, str]], state: Mapping) -> list[PreflightError]:
    """A TLS file a setting names that is not a regular file on the host (``state``: ManagedState's ``files``)."""
    return [PreflightError(host, f"{setting}.{key}", path, "a PEM file that exists on the host",
                           "no such file on the host" if state.get(path) is None else "not a regular file")
            for setting, key, path in files if (state.get(path) or {}).get("type") != "file"]


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
    if config.stage_enabled("exporters"):
        _check_listen_addresses(host_name, config, facts, result)
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
