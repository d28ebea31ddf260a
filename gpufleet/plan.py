"""The node plan: a host's configuration resolved against its GPUs and the catalog, ONCE (DESIGN.md §3).

    gpus = gpus_from_facts(gpu_inventory_fact, pci_fact)        # or gpus_from_probe(probe_doc)
    plan = NodePlan.resolve(config, gpus)
    plan.problems()          # what preflight reports (errors naming host, key, value, allowed; warnings; notes)
    plan.power.limits        # {GPU UUID: watts}: what the power operation applies and verify expects
    plan.power.diff(gpus)    # {GPU UUID: watts} to set;  plan.power.serialize(): /etc/gpufleet/power-limits.conf
    plan.mig.layout          # {GPU index: {profile: count} | None}: what the MIG operation applies / verify expects
    plan.clocks.lock_mhz     # (min, max) | None;  plan.clocks.diff(gpus, applied) / .serialize(uuids)

Each setting has ONE decision here, used by preflight, the operations, the boot files and verify:

* power: :func:`power_limit_for` (per-UUID > per-model > fleet-wide), :attr:`PowerTarget.watts` (``"80%"`` of
  this GPU's default limit), the range check :func:`outside_range` and the comparison :func:`power_differs`,
  both within :data:`POWER_TOLERANCE_W`; the boot file :func:`power_conf_text` (which carries the tolerance for
  the boot script);
* MIG: which entry selects a GPU (:meth:`MigPlan.resolve`), whether a layout fits the GPU (:func:`mig_fit`:
  profiles, instance counts, slices, placements), the creation order (:func:`creation_order`), whether a GPU is
  in the wanted mode (:func:`mig_mode_ok`) and holds the wanted instances (:func:`mig_instances_ok`, compared as
  a multiset of profile ids), and the boot file :func:`mig_layout_doc`;
* clocks: the lock range against the GPU's maximum SM clock, and the boot file :func:`clocks_conf_text`.

The operations take plain arguments (``limits={uuid: watts}``, ``layout={index: ...}``, ``lock_mhz``) so that
they can be called from any deploy or the pyinfra CLI; they build the same records from their facts
(:meth:`Gpu.from_fact`) and decide with the same functions. A desired value of a GPU that is lost now (fallen
off the bus) is kept in the boot files (:func:`missing_gpu_warning`, :func:`kept_mig_entries`).

Lower layer than operations and verify: imports config and catalog only (no pyinfra).
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.catalog import Catalog, GpuModel, MigProfile, UnknownGpuModel, UnknownMigProfile, load_catalog
from gpufleet.config import (
    _UUID_RE,
    MigConfig,
    MigDeviceConfig,
    NodeConfig,
    PowerLimit,
    _normalize_uuid,
    did_you_mean,
)
from gpufleet.node import mig_compare
from gpufleet.node.mig_compare import norm_bus

# nvidia-smi prints power limits with 2 decimals and NVML takes milliwatts: two limits closer than this are the
# same limit. Used by the power operation, preflight's range check, the boot script (through the file) and verify.
POWER_TOLERANCE_W = 0.005

SETTINGS_DIR = "/etc/gpufleet"
POWER_CONF = f"{SETTINGS_DIR}/power-limits.conf"
CLOCKS_CONF = f"{SETTINGS_DIR}/gpu-clocks.conf"
MIG_LAYOUT = f"{SETTINGS_DIR}/mig-layout.json"
POWER_UNIT = "gpufleet-power-limits.service"
CLOCKS_UNIT = "gpufleet-gpu-clocks.service"
MIG_UNIT = "gpufleet-mig.service"
MIG_APPLIER = "/usr/local/sbin/gpufleet-mig-apply"
# the shared MIG comparison (gpufleet/node/mig_compare.py), which the applier imports
MIG_COMPARE = "/usr/local/lib/gpufleet/mig_compare.py"
_MODES = {True: "Enabled", False: "Disabled"}


# ------------------------------------------------------------------------------------------------ the GPU


def catalog_model(name: Any = None, pci_device_id: Any = None, catalog: Catalog | None = None) -> GpuModel | None:
    """The catalog model of a GPU: by the name nvidia-smi prints (or a catalog key), else by PCI device id."""
    catalog = catalog or load_catalog()
    if isinstance(name, str):
        if name in catalog:
            return catalog.get(name)
        try:
            return catalog.by_name(name)
        except UnknownGpuModel:
            pass
    if pci_device_id:
        return catalog.by_pci_device_id(pci_device_id)
    return None


# nvidia-smi's ``Enabled``/``Disabled`` or the probe's booleans -> bool; None when not reported
_mode = mig_compare.mode_of


@dataclass(frozen=True)
class Gpu:
    """One GPU, whoever saw it: the ``GpuInventory`` fact (``source="nvidia-smi"``), the PCI bus without a driver
    (``"pci"``), or the verify probe (``"probe"``). ``None``: not reported."""

    index: int
    source: str
    model: GpuModel | None = None
    name: str | None = None
    uuid: str | None = None
    pci_device_id: str | None = None
    pci_bus_id: str | None = None
    status: str = "ok"  # the probe's per-GPU status (gpu_lost...); always "ok" from nvidia-smi
    power_limit_w: float | None = None
    power_default_w: float | None = None
    power_min_w: float | None = None
    power_max_w: float | None = None
    mig_current: bool | None = None  # None: no MIG on this GPU
    mig_pending: bool | None = None
    persistence: bool | None = None
    clocks_max_sm_mhz: int | None = None

    @classmethod
    def from_fact(cls, gpu: Mapping, catalog: Catalog | None = None) -> Gpu:
        """From one GPU dict of the ``GpuInventory`` fact."""
        return cls(
            index=gpu.get("index", 0), source="nvidia-smi",
            model=catalog_model(gpu.get("name"), gpu.get("pci_device_id"), catalog),
            name=gpu.get("name"), uuid=gpu.get("uuid"), pci_device_id=gpu.get("pci_device_id"),
            pci_bus_id=gpu.get("pci_bus_id"), power_limit_w=gpu.get("power_limit_w"),
            power_default_w=gpu.get("power_default_w"), power_min_w=gpu.get("power_min_w"),
            power_max_w=gpu.get("power_max_w"), mig_current=_mode(gpu.get("mig_current")),
            mig_pending=_mode(gpu.get("mig_pending")), persistence=_mode(gpu.get("persistence_mode")),
            clocks_max_sm_mhz=gpu.get("clocks_max_sm_mhz"))

    @classmethod
    def from_pci(cls, index: int, device: Mapping, catalog: Catalog | None = None) -> Gpu:
        """From one device of the ``NvidiaPciDevices`` fact (no driver: identity from the PCI device id only)."""
        return cls(index=index, source="pci", model=catalog_model(None, device.get("pci_device_id"), catalog),
                   pci_device_id=device.get("pci_device_id"), pci_bus_id=device.get("address"))

    @classmethod
    def from_probe(cls, gpu: Mapping, catalog: Catalog | None = None) -> Gpu:
        """From one GPU of a verify probe document (``gpufleet/probe/probe.py``)."""
        power = gpu.get("power") or {}
        mig = gpu.get("mig") or {}
        return cls(
            index=gpu["index"], source="probe", model=catalog_model(gpu.get("name"), gpu.get("pci_device_id"), catalog),
            name=gpu.get("name"), uuid=gpu.get("uuid"), pci_device_id=gpu.get("pci_device_id"),
            pci_bus_id=gpu.get("pci_bus_id"), status=gpu.get("status") or "ok",
            power_limit_w=power.get("limit_w"), power_default_w=power.get("default_limit_w"),
            power_min_w=power.get("min_limit_w"), power_max_w=power.get("max_limit_w"),
            mig_current=_mode(mig.get("mode_current")), mig_pending=_mode(mig.get("mode_pending")),
            persistence=_mode(gpu.get("persistence_mode")),
            clocks_max_sm_mhz=(gpu.get("clocks") or {}).get("max_sm_mhz"))

    @property
    def display_name(self) -> str:
        if self.name:
            return self.name
        if self.model is not None:
            return self.model.name
        return f"unknown NVIDIA GPU {self.pci_device_id or ''}".strip()

    @property
    def label(self) -> str:
        """``GPU 0 (00000000:18:00.0, NVIDIA H100 80GB HBM3)``: how operations name a GPU."""
        return f"GPU {self.index} ({self.pci_bus_id}, {self.name})"

    @property
    def default_power_w(self) -> float | None:
        """The default power limit: NVML's when reported, else the catalog's."""
        if self.power_default_w is not None:
            return float(self.power_default_w)
        return self.model.power_default_w if self.model is not None else None

    @property
    def power_range_w(self) -> tuple[float | None, float | None]:
        """(min, max) power limit: NVML's when reported, else the catalog's."""
        model = self.model
        low = self.power_min_w if self.power_min_w is not None else (model.power_min_w if model else None)
        high = self.power_max_w if self.power_max_w is not None else (model.power_max_w if model else None)
        return low, high


def gpus_from_facts(gpu_inventory: Mapping | None, pci: Mapping | None = None,
                    catalog: Catalog | None = None) -> list[Gpu]:
    """The host's GPUs: nvidia-smi's list when it answered, else the NVIDIA PCI display devices (in PCI address
    order, nvidia-smi's index order)."""
    listed = (gpu_inventory or {}).get("gpus") or []
    if listed:
        return [Gpu.from_fact({"index": i, **gpu}, catalog) for i, gpu in enumerate(listed)]
    return [Gpu.from_pci(i, dev, catalog) for i, dev in enumerate((pci or {}).get("gpus") or [])]


def gpus_from_probe(probe: Mapping, catalog: Catalog | None = None) -> list[Gpu]:
    """The GPUs of a probe document (GPUs without an index are skipped)."""
    return [Gpu.from_probe(g, catalog) for g in probe.get("gpus") or []
            if isinstance(g, Mapping) and g.get("index") is not None]


def gpu_label(gpus: Iterable[Gpu]) -> str:
    """``GPU 0 (NAME)``, ``GPUs 0-7 (NAME)``, ``GPUs 0, 2 (NAME)``: how preflight names a group of GPUs."""
    gpus = list(gpus)
    indices = sorted(g.index for g in gpus)
    names = sorted({g.display_name for g in gpus})
    if len(indices) == 1:
        which = f"GPU {indices[0]}"
    elif indices == list(range(indices[0], indices[-1] + 1)):
        which = f"GPUs {indices[0]}-{indices[-1]}"
    else:
        which = "GPUs " + ", ".join(map(str, indices))
    return f"{which} ({', '.join(names)})"


# ------------------------------------------------------------------------------------------------ problems


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value) if not isinstance(value, Shown) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Shown(str):
    """A value already formatted for a message (e.g. ``800 W``): shown without quotes."""


