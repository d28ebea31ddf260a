"""MIG: which layout entry selects a GPU, whether a layout fits it, the creation order, whether it is applied (the
shared comparison of ``gpufleet/node/mig_compare.py``), what the MIG operation does (:func:`mig_diff`) and the boot
file."""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufleet.catalog import GpuModel, MigProfile, UnknownMigProfile
from gpufleet.config import (
    MigConfig,
    MigDeviceConfig,
    did_you_mean,
)
from gpufleet.node import mig_compare
from gpufleet.node.mig_compare import norm_bus

from .files import MIG_APPLIER, MIG_UNIT
from .gpu import Gpu, gpu_label
from .problems import Problem, Problems, Shown, missing_gpu_warning

_MODES = {True: "Enabled", False: "Disabled"}

@dataclass(frozen=True)
class MigIssue:
    """Why a layout does not fit a GPU model: ``kind`` is unknown_profile | too_many | slices | placement."""

    kind: str
    profile: str | None = None
    count: int | None = None
    allowed: str = ""
    reason: str = ""


def _placement_fits(profiles: list[MigProfile], memory_slices: int) -> bool:
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


def mig_fit(model: GpuModel, counts: Mapping[str, int]) -> tuple[list[MigProfile], list[MigIssue]]:
    """The GPU instances of ``counts`` ({profile: count}) on ``model`` in creation order, and why they do not fit
    (unknown profile, too many of one profile, too many slices, no placement): the one "does it fit" decision."""
    mig = model.mig
    assert mig is not None
    issues: list[MigIssue] = []
    instances: list[MigProfile] = []
    totals: Counter[str] = Counter()
    for name, count in counts.items():
        try:
            profile = mig.profile(name)
        except UnknownMigProfile:
            issues.append(MigIssue("unknown_profile", name, count,
                                   f"a MIG profile of {model.name}: " + ", ".join(mig.profile_names)
                                   + did_you_mean(name, mig.profile_names), "unknown MIG profile for this GPU model"))
            continue
        totals[profile.name] += count
        instances += [profile] * count
    for name, count in totals.items():
        profile = mig.profile(name)
        if count > profile.max_instances:
            issues.append(MigIssue("too_many", name, count,
                                   f"at most {profile.max_instances} instance(s) of {profile.name} on {model.name}",
                                   "too many instances"))
    if issues:
        return creation_order(instances), issues
    memory = sum(p.memory_slices for p in instances)
    compute = sum(p.compute_slices for p in instances)
    if memory > mig.memory_slices or compute > mig.compute_slices:
        issues.append(MigIssue(
            "slices", allowed=f"at most {mig.memory_slices} memory slices and {mig.compute_slices} compute slices "
            f"in total on {model.name}", reason=f"the instances need {memory} memory slices and {compute} compute "
            "slices"))
    elif not _placement_fits(instances, mig.memory_slices):
        issues.append(MigIssue("placement", allowed=f"instances whose placements can be combined on {model.name} "
                               "(see nvidia-smi mig -lgipp)", reason="no placement of these GPU instances fits "
                               "together"))
    return creation_order(instances), issues


def creation_order(profiles: Iterable[MigProfile]) -> list[MigProfile]:
    """Largest placements first, so that the driver's first-fit placement leaves room for the small ones."""
    return sorted(profiles, key=lambda p: (-p.memory_slices, -p.compute_slices, p.id))


def mig_mode_ok(enabled: bool, gpu: Gpu | None) -> bool:
    """Whether ``gpu`` is in the wanted MIG mode, now and after a reset (a GPU without MIG is "disabled"): the
    shared comparison's answer (:func:`gpufleet.node.mig_compare.mode_differences`)."""
    if gpu is None:
        return not mig_compare.mode_differences(enabled, present=False)
    return not mig_compare.mode_differences(enabled, True, gpu.mig_current, gpu.mig_pending)


def mig_instances_ok(profile_ids: Iterable[int], existing: Iterable[tuple[int, bool]]) -> bool:
    """Whether the GPU instances ``existing`` ((profile id, holds exactly one full compute instance) each) are
    exactly ``profile_ids``, compared as a multiset of profile ids (:mod:`gpufleet.node.mig_compare`)."""
    return not mig_compare.instance_differences(list(profile_ids), existing)


