"""Locked GPU clocks: the lock range against the GPU's maximum SM clock, what the clocks operation does
(:func:`clocks_plan_diff`) and the boot file."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .files import CLOCKS_UNIT
from .gpu import Gpu, gpu_label
from .problems import Problem, Problems, missing_gpu_warning


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