@dataclass(frozen=True)
class Problem:
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


@dataclass
class Problems:
    """What a plan cannot apply (errors: nothing may change), what the user must see (warnings), and the checks
    that could not run (notes)."""

    errors: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def extend(self, other: Problems) -> None:
        self.errors += other.errors
        self.warnings += other.warnings
        self.notes += other.notes


# --------------------------------------------------------------------------------------------------- power


def format_watts(watts: float) -> str:
    """``560.0`` -> ``"560"``, ``337.5`` -> ``"337.5"`` (at most 2 decimals, as nvidia-smi prints them)."""
    return f"{watts:.2f}".rstrip("0").rstrip(".")


def power_differs(current: float, wanted: float) -> bool:
    """Whether a GPU at ``current`` W must be set to ``wanted`` W (verify: whether it is off)."""
    return abs(current - wanted) >= POWER_TOLERANCE_W


def outside_range(watts: float, low: float | None, high: float | None) -> bool:
    return ((low is not None and watts < low - POWER_TOLERANCE_W)
            or (high is not None and watts > high + POWER_TOLERANCE_W))


def power_limit_for(config: NodeConfig, gpu: Gpu) -> tuple[str, PowerLimit] | None:
    """The limit that applies to ``gpu`` and the setting it came from; precedence uuid > model > fleet-wide."""
    power = config.power
    uuid = gpu.uuid
    if isinstance(uuid, str) and _UUID_RE.match(uuid) and _normalize_uuid(uuid) in power.by_uuid:
        return f"gpufleet_power_limit_by_uuid[{uuid!r}]", power.by_uuid[_normalize_uuid(uuid)]
    if gpu.model is not None and gpu.model.key in power.by_model:
        return f"gpufleet_power_limit_by_model[{gpu.model.key!r}]", power.by_model[gpu.model.key]
    if power.limit is not None:
        return "gpufleet_power_limit", power.limit
    return None


