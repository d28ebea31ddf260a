"""Preflight: the checks that need facts, for every host, before any host is changed (DESIGN.md §3).

:func:`preflight` is a pure function of a host's validated :class:`~gpufleet.config.NodeConfig` and its parsed
facts (:class:`HostFacts`); :func:`gather_facts` reads those facts from a pyinfra host (one command per fact).
It checks:

* power limits: the resolved limit of each GPU within that GPU's min/max (NVML's when the driver answers,
  the catalog's otherwise);
* MIG layout: the profile exists for the GPU model, per-profile instance counts, total memory/compute slices,
  that a placement exists, that listed device indices exist, that one GPU is not selected twice; MIG requested
  on a GPU without MIG;
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

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.catalog import GpuModel, UnknownMigProfile
from gpufleet.config import (
    MigDeviceConfig,
    NodeConfig,
    did_you_mean,
    gpu_default_power,
    gpu_model,
    power_limit_for,
)
from gpufleet.facts.nvidia import GpuInventory
from gpufleet.facts.packages import NvidiaPackages
from gpufleet.facts.pci import NvidiaPciDevices
from gpufleet.facts.system import OsInfo, SecureBoot

OPEN_ONLY_ARCHITECTURES = ("Blackwell",)
PRE_TURING_ARCHITECTURES = ("Kepler", "Maxwell", "Pascal", "Volta")
# OS (ID, VERSION_ID major) the driver stage supports
SUPPORTED_OS = {
    "ubuntu": ("22.04", "24.04"),
    "debian": ("12",),
    "rhel": ("9",),
    "rocky": ("9",),
    "almalinux": ("9",),
}
SUPPORTED_OS_TEXT = "Ubuntu 22.04 / 24.04, Debian 12, RHEL / Rocky / AlmaLinux 9"


# ----------------------------------------------------------------------------------------------- results


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value) if not isinstance(value, _Shown) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Shown(str):
    """A value already formatted for a message (e.g. ``800 W``): shown without quotes."""


@dataclass(frozen=True)
class PreflightError:
    """A setting that cannot be applied to this host: host, key, value, what is allowed, why, which GPUs."""

    host: str
    key: str
    value: Any
    allowed: str
    reason: str
    gpus: str | None = None  # e.g. "GPU 0 (NVIDIA H100 80GB HBM3)" / "GPUs 0-7 (NVIDIA H100 80GB HBM3)"

    @property
    def message(self) -> str:
        where = f" on {self.gpus}" if self.gpus else ""
        return f"{self.host}: {self.key}={_show(self.value)}{where}: {self.reason}; allowed: {self.allowed}"

    def __str__(self) -> str:
        return self.message


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


@dataclass(frozen=True)
class HostGpu:
    """One GPU as preflight sees it: from nvidia-smi when the driver answers, else from its PCI device."""

    index: int
    source: str  # "nvidia-smi" | "pci"
    model: GpuModel | None
    name: str | None = None
    uuid: str | None = None
    pci_device_id: str | None = None
    address: str | None = None
    power_min_w: float | None = None
    power_max_w: float | None = None
    power_default_w: float | None = None
    clocks_max_sm_mhz: int | None = None

    @property
    def display_name(self) -> str:
        if self.name:
            return self.name
        if self.model is not None:
            return self.model.name
        return f"unknown NVIDIA GPU {self.pci_device_id or ''}".strip()

    def as_dict(self) -> dict:
        return {"uuid": self.uuid, "name": self.name, "pci_device_id": self.pci_device_id,
                "power_default_w": self.power_default_w}


def host_gpus(facts: HostFacts) -> list[HostGpu]:
    """The host's GPUs: nvidia-smi's list when it answered, else the NVIDIA PCI display devices."""
    inventory = facts.gpu_inventory or {}
    listed = inventory.get("gpus") or []
    if listed:
        out = []
        for gpu in listed:
            out.append(HostGpu(
                index=gpu.get("index", len(out)),
                source="nvidia-smi",
                model=gpu_model(gpu),
                name=gpu.get("name"),
                uuid=gpu.get("uuid"),
                pci_device_id=gpu.get("pci_device_id"),
                address=gpu.get("pci_bus_id"),
                power_min_w=gpu.get("power_min_w"),
                power_max_w=gpu.get("power_max_w"),
                power_default_w=gpu.get("power_default_w"),
                clocks_max_sm_mhz=gpu.get("clocks_max_sm_mhz"),
            ))
        return out
    out = []
    for i, dev in enumerate((facts.pci or {}).get("gpus") or []):
        out.append(HostGpu(index=i, source="pci", model=gpu_model({"pci_device_id": dev.get("pci_device_id")}),
                           pci_device_id=dev.get("pci_device_id"), address=dev.get("address")))
    return out


def _gpu_label(gpus: list[HostGpu]) -> str:
    indices = sorted(g.index for g in gpus)
    names = sorted({g.display_name for g in gpus})
    if len(indices) == 1:
        which = f"GPU {indices[0]}"
    elif indices == list(range(indices[0], indices[-1] + 1)):
        which = f"GPUs {indices[0]}-{indices[-1]}"
    else:
        which = "GPUs " + ", ".join(map(str, indices))
    return f"{which} ({', '.join(names)})"


# ------------------------------------------------------------------------------------------------ checks


def _fmt_w(watts: float) -> str:
    return f"{watts:g} W"


def _check_power(host: str, config: NodeConfig, gpus: list[HostGpu], result: PreflightResult) -> None:
    if not config.power.managed:
        return
    if config.power.by_uuid and gpus and gpus[0].source == "pci":
        result.notes.append("gpufleet_power_limit_by_uuid: GPU UUIDs are unknown until the driver answers; "
                            "per-UUID limits are checked on the run after the driver is installed")
    grouped: dict[tuple, list[HostGpu]] = {}
    for gpu in gpus:
        found = power_limit_for(config, gpu.as_dict())
        if found is None:
            continue
        key, limit = found
        default = gpu_default_power(gpu.as_dict())
        model = gpu.model
        low = gpu.power_min_w if gpu.power_min_w is not None else (model.power_min_w if model else None)
        high = gpu.power_max_w if gpu.power_max_w is not None else (model.power_max_w if model else None)
        watts = limit.resolve(default)
        grouped.setdefault((key, str(limit), watts, low, high, gpu.display_name), []).append(gpu)
    for (key, shown, watts, low, high, _name), members in grouped.items():
        label = _gpu_label(members)
        if watts is None:
            result.errors.append(PreflightError(
                host, key, _Shown(shown), "a limit in watts (this GPU's default power limit is unknown)",
                "cannot resolve a relative power limit", label))
            continue
        if low is None and high is None:
            result.notes.append(f"{key}: power limit range of {label} unknown; range check skipped")
            continue
        if (low is not None and watts < low) or (high is not None and watts > high):
            if low is not None and high is not None:
                allowed = f"{low:g}-{high:g} W"
            else:
                allowed = f"at least {low:g} W" if low is not None else f"at most {high:g} W"
            resolved = "" if shown == _fmt_w(watts) else f" ({shown} of the default limit is {_fmt_w(watts)})"
            result.errors.append(PreflightError(
                host, key, _Shown(shown), allowed, f"outside this GPU's power limit range{resolved}", label))


def _placement_fits(profiles: list, memory_slices: int) -> bool:
    """Whether GPU instances of these profiles can all be placed without overlapping (profile placements)."""
    items = sorted(profiles, key=lambda p: (-p.memory_slices, p.name))
    if any(not p.placements for p in items):
        return True  # placements never captured for this profile: the slice totals are all we can check

    @functools.cache
    def place(i: int, mask: int) -> bool:
        if i == len(items):
            return True
        for start, size in items[i].placements:
            bits = ((1 << size) - 1) << start
            if start + size <= memory_slices and not mask & bits and place(i + 1, mask | bits):
                return True
        return False

    return place(0, 0)


def _check_mig_layout(host: str, key: str, spec: MigDeviceConfig, model: GpuModel, label: str,
                      result: PreflightResult) -> None:
    mig = model.mig
    assert mig is not None
    instances = []
    ok = True
    for profile_name, count in spec.mig_devices.items():
        sub = f"{key}.mig-devices[{profile_name!r}]"
        try:
            profile = mig.profile(profile_name)
        except UnknownMigProfile:
            result.errors.append(PreflightError(
                host, sub, profile_name,
                f"a MIG profile of {model.name}: " + ", ".join(mig.profile_names)
                + did_you_mean(profile_name, mig.profile_names), "unknown MIG profile for this GPU model", label))
            ok = False
            continue
        if count > profile.max_instances:
            result.errors.append(PreflightError(
                host, sub, count, f"at most {profile.max_instances} instance(s) of {profile.name} on {model.name}",
                "too many instances", label))
            ok = False
        instances += [profile] * count
    if not ok:
        return
    memory = sum(p.memory_slices for p in instances)
    compute = sum(p.compute_slices for p in instances)
    layout = dict(spec.mig_devices)
    if memory > mig.memory_slices or compute > mig.compute_slices:
        result.errors.append(PreflightError(
            host, f"{key}.mig-devices", layout,
            f"at most {mig.memory_slices} memory slices and {mig.compute_slices} compute slices in total on "
            f"{model.name}", f"the instances need {memory} memory slices and {compute} compute slices", label))
        return
    if not _placement_fits(instances, mig.memory_slices):
        result.errors.append(PreflightError(
            host, f"{key}.mig-devices", layout,
            f"instances whose placements can be combined on {model.name} (see nvidia-smi mig -lgipp)",
            "no placement of these GPU instances fits together", label))


def _check_mig(host: str, config: NodeConfig, gpus: list[HostGpu], result: PreflightResult, lost: int = 0) -> None:
    mig_config = config.mig
    if mig_config is None:
        return
    base = mig_config.key if mig_config.label is None else f"{mig_config.key}[{mig_config.label!r}]"
    if not gpus:
        result.notes.append(f"{base}: no NVIDIA GPU detected; MIG layout checks skipped")
        return
    count = len(gpus)
    known = {g.index for g in gpus}
    for i, entry in enumerate(mig_config.entries):
        if entry.devices == "all":
            continue
        if lost:
            result.notes.append(f"{base}[{i}].devices: {lost} GPU(s) lost; device indices not checked")
            continue
        missing = [d for d in entry.devices if d not in known]
        if missing:
            result.errors.append(PreflightError(
                host, f"{base}[{i}].devices", list(entry.devices),
                "GPU index 0 (this host has 1 GPU)" if count == 1 else f"GPU indices 0-{count - 1} (this host has "
                f"{count} GPUs)",
                f"device index {', '.join(map(str, missing))} does not exist on this host"))
    # group GPUs by (entry, model) so 8 identical GPUs give one message
    by_entry: dict[tuple[int, str], list[HostGpu]] = {}
    for gpu in gpus:
        matches = mig_config.matching_entries(gpu.index, gpu.pci_device_id)
        if len(matches) > 1:
            result.errors.append(PreflightError(
                host, base, _Shown(f"entries {', '.join(map(str, matches))}"),
                "each GPU selected by at most one entry (devices / device-filter)", "GPU selected twice",
                _gpu_label([gpu])))
            continue
        if not matches:
            continue
        entry = mig_config.entries[matches[0]]
        if not entry.mig_enabled:
            continue
        if gpu.model is None:
            result.notes.append(f"{base}[{matches[0]}]: model of {_gpu_label([gpu])} not in the catalog; "
                                "MIG layout not checked")
            continue
        by_entry.setdefault((matches[0], gpu.model.key), []).append(gpu)
    for (i, _model_key), members in by_entry.items():
        entry = mig_config.entries[i]
        model = members[0].model
        assert model is not None
        label = _gpu_label(members)
        if model.mig is None:
            result.errors.append(PreflightError(
                host, f"{base}[{i}].mig-enabled", True,
                f"false, or a devices / device-filter selection without this GPU ({model.name} has no MIG)",
                "MIG requested on a GPU without MIG", label))
            continue
        _check_mig_layout(host, f"{base}[{i}]", entry, model, label, result)


def required_kernel_flavour(models: Iterable[GpuModel | None]) -> str | None:
    """``open`` when a GPU needs the open kernel modules (Blackwell, Grace), ``proprietary`` when one needs the
    proprietary ones (pre-Turing), None when either works (or nothing is known)."""
    need = None
    for model in models:
        if model is None:
            continue
        if model.architecture.startswith(OPEN_ONLY_ARCHITECTURES) or "Grace" in model.architecture \
                or any(tag in model.name for tag in ("GH200", "GB200", "GB300")):
            need = "open"
        elif model.architecture in PRE_TURING_ARCHITECTURES and need is None:
            need = "proprietary"
    return need


def choose_kernel_flavour(requested: str, models: Iterable[GpuModel | None]) -> str:
    """The kernel module flavour to install: ``requested`` unless ``auto``; ``auto`` is ``open`` (NVIDIA's
    recommendation for Turing and newer, required on Blackwell/Grace) unless a GPU is pre-Turing."""
    if requested != "auto":
        return requested
    return "proprietary" if required_kernel_flavour(models) == "proprietary" else "open"


def dkms_needed(config: NodeConfig, os_fact: Mapping) -> bool:
    """Whether the driver's kernel modules are built on the host by DKMS (so unsigned under Secure Boot).

    Ubuntu-style packages on Ubuntu come with Canonical-signed precompiled modules
    (``linux-modules-nvidia-*``); NVIDIA's repository packages (Debian, RHEL, or ``packages_style: nvidia``)
    build with DKMS.
    """
    style = config.driver.packages_style
    if style is None:
        style = "ubuntu" if os_fact.get("id") == "ubuntu" else "nvidia"
    return not (style == "ubuntu" and os_fact.get("id") == "ubuntu")


def _check_driver(host: str, config: NodeConfig, facts: HostFacts, gpus: list[HostGpu],
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
            "proprietary kernel modules requested", _gpu_label(needing)))
    if requested == "open":
        old = [g for g in gpus if g.model is not None and g.model.architecture in PRE_TURING_ARCHITECTURES]
        if old:
            result.errors.append(PreflightError(
                host, "gpufleet_driver_flavour", requested,
                "proprietary or auto (the open kernel modules support Turing and newer GPUs only)",
                "open kernel modules requested", _gpu_label(old)))

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
    driver_ok = inventory.get("status") == "ok" and loaded.split(".")[0] == config.driver.branch
    if sb == "enabled" and dkms_needed(config, os_fact) and not config.driver.secure_boot_signing and not driver_ok:
        result.errors.append(PreflightError(
            host, "gpufleet_driver_secure_boot_signing", False,
            "true once a Machine Owner Key is enrolled (mokutil --import) and DKMS signs modules with it, or "
            "gpufleet_driver_packages_style: ubuntu on Ubuntu (Canonical-signed precompiled modules)",
            "Secure Boot is enabled and the NVIDIA kernel modules would be built by DKMS, unsigned: they would "
            "not load"))
    elif sb == "unknown":
        result.notes.append("Secure Boot state unknown (no mokutil, no EFI variables); DKMS signing not checked")


def _check_clocks(host: str, config: NodeConfig, gpus: list[HostGpu], result: PreflightResult) -> None:
    if config.clocks.mode != "lock" or config.clocks.lock_gpu_mhz is None:
        return
    low = config.clocks.lock_gpu_mhz[0]
    grouped: dict[int, list[HostGpu]] = {}
    for gpu in gpus:
        top = gpu.clocks_max_sm_mhz or (gpu.model.clocks_max_sm_mhz if gpu.model else None)
        if top is not None and low > top:
            grouped.setdefault(top, []).append(gpu)
    for top, members in grouped.items():
        result.errors.append(PreflightError(
            host, "gpufleet_clocks.lock_gpu_mhz", list(config.clocks.lock_gpu_mhz),
            f"a minimum at most {top} MHz (this GPU's max SM clock)", "locked clock range above the GPU's maximum",
            _gpu_label(members)))


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
    if config.stage_enabled("power"):
        _check_power(host_name, config, gpus, result)
    if config.stage_enabled("mig"):
        _check_mig(host_name, config, gpus, result, lost=len(inventory.get("lost_gpus") or []))
    if config.stage_enabled("clocks"):
        _check_clocks(host_name, config, gpus, result)
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