def mig_differences(enabled: bool, profile_ids: Iterable[int], gpu: Gpu | None,
                    instances: Iterable[tuple[int, bool]] = ()) -> list[str]:
    """Everything not as the layout says on one GPU ([] = applied): the comparison the operation, the node-side
    applier, the exporter and verify share (:func:`gpufleet.node.mig_compare.differences`)."""
    if gpu is None:
        return mig_compare.differences(enabled, list(profile_ids), present=False)
    return mig_compare.differences(enabled, list(profile_ids), True, gpu.mig_current, gpu.mig_pending,
                                   list(instances))


@dataclass(frozen=True)
class MigTarget:
    """What one GPU of the layout should be."""

    gpu: Gpu
    enabled: bool
    profiles: tuple[MigProfile, ...] = ()  # creation order

    @property
    def counts(self) -> dict[str, int]:
        return dict(Counter(p.name for p in self.profiles))

    @property
    def profile_ids(self) -> list[int]:
        return [p.id for p in self.profiles]


@dataclass(frozen=True)
class MigPlan:
    """The layout of every GPU a ``gpufleet_mig`` entry selects: ``{index: {profile: count} | None}``."""

    config: MigConfig
    layout: Mapping[int, Mapping[str, int] | None]

    @classmethod
    def resolve(cls, config: MigConfig, gpus: Iterable[Gpu]) -> MigPlan:
        layout: dict[int, dict[str, int] | None] = {}
        for gpu in gpus:
            entry = config.layout_for(gpu.index, gpu.pci_device_id)
            if entry is not None:
                layout[gpu.index] = dict(entry.mig_devices) if entry.mig_enabled else None
        return cls(config, layout)

    def problems(self, host: str, gpus: list[Gpu], lost: int = 0) -> Problems:
        out = Problems()
        mig_config = self.config
        base = mig_config.key if mig_config.label is None else f"{mig_config.key}[{mig_config.label!r}]"
        if not gpus:
            out.notes.append(f"{base}: no NVIDIA GPU detected; MIG layout checks skipped")
            return out
        count = len(gpus)
        known = {g.index for g in gpus}
        for i, entry in enumerate(mig_config.entries):
            if entry.devices == "all":
                continue
            if lost:
                out.notes.append(f"{base}[{i}].devices: {lost} GPU(s) lost; device indices not checked")
                continue
            missing = [d for d in entry.devices if d not in known]
            if missing:
                out.errors.append(Problem(
                    host, f"{base}[{i}].devices", list(entry.devices),
                    "GPU index 0 (this host has 1 GPU)" if count == 1 else f"GPU indices 0-{count - 1} (this host "
                    f"has {count} GPUs)", f"device index {', '.join(map(str, missing))} does not exist on this host"))
        by_entry: dict[tuple[int, str], list[Gpu]] = {}  # 8 identical GPUs give one message
        without_mig: dict[int, list[Gpu]] = {}  # uncatalogued GPUs whose live MIG mode is N/A
        unknown: dict[int, list[Gpu]] = {}  # uncatalogued GPUs that may have MIG: their profiles are unknown
        for gpu in gpus:
            matches = mig_config.matching_entries(gpu.index, gpu.pci_device_id)
            if len(matches) > 1:
                out.errors.append(Problem(
                    host, base, Shown(f"entries {', '.join(map(str, matches))}"),
                    "each GPU selected by at most one entry (devices / device-filter)", "GPU selected twice",
                    gpu_label([gpu])))
                continue
            if not matches or not mig_config.entries[matches[0]].mig_enabled:
                continue
            if gpu.model is None and mig_capable(gpu) is False:
                without_mig.setdefault(matches[0], []).append(gpu)
                continue
            if gpu.model is None:
                unknown.setdefault(matches[0], []).append(gpu)
                continue
            by_entry.setdefault((matches[0], gpu.model.key), []).append(gpu)
        for i, members in without_mig.items():
            out.errors.append(Problem(
                host, f"{base}[{i}].mig-enabled", True,
                "false, or a devices / device-filter selection without this GPU (nvidia-smi reports its MIG mode "
                "as N/A: it has no MIG)", "MIG requested on a GPU without MIG", gpu_label(members)))
        for i, members in unknown.items():
            out.errors.append(Problem(
                host, f"{base}[{i}].mig-devices", dict(mig_config.entries[i].mig_devices),
                "a layout checked against the GPU's MIG profiles: add its model to the catalog (gpufleet catalog "
                "learn, with MIG on; or gpufleet_catalog_dir)", "MIG profiles of a GPU not in the catalog are unknown",
                gpu_label(members)))
        for (i, _model_key), members in by_entry.items():
            entry = mig_config.entries[i]
            model = members[0].model
            assert model is not None
            label = gpu_label(members)
            if model.mig is None:
                out.errors.append(Problem(
                    host, f"{base}[{i}].mig-enabled", True,
                    f"false, or a devices / device-filter selection without this GPU ({model.name} has no MIG)",
                    "MIG requested on a GPU without MIG", label))
                continue
            out.errors += _entry_problems(host, f"{base}[{i}]", entry, model, label)
        return out