@dataclass(frozen=True)
class PowerTarget:
    """One GPU's desired limit: the setting it comes from and, resolved, its watts (None: a relative limit on a
    GPU whose default limit is unknown)."""

    gpu: Gpu
    key: str
    setting: PowerLimit
    watts: float | None


@dataclass(frozen=True)
class PowerPlan:
    targets: tuple[PowerTarget, ...] = ()
    unmatched_uuids: tuple[str, ...] = ()  # gpufleet_power_limit_by_uuid keys naming no GPU of the host

    @classmethod
    def resolve(cls, config: NodeConfig, gpus: Iterable[Gpu]) -> PowerPlan:
        gpus = list(gpus)
        targets = []
        for gpu in gpus:
            found = power_limit_for(config, gpu)
            if found is not None:
                key, setting = found
                targets.append(PowerTarget(gpu, key, setting, setting.resolve(gpu.default_power_w)))
        seen = {_normalize_uuid(g.uuid) for g in gpus if g.uuid and _UUID_RE.match(g.uuid)}
        unmatched = tuple(sorted(u for u in config.power.by_uuid if u not in seen))
        return cls(tuple(targets), unmatched)

    @property
    def limits(self) -> dict[str, float]:
        """``{GPU uuid: watts}`` of every GPU with a UUID and a resolved limit."""
        return {t.gpu.uuid: t.watts for t in self.targets if t.gpu.uuid and t.watts is not None}

    def diff(self, observed: Iterable[Gpu]) -> dict[str, float]:
        """``{uuid: watts}`` of the GPUs in ``observed`` not at their planned limit (:func:`power_diff`)."""
        return power_diff(self.limits, observed)

    def serialize(self) -> str:
        """The boot file ``/etc/gpufleet/power-limits.conf`` (:func:`power_conf_text`)."""
        return power_conf_text(self.limits)

    def problems(self, host: str, gpus: list[Gpu], lost: list[str]) -> Problems:
        out = Problems()
        key = "gpufleet_power_limit_by_uuid"
        absent, fate = absent_uuids(self.unmatched_uuids, gpus, lost)
        if fate == ABSENT_UNKNOWN:
            out.notes.append(f"{key}: GPU UUIDs are unknown until the driver answers; per-UUID limits are "
                             "checked once it does (this run, after the driver stage)")
        elif fate == ABSENT_KEPT:
            out.warnings.append(missing_gpu_warning(host, absent, lost, "power limit"))
        elif fate == ABSENT_REFUSED:
            for uuid in absent:
                out.errors.append(Problem(
                    host, f"{key}[{uuid!r}]", uuid, "a UUID of this host's GPUs: "
                    + ", ".join(sorted(g.uuid for g in gpus if g.uuid)), "no such GPU on this host"))
        grouped: dict[tuple, list[Gpu]] = {}
        for t in self.targets:
            low, high = t.gpu.power_range_w
            grouped.setdefault((t.key, str(t.setting), t.watts, low, high, t.gpu.display_name), []).append(t.gpu)
        for (key, shown, watts, low, high, _name), members in grouped.items():
            label = gpu_label(members)
            if watts is None:
                out.errors.append(Problem(
                    host, key, Shown(shown), "a limit in watts (this GPU's default power limit is unknown)",
                    "cannot resolve a relative power limit", label))
                continue
            if low is None and high is None:
                out.notes.append(f"{key}: power limit range of {label} unknown; range check skipped")
                continue
            if outside_range(watts, low, high):
                if low is not None and high is not None:
                    allowed = f"{low:g}-{high:g} W"
                else:
                    allowed = f"at least {low:g} W" if low is not None else f"at most {high:g} W"
                resolved = "" if shown == f"{watts:g} W" else f" ({shown} of the default limit is {watts:g} W)"
                out.errors.append(Problem(host, key, Shown(shown), allowed,
                                          f"outside this GPU's power limit range{resolved}", label))
        return out


