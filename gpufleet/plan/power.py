"""Power limits: which setting applies to a GPU (per UUID > per model > fleet-wide), in watts, within its range;
what the power operation sets (:func:`power_plan_diff`); the boot file; a per-UUID setting for a GPU that is not there
(:func:`absent_uuids`, the one check)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpufleet.config import (
    _UUID_RE,
    NodeConfig,
    PowerLimit,
    _normalize_uuid,
)

from .files import POWER_UNIT
from .gpu import Gpu, gpu_label
from .problems import Problem, Problems, Shown, missing_gpu_warning

# nvidia-smi prints power limits with 2 decimals and NVML takes milliwatts: two limits closer than this are the
# same limit. Used by the power operation, preflight's range check, the boot script (through the file) and verify.
POWER_TOLERANCE_W = 0.005

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
            defaults = _board_defaults(members[0])
            if watts is None and members[0].source == "pci" and len(defaults) > 1:
                out.notes.append(f"{key}: {label}: boards of this model default to "
                                 f"{' or '.join(f'{w:g} W' for w in defaults)}; {shown} is resolved once the "
                                 "driver answers (this run, after the driver stage)")
                continue
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


def _board_defaults(gpu: Gpu) -> list[float]:
    """The default power limits the catalog's board variants of this GPU's model report (empty: model unknown)."""
    variants = gpu.model.power_limits_w if gpu.model is not None else ()
    return sorted({v.default_w for v in variants if v.default_w is not None})


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