def _entry_problems(host: str, key: str, entry: MigDeviceConfig, model: GpuModel, label: str) -> list[Problem]:
    _profiles, issues = mig_fit(model, entry.mig_devices)
    out = []
    for issue in issues:
        if issue.kind == "unknown_profile":
            out.append(Problem(host, f"{key}.mig-devices[{issue.profile!r}]", issue.profile, issue.allowed,
                               issue.reason, label))
        elif issue.kind == "too_many":
            out.append(Problem(host, f"{key}.mig-devices[{issue.profile!r}]", issue.count, issue.allowed,
                               issue.reason, label))
        else:
            out.append(Problem(host, f"{key}.mig-devices", dict(entry.mig_devices), issue.allowed, issue.reason,
                               label))
    return out


def mig_capable(gpu: Gpu) -> bool | None:
    """Whether a GPU has MIG by the driver's live ``mig.mode.current`` (``N/A``: no MIG); None without a driver."""
    if gpu.source == "pci":
        return None
    return gpu.mig_current is not None


def mig_target(gpu: Gpu, want: Mapping[str, int] | None) -> tuple[MigTarget | None, str | None]:
    """The target of one GPU for a layout entry (``None``: MIG disabled), or why this GPU cannot take it."""
    if want is None:
        return MigTarget(gpu, False), None
    if mig_capable(gpu) is not True or (gpu.model is not None and gpu.model.mig is None):
        return None, (f"{gpu.label} does not support MIG (mig.mode.current is "
                      f"{_MODES.get(gpu.mig_current) or 'N/A'})")
    if gpu.model is None:
        return None, f"{gpu.label} is not in gpufleet's GPU catalog: its MIG profiles are unknown"
    profiles, issues = mig_fit(gpu.model, want)
    if issues:
        issue = issues[0]
        if issue.kind == "unknown_profile":
            return None, (f"{gpu.label} offers no MIG profile {issue.profile!r}; its profiles: "
                          f"{', '.join(gpu.model.mig.profile_names)}")
        if issue.kind == "too_many":
            return None, f"{gpu.label}: {issue.count} x {issue.profile} asked for, {issue.allowed}"
        return None, f"{gpu.label}: {dict(want)}: {issue.reason}; allowed: {issue.allowed}"
    return MigTarget(gpu, True, tuple(profiles)), None


def kept_mig_entries(previous: str | None, lost: Iterable[str]) -> list[dict]:
    """The entries of the layout file written before (``previous``, its text) for GPUs that are lost now: their
    desired layout is kept, for the boot unit to apply when they are back."""
    lost_buses = {norm_bus(b) for b in lost}
    if not previous or not lost_buses:
        return []
    try:
        entries = json.loads(previous).get("gpus") or []
    except (ValueError, AttributeError):
        return []
    return [e for e in entries if isinstance(e, dict) and norm_bus(e.get("pci_bus_id")) in lost_buses]