def missing_gpu_warning(host: str, uuids: Iterable[str], lost: Iterable[str], what: str) -> str:
    return (f"{host}: GPU {', '.join(uuids)} is missing (nvidia-smi reports lost GPU(s) {', '.join(lost)}): its "
            f"desired {what} is kept and applied at boot when it is back")


# What becomes of a per-UUID setting that names no GPU the host lists (:func:`absent_uuids`)
ABSENT_UNKNOWN = "unknown"  # the driver does not list the GPUs (yet): checked once it does
ABSENT_KEPT = "kept"  # GPUs are lost (fallen off the bus): the setting is kept for boot, with a warning
ABSENT_REFUSED = "refused"  # no such GPU on this host: an error, nothing changes


def _uuid_key(uuid: str) -> str:
    return _normalize_uuid(uuid) if _UUID_RE.match(uuid) else uuid


def absent_uuids(uuids: Iterable[str], gpus: Iterable[Gpu], lost: Iterable[str]) -> tuple[list[str], str | None]:
    """The UUIDs of ``uuids`` naming no GPU of ``gpus`` (compared case-insensitively, as config normalises them)
    and what becomes of them (``ABSENT_*``; None when every UUID names a GPU): the ONE check of a per-UUID setting
    for a GPU that is not there, used by preflight (:meth:`PowerPlan.problems`) and the power operation
    (:func:`power_plan_diff`)."""
    gpus = list(gpus)
    present = {_uuid_key(g.uuid) for g in gpus if isinstance(g.uuid, str)}
    absent = sorted(u for u in uuids if _uuid_key(u) not in present)
    if not absent:
        return [], None
    if not gpus or gpus[0].source == "pci":
        return absent, ABSENT_UNKNOWN
    return absent, ABSENT_KEPT if list(lost) else ABSENT_REFUSED


def power_diff(limits: Mapping[str, float], observed: Iterable[Gpu]) -> dict[str, float]:
    """``{uuid: watts}`` to set, in GPU index order: the GPUs of ``limits`` present in ``observed`` whose current
    limit differs (:func:`power_differs`). What the power operation sets."""
    changes = {}
    for gpu in sorted(observed, key=lambda g: g.index):
        want = limits.get(gpu.uuid) if gpu.uuid else None
        if want is not None and gpu.power_limit_w is not None and power_differs(gpu.power_limit_w, want):
            changes[gpu.uuid] = want
    return changes


@dataclass(frozen=True)
class PowerDiff:
    """What the power operation does on one host (:func:`power_plan_diff`)."""

    problem: str | None = None  # the host cannot take these limits: nothing may change on it
    set: Mapping[str, float] = field(default_factory=dict)  # {uuid: watts} to set now, index order
    reset: Mapping[str, float] = field(default_factory=dict)  # {uuid: default watts}: managed before, dropped now
    file_limits: Mapping[str, float] = field(default_factory=dict)  # the boot file's {uuid: watts}
    warning: str | None = None  # limits of lost GPUs kept for boot


def power_plan_diff(host: str, wanted: Mapping[str, float], gpus: Iterable[Gpu], lost: Iterable[str],
                    previous: Mapping[str, str]) -> PowerDiff:
    """The power operation's plan of one host: ``wanted`` ({uuid: watts}) against the GPUs nvidia-smi lists, the
    lost ones, and the boot file written before (``previous``: {uuid: watts text}). A UUID naming no GPU is refused,
    or kept for boot while GPUs are lost (:func:`absent_uuids`); limits are checked against each GPU's range
    (:func:`power_refusal`); GPUs at their limit are left alone (:func:`power_diff`)."""
    gpus = [g for g in gpus if g.uuid]
    lost = list(lost)
    if not gpus:
        return PowerDiff(file_limits=dict(wanted))
    by_uuid = {g.uuid: g for g in gpus}
    missing, fate = absent_uuids(wanted, gpus, lost)
    if fate == ABSENT_REFUSED:
        return PowerDiff(problem=f"GPU {', '.join(missing)} is not on {host} (its GPUs: {', '.join(sorted(by_uuid))})")
    problem = power_refusal(host, wanted, gpus)
    if problem:
        return PowerDiff(problem=problem)
    kept: dict[str, float] = {}
    warning = None
    if wanted and lost:
        kept = {uuid: float(previous[uuid]) for uuid in previous
                if uuid not in by_uuid and uuid not in wanted and _watts(previous[uuid]) is not None}
        absent = sorted({*missing, *kept})
        if absent:
            warning = missing_gpu_warning(host, absent, lost, "power limit")
    reset = {}
    for uuid in sorted(set(previous) - set(wanted) - set(kept)):
        gpu = by_uuid.get(uuid)
        if gpu is not None and gpu.power_default_w is not None and gpu.power_limit_w is not None \
                and power_differs(gpu.power_limit_w, gpu.power_default_w):
            reset[uuid] = gpu.power_default_w
    return PowerDiff(None, power_diff(wanted, gpus), reset, {**kept, **wanted}, warning)


def _watts(text: str) -> float | None:
    """A watts value of the boot file, None when it is not one."""
    try:
        return float(text)
    except ValueError:
        return None


def power_refusal(host: str, limits: Mapping[str, float], gpus: Iterable[Gpu]) -> str | None:
    """Why ``limits`` ({uuid: watts} of GPUs present) cannot be applied to these GPUs, or None: no power
    management, or a limit out of the GPU's range. (A UUID not on the host is decided by the caller, which
    knows whether GPUs are lost.)"""
    by_uuid = {g.uuid: g for g in gpus if g.uuid}
    for uuid, watts in sorted(limits.items()):
        gpu = by_uuid.get(uuid)
        if gpu is None:
            continue
        low, high = gpu.power_min_w, gpu.power_max_w
        if gpu.power_limit_w is None:
            return f"GPU {uuid} ({gpu.name}) on {host} does not report a power limit (not supported)"
        if low is not None and high is not None and outside_range(watts, low, high):
            return (f"{format_watts(watts)} W for GPU {uuid} ({gpu.name}) on {host} is outside its range "
                    f"{format_watts(low)}-{format_watts(high)} W")
    return None


def parse_uuid_conf(text: str | None) -> dict[str, str]:
    """``GPU-UUID=VALUE`` lines of a boot file -> {uuid: value text} (comments, other keys and junk ignored)."""
    values = {}
    for line in (text or "").splitlines():
        uuid, sep, value = line.strip().partition("=")
        if sep and uuid.startswith("GPU-"):
            values[uuid] = value
    return values


def power_conf_text(limits: Mapping[str, float]) -> str:
    """``/etc/gpufleet/power-limits.conf``: ``UUID=WATTS`` lines sorted by UUID, and the tolerance the boot script
    compares with (``tolerance_w=``, so that it is stated once, here)."""
    lines = [
        "# Managed by gpufleet (power stage), overwritten on every run.",
        f"# Power limit in watts per GPU UUID, reapplied at boot by {POWER_UNIT} (gpufleet-gpu-settings power).",
        f"tolerance_w={POWER_TOLERANCE_W:g}",
    ]
    lines += [f"{uuid}={format_watts(watts)}" for uuid, watts in sorted(limits.items())]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------- MIG


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
            if gpu.model is None:
                out.notes.append(f"{base}[{matches[0]}]: model of {gpu_label([gpu])} not in the catalog; "
                                 "MIG layout not checked")
                continue
            by_entry.setdefault((matches[0], gpu.model.key), []).append(gpu)
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