def mig_layout_doc(targets: Iterable[MigTarget], holders: Iterable[str], kept: Iterable[dict] = ()) -> dict:
    """The content of ``/etc/gpufleet/mig-layout.json`` (read at boot by ``gpufleet-mig-apply apply``); GPUs are
    keyed by PCI bus id, as a layout belongs to a GPU position. ``kept``: entries of lost GPUs, kept as they were."""
    return {
        "version": 1,
        "comment": "Managed by gpufleet (MIG stage), overwritten on every run. Applied at boot by "
                   f"{MIG_UNIT} ({MIG_APPLIER} apply). GPUs are found by PCI bus id; index and name are informative.",
        "holder_services": list(holders),
        "gpus": [
            {
                "pci_bus_id": t.gpu.pci_bus_id,
                "index": t.gpu.index,
                "name": t.gpu.name,
                "mig_enabled": t.enabled,
                "instances": t.counts,
                "create": t.profile_ids,
            }
            for t in targets
            if t.gpu.mig_current is not None  # GPUs without MIG have nothing to apply at boot
        ] + list(kept),
    }


@dataclass(frozen=True)
class MigDiff:
    """What the MIG operation has to do on one host, decided here once (:func:`mig_diff`): each GPU's target (or why
    the host cannot take the layout), the entries of lost GPUs kept for boot, the layout file, and, against what the
    GPUs say at each step, the GPUs whose mode and whose instances are not the layout's."""

    targets: tuple[MigTarget, ...] = ()
    problem: str | None = None  # a host-state problem: nothing may change on this host
    kept: tuple[dict, ...] = ()  # layout-file entries of lost GPUs, kept for the boot unit
    warning: str | None = None  # said when entries are kept

    def layout_doc(self, holders: Iterable[str]) -> dict:
        """The layout file's content (:func:`mig_layout_doc`)."""
        return mig_layout_doc(self.targets, holders, self.kept)

    def mode_changes(self, gpus: Mapping[int, Gpu]) -> list[MigTarget]:
        """The targets whose GPU (in ``gpus``, what nvidia-smi lists now) is not in the wanted mode."""
        return [t for t in self.targets if not mig_mode_ok(t.enabled, gpus.get(t.gpu.index))]

    def instance_changes(self, ready: Iterable[MigTarget], existing: Mapping[int, Iterable[tuple[int, bool]]]
                         ) -> list[MigTarget]:
        """The targets of ``ready`` (MIG on and in the wanted mode) whose GPU instances ``existing`` ({index:
        [(profile id, whole)]}) are not the layout's."""
        return [t for t in ready if not mig_instances_ok(t.profile_ids, existing.get(t.gpu.index, ()))]


def mig_diff(host: str, layout: Mapping[int, Mapping[str, int] | None], gpus: Mapping[int, Gpu],
             lost: Iterable[str] = (), previous: str | None = None) -> MigDiff:
    """The MIG operation's plan of one host: ``layout`` ({index: {profile: count} | None}) against the GPUs
    nvidia-smi lists (``gpus`` by index; ``lost``: bus ids of lost GPUs) and the layout file written before
    (``previous``, its text)."""
    lost = list(lost)
    targets = []
    for index, want in sorted(layout.items()):
        gpu = gpus.get(index)
        if gpu is None:
            also = f"; nvidia-smi reports lost GPU(s) {', '.join(lost)}" if lost else ""
            return MigDiff(problem=f"GPU {index} is not on {host} (its GPUs: "
                           f"{', '.join(str(i) for i in sorted(gpus))}{also})")
        target, problem = mig_target(gpu, want)
        if problem:
            return MigDiff(problem=f"{host}: {problem}")
        assert target is not None
        targets.append(target)
    planned = {norm_bus(t.gpu.pci_bus_id) for t in targets}
    # a lost GPU's entry is never pruned: the boot unit applies it when the GPU is back
    kept = tuple(e for e in kept_mig_entries(previous, lost) if norm_bus(e.get("pci_bus_id")) not in planned)
    warning = missing_gpu_warning(host, [str(e.get("pci_bus_id")) for e in kept], lost, "MIG layout") if kept else None
    return MigDiff(tuple(targets), None, kept, warning)