def mig_target(gpu: Gpu, want: Mapping[str, int] | None) -> tuple[MigTarget | None, str | None]:
    """The target of one GPU for a layout entry (``None``: MIG disabled), or why this GPU cannot take it."""
    if want is None:
        return MigTarget(gpu, False), None
    if gpu.model is None:
        return None, f"{gpu.label} is not in gpufleet's GPU catalog: its MIG profiles are unknown"
    if gpu.model.mig is None or gpu.mig_current is None:
        return None, (f"{gpu.label} does not support MIG (mig.mode.current is "
                      f"{_MODES.get(gpu.mig_current) or 'N/A'})")
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


# -------------------------------------------------------------------------------------------------- clocks


def clocks_conf_text(locks: Mapping[str, str]) -> str:
    """``/etc/gpufleet/gpu-clocks.conf``: ``UUID=MIN,MAX`` lines sorted by UUID."""
    header = (
        "# Managed by gpufleet (clocks stage), overwritten on every run.\n"
        f"# Locked GPU clocks MIN,MAX in MHz per GPU UUID, reapplied at boot by {CLOCKS_UNIT} "
        "(gpufleet-gpu-settings clocks).\n"
    )
    return header + "".join(f"{uuid}={value}\n" for uuid, value in sorted(locks.items()))


@dataclass(frozen=True)
class ClocksPlan:
    """``lock_mhz``: (min, max) to lock every GPU at; None: reset what gpufleet locked."""

    lock_mhz: tuple[int, int] | None

    def above_max(self, gpus: Iterable[Gpu]) -> dict[int, list[Gpu]]:
        """{max SM clock: GPUs} of the GPUs whose max SM clock (NVML's, else the catalog's) is below the lock's
        minimum."""
        grouped: dict[int, list[Gpu]] = {}
        for gpu in gpus:
            top = gpu.clocks_max_sm_mhz or (gpu.model.clocks_max_sm_mhz if gpu.model else None)
            if self.lock_mhz is not None and top is not None and self.lock_mhz[0] > top:
                grouped.setdefault(top, []).append(gpu)
        return grouped

    def problems(self, host: str, gpus: list[Gpu]) -> Problems:
        out = Problems()
        for top, members in self.above_max(gpus).items():
            out.errors.append(Problem(
                host, "gpufleet_clocks.lock_gpu_mhz", list(self.lock_mhz),
                f"a minimum at most {top} MHz (this GPU's max SM clock)", "locked clock range above the GPU's maximum",
                gpu_label(members)))
        return out

    def desired(self, uuids: Iterable[str]) -> dict[str, str]:
        """{uuid: "MIN,MAX"}: the record and the boot file of these GPUs."""
        if self.lock_mhz is None:
            return {}
        return {uuid: f"{self.lock_mhz[0]},{self.lock_mhz[1]}" for uuid in uuids}

    def diff(self, observed: Iterable[Gpu], applied: Mapping[str, str]) -> list[str]:
        """UUIDs (index order) of the GPUs in ``observed`` to lock: not recorded as locked at the range in
        ``applied`` (the driver cannot read a lock back: gpufleet's record of what it applied since boot)."""
        observed = list(observed)
        desired = self.desired(g.uuid for g in observed if g.uuid)
        return [g.uuid for g in sorted(observed, key=lambda g: g.index)
                if g.uuid in desired and applied.get(g.uuid) != desired[g.uuid]]

    def serialize(self, uuids: Iterable[str]) -> str:
        """The boot file ``/etc/gpufleet/gpu-clocks.conf`` for these GPUs (:func:`clocks_conf_text`)."""
        return clocks_conf_text(self.desired(uuids))


@dataclass(frozen=True)
class ClocksDiff:
    """What the clocks operation does on one host (:func:`clocks_plan_diff`)."""

    problem: str | None = None  # the lock cannot be applied: nothing may change on this host
    lock: Mapping[str, str] = field(default_factory=dict)  # {uuid: "MIN,MAX"} to lock now, index order
    desired: Mapping[str, str] = field(default_factory=dict)  # the record of what is locked once done
    file_locks: Mapping[str, str] = field(default_factory=dict)  # the boot file's {uuid: "MIN,MAX"}
    warning: str | None = None  # locks of lost GPUs kept for boot


def clocks_plan_diff(host: str, lock_mhz: tuple[int, int], gpus: Iterable[Gpu], lost: Iterable[str],
                     applied: Mapping[str, str], previous: Mapping[str, str]) -> ClocksDiff:
    """The clocks operation's plan of one host: lock every GPU of ``gpus`` (with a UUID) at ``lock_mhz``, against
    what gpufleet recorded as locked since boot (``applied``) and the boot file written before (``previous``)."""
    gpus = [g for g in gpus if g.uuid]
    lost = list(lost)
    plan = ClocksPlan(lock_mhz)
    for top, members in plan.above_max(gpus).items():
        return ClocksDiff(problem=f"{host}: {gpu_label(members)}: lock_mhz {lock_mhz[0]},{lock_mhz[1]} starts above "
                          f"the GPU's max SM clock {top} MHz")
    present = {g.uuid for g in gpus}
    desired = plan.desired(g.uuid for g in gpus if g.uuid)
    # GPUs in the boot file that are lost now: kept there, locked at boot when they are back
    kept = plan.desired(u for u in previous if u not in present) if lost else {}
    warning = missing_gpu_warning(host, sorted(kept), lost, "clock lock") if kept else None
    lock = {uuid: desired[uuid] for uuid in plan.diff(gpus, applied)}
    return ClocksDiff(None, lock, desired, {**kept, **desired}, warning)


# ---------------------------------------------------------------------------------------------- node plan


# -------------------------------------------------------------------------------------------------- stages

# The order the GPU node's stages run in (the deploy follows it): the driver first (the GPU stages need the GPUs it
# lists); MIG before power limits and clocks (a MIG mode change resets the GPU, which then loses its power limit and
# locked clocks; the boot units are ordered the same way); Slurm's gres.conf after the MIG layout it describes; the
# exporters last (they publish what the stages set).
STAGE_ORDER = ("driver", "persistence", "mig", "power", "nccl", "clocks", "slurm", "exporters")
# The stages that set the GPUs: planned from the GPUs the driver lists
GPU_STAGES = ("persistence", "mig", "power", "nccl", "clocks", "slurm")


def stage_order(config: NodeConfig) -> tuple[str, ...]:
    """The host's enabled stages (``gpufleet_stages``), in the order they run."""
    return tuple(stage for stage in STAGE_ORDER if config.stage_enabled(stage))


# -------------------------------------------------------------------------------------------------- driver

OPEN_ONLY_ARCHITECTURES = ("Blackwell",)
PRE_TURING_ARCHITECTURES = ("Kepler", "Maxwell", "Pascal", "Volta")


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


def packages_style_for(os_id: str | None, requested: str | None = None) -> str:
    """The apt package naming of the driver (``gpufleet_driver_packages_style``, else by OS): Ubuntu's names on
    Ubuntu (its archive and NVIDIA's Ubuntu repositories), NVIDIA's CUDA repositories' names elsewhere."""
    if requested is not None:
        return requested
    return "ubuntu" if str(os_id or "").lower() == "ubuntu" else "nvidia"


def driver_on_branch(version: str | None, branch: str) -> bool:
    """Whether a driver version (``580.95.05``) is of ``branch`` (``580``): what verify and preflight compare."""
    version = str(version or "")
    return version == branch or version.split(".")[0] == branch


@dataclass(frozen=True)
class DriverPlan:
    """What the driver stage installs on a host: the branch, the kernel modules' flavour (``auto`` resolved from
    the GPUs), the package naming (by OS), whether its modules are built by DKMS (unsigned under Secure Boot),
    and the fabric manager where the host has NVSwitches."""

    branch: str
    flavour: str
    packages_style: str
    dkms: bool
    nvswitch: bool

    @classmethod
    def resolve(cls, config: NodeConfig, gpus: Iterable[Gpu], os_id: str | None, nvswitch: bool = False
                ) -> DriverPlan:
        style = packages_style_for(os_id, config.driver.packages_style)
        return cls(config.driver.branch, choose_kernel_flavour(config.driver.flavour, [g.model for g in gpus]),
                   style,
                   # Ubuntu's packages on Ubuntu come with Canonical-signed precompiled modules
                   # (linux-modules-nvidia-*); NVIDIA's repository packages build with DKMS
                   dkms=not (style == "ubuntu" and str(os_id or "").lower() == "ubuntu"), nvswitch=nvswitch)

    def loaded(self, version: str | None) -> bool:
        """Whether the loaded driver (``version``) is of the planned branch."""
        return driver_on_branch(version, self.branch)


# ----------------------------------------------------------------------------------------------- persistence

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


# ------------------------------------------------------------------------------------------------ exporters

# DCGM's profiling metrics (DCGM_FI_PROF_*) on this architecture and earlier need NVIDIA's proprietary DCGM package
# (dcgm-exporter's README: "for Ampere and earlier generation GPUs, profiling metrics depend on the
# datacenter-gpu-manager-4-proprietary package").
PROFILING_PACKAGE_UP_TO = "Ampere"


def choose_gpu_exporter(setting: str, models: Iterable[GpuModel | None], dcgm_offered: bool) -> str:
    """``auto``: DCGM on datacenter GPUs when the repository offers it, else gpufleet's NVML exporter."""
    if setting != "auto":
        return setting
    models = list(models)
    datacenter = bool(models) and all(model is not None and model.datacenter for model in models)
    return "dcgm" if datacenter and dcgm_offered else "nvml"


@dataclass(frozen=True)
class ExportersPlan:
    """Which GPU exporter a host runs (``kind``: dcgm, nvml or none) and what it collects: profiling counters where
    every GPU has them (datacenter GPUs), the proprietary DCGM module where profiling needs it (by GPU generation),
    and how often dcgm-exporter collects."""

    profiling: bool
    profiling_package: bool
    collect_interval_ms: int
    kind: str = "nvml"

    @classmethod
    def resolve(cls, config: NodeConfig, gpus: Iterable[Gpu], dcgm_offered: bool = False) -> ExportersPlan:
        """``dcgm_offered``: a repository of the host offers dcgm-exporter (``auto`` chooses DCGM only then)."""
        models = [gpu.model for gpu in gpus]
        profiling = bool(models) and all(m is not None and m.datacenter for m in models)
        package = profiling and any(m.architecture_at_most(PROFILING_PACKAGE_UP_TO) for m in models if m)
        return cls(profiling, package, config.exporters.collect_interval_ms,
                   choose_gpu_exporter(config.exporters.gpu, models, dcgm_offered))


@dataclass(frozen=True)
class NodePlan:
    """A host's configuration resolved against its GPUs; a part is None where its stage is off or unset.
    ``stages``: the enabled stages in the order they run (:data:`STAGE_ORDER`)."""

    host: str
    gpus: tuple[Gpu, ...]
    power: PowerPlan | None = None
    mig: MigPlan | None = None
    clocks: ClocksPlan | None = None
    mig_unused: bool = False  # a MIG layout is configured but the mig stage is off
    stages: tuple[str, ...] = ()
    driver: DriverPlan | None = None
    persistence: PersistencePlan | None = None
    exporters: ExportersPlan | None = None

    @classmethod
    def resolve(cls, config: NodeConfig, gpus: Iterable[Gpu], catalog: Catalog | None = None, *,
                os_id: str | None = None, nvswitch: bool = False, dcgm_offered: bool = False) -> NodePlan:
        """``os_id``: the OS (``ID`` of os-release), which names the driver's packages; ``nvswitch``: the host has
        NVSwitches (fabric manager); ``dcgm_offered``: a repository offers dcgm-exporter (the exporter choice)."""
        gpus = tuple(gpus)
        if catalog is not None:  # models from another catalog than the default one
            gpus = tuple(_with_model(g, catalog) for g in gpus)
        power = PowerPlan.resolve(config, gpus) if config.stage_enabled("power") and config.power.managed else None
        mig = MigPlan.resolve(config.mig, gpus) if config.stage_enabled("mig") and config.mig is not None else None
        clocks = None
        if config.stage_enabled("clocks") and config.clocks.mode is not None:
            clocks = ClocksPlan(config.clocks.lock_gpu_mhz if config.clocks.mode == "lock" else None)
        driver = DriverPlan.resolve(config, gpus, os_id, nvswitch) if config.stage_enabled("driver") else None
        persistence = PersistencePlan() if config.stage_enabled("persistence") else None
        exporters = ExportersPlan.resolve(config, gpus, dcgm_offered) if config.stage_enabled("exporters") else None
        return cls(config.host, gpus, power, mig, clocks,
                   mig_unused=config.mig is not None and not config.stage_enabled("mig"), stages=stage_order(config),
                   driver=driver, persistence=persistence, exporters=exporters)

    def problems(self, lost: list[str] | None = None) -> Problems:
        """Everything preflight reports about power, MIG and clocks on this host."""
        lost = list(lost or [])
        out = Problems()
        gpus = list(self.gpus)
        if self.mig_unused:
            out.warnings.append(f"{self.host}: a MIG layout is configured (gpufleet_mig) but gpufleet_stages leaves "
                                "out 'mig': the layout is not applied")
        if self.power is not None:
            out.extend(self.power.problems(self.host, gpus, lost))
        if self.mig is not None:
            out.extend(self.mig.problems(self.host, gpus, lost=len(lost)))
        if self.clocks is not None:
            out.extend(self.clocks.problems(self.host, gpus))
        return out


def _with_model(gpu: Gpu, catalog: Catalog) -> Gpu:
    return replace(gpu, model=catalog_model(gpu.name, gpu.pci_device_id, catalog))
