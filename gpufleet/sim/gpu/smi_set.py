"""Device modification options: -pm, -pl, -mig, -r, -lgc/-rgc, -e, -c. All writes under the state lock."""

from __future__ import annotations

import os

from . import state as st
from .smi_common import (
    ALL_DONE,
    IN_USE,
    NO_PERMISSION,
    NOT_SUPPORTED,
    RC_IN_USE,
    RC_INVALID_ARGUMENT,
    RC_NO_PERMISSION,
    RC_OTHER,
    TERMINATING,
    Gpu,
    SmiExit,
    for_each_gpu,
    invalid_combination,
    is_root,
    key,
    major,
    persistence_warning,
    select,
    watts,
)
from .smi_mig import destroy_all_instances

TYPE_CHECKING = False  # for annotations only: importing collections.abc slows every simulated program's start
if TYPE_CHECKING:
    from collections.abc import Callable

WARN_MOVE_ON = "Treating as warning and moving on."


def _bool_arg(value: str) -> bool:
    text = value.strip().upper()
    if text in ("1", "ENABLED", "ENABLE"):
        return True
    if text in ("0", "DISABLED", "DISABLE"):
        return False
    raise invalid_combination()


def _holders(state: dict[str, str], g: Gpu) -> list[tuple[int, str]]:
    return st.holders(state, g.index, exclude_pid=os.getpid())


def _each_gpu(
    id_arg: str | None,
    change: Callable[[dict[str, str], Gpu], list[str]],
    done: tuple[str, ...] = (ALL_DONE,),
) -> tuple[list[str], int]:
    """Run ``change(state, g)`` for every GPU ``-i`` selects, under the state lock, printing the lines it returns.

    A lost GPU prints its line and makes the exit code 15 while the others go on. ``change`` raises SmiExit
    (``_stop``) to end at once: its lines follow what was printed so far, and the changes made so far are kept.
    ``done``: the closing lines when every GPU was seen to.
    """
    out: list[str] = []
    with st.locked() as state:
        gpus = select(state, id_arg)
        try:
            rc = for_each_gpu(gpus, out, lambda g: change(state, g))
        except SmiExit as stop:
            return out + stop.lines, stop.rc
    return out + list(done), rc


def _stop(rc: int, line: str) -> SmiExit:
    """End a setter with ``line`` and "Terminating early due to previous errors.", exit code ``rc``."""
    return SmiExit(rc, line, TERMINATING)


def _require_root(line: str) -> None:
    if not is_root():
        raise _stop(RC_NO_PERMISSION, line)


def persistence(id_arg: str | None, value: str, version: str) -> tuple[list[str], int]:
    enable = _bool_arg(value)
    word = "Enabled" if enable else "Disabled"

    def change(state: dict[str, str], g: Gpu) -> list[str]:
        unable = f"Unable to set persistence mode for GPU {g.bus_id}"
        _require_root(f"{unable}: {NO_PERMISSION}")
        if g.s("persistence.supported", "1") == "0":
            return [f"{unable}: {NOT_SUPPORTED}", WARN_MOVE_ON]
        if g.flag("persistence") == enable:
            return [f"Persistence mode is already {word} for GPU {g.bus_id}."]
        state[key(g, "persistence")] = "1" if enable else "0"
        legacy = "Legacy " if enable and major(version) >= 580 else ""
        return [f"{word} {legacy}persistence mode for GPU {g.bus_id}."]

    return _each_gpu(id_arg, change)


def power_limit(id_arg: str | None, value: str, version: str) -> tuple[list[str], int]:
    try:
        requested = float(value)
    except ValueError:
        raise invalid_combination() from None
    mw = round(requested * 1000)

    def change(state: dict[str, str], g: Gpu) -> list[str]:
        if not g.has("power.min_mw") or g.i("power.min_mw") == g.i("power.max_mw") == 0:
            return [f"Changing power management limit is not supported for GPU: {g.bus_id}.", WARN_MOVE_ON]
        lo, hi = g.i("power.min_mw"), g.i("power.max_mw")
        if not lo <= mw <= hi:
            raise _stop(
                RC_INVALID_ARGUMENT,
                f"Provided power limit {requested:.2f} W is not a valid power limit which should be between "
                f"{watts(lo)} W and {watts(hi)} W for GPU {g.bus_id}",
            )
        _require_root(f"Failed to set power management limit for GPU {g.bus_id}: {NO_PERMISSION}")
        old = g.i("power.limit_mw")
        state[key(g, "power.limit_mw")] = str(mw)
        if g.i("power.draw_mw") > mw:
            state[key(g, "power.draw_mw")] = str(mw)
        return [
            f"Power limit for GPU {g.bus_id} was set to {watts(mw)} W from {watts(old)} W.",
            *persistence_warning(g, version),
        ]

    return _each_gpu(id_arg, change)


def mig_mode(id_arg: str | None, value: str, version: str) -> tuple[list[str], int]:
    enable = _bool_arg(value)
    verb = "enable" if enable else "disable"
    word = "Enabled" if enable else "Disabled"

    def change(state: dict[str, str], g: Gpu) -> list[str]:
        unable = f"Unable to {verb} MIG Mode for GPU {g.bus_id}"
        _require_root(f"{unable}: {NO_PERMISSION}")
        if not g.flag("mig.supported"):
            return [f"{unable}: {NOT_SUPPORTED}", WARN_MOVE_ON]
        busy = _holders(state, g)
        if not enable and g.gis():
            raise _stop(RC_IN_USE, f"{unable}: {IN_USE}")
        if busy:
            if g.s("architecture") != "Ampere":
                raise _stop(RC_IN_USE, f"{unable}: {IN_USE}")
            # Ampere: the mode is stored as pending and applies at the next reset / reboot
            state[key(g, "mig.pending")] = "1" if enable else "0"
            return [
                f"Warning: MIG mode is in pending {verb} state for GPU {g.bus_id}:{IN_USE}",
                f"{g.bus_id} is currently being used by one or more other processes (e.g. CUDA application "
                "or a monitoring application such as another instance of nvidia-smi). Please first kill all "
                "processes using the device and retry the command or reboot the system to make MIG mode "
                "effective.",
            ]
        state[key(g, "mig.current")] = state[key(g, "mig.pending")] = "1" if enable else "0"
        destroy_all_instances(state, g)
        return [f"{word} MIG Mode for GPU {g.bus_id}", *persistence_warning(g, version)]

    return _each_gpu(id_arg, change)


def reset_gpu_state(state: dict[str, str], g: Gpu) -> None:
    """What a GPU reset does: defaults back, pending modes applied, MIG instances gone."""
    state[key(g, "power.limit_mw")] = g.s("power.default_mw")
    state[key(g, "clocks.locked.min")] = "0"
    state[key(g, "clocks.locked.max")] = "0"
    state[key(g, "mig.current")] = g.s("mig.pending", "0")
    state[key(g, "ecc.current")] = g.s("ecc.pending", "0")
    state[key(g, "ecc.volatile.corrected")] = "0"
    state[key(g, "ecc.volatile.uncorrected")] = "0"
    if g.has("remap.pending"):
        state[key(g, "remap.pending")] = "0"
    destroy_all_instances(state, g)


def gpu_reset(id_arg: str | None) -> tuple[list[str], int]:
    busy: list[Gpu] = []

    def change(state: dict[str, str], g: Gpu) -> list[str]:
        _require_root(f"Unable to reset GPU {g.bus_id}: {NO_PERMISSION}")
        if _holders(state, g):
            busy.append(g)
            return []
        reset_gpu_state(state, g)
        return [f"GPU {g.bus_id} was successfully reset."]

    out, rc = _each_gpu(id_arg, change, done=())
    if busy:  # (never after a stop: root is checked before any GPU counts as busy)
        n = len(busy)
        what = "1 device is" if n == 1 else f"{n} devices are"
        these = "this device" if n == 1 else "these devices"
        out += ["", "The following GPUs could not be reset:"]
        out += [f"  GPU {g.bus_id}: {IN_USE}" for g in busy]
        out += [
            "",
            f"{what} currently being used by one or more other processes (e.g., Fabric Manager, CUDA application, "
            "graphics application such as an X server, or a monitoring application such as another instance of "
            f"nvidia-smi). Please first kill all processes using {these} and all compute applications running in "
            "the system.",
        ]
        rc = RC_OTHER
    return out, rc


def lock_clocks(id_arg: str | None, value: str | None) -> tuple[list[str], int]:
    """-lgc MIN,MAX (or a single value); -rgc when value is None."""
    if value is not None:
        parts = [p.strip() for p in value.split(",")]
        if len(parts) == 1:
            parts = parts * 2
        if len(parts) != 2 or not all(p.isdigit() for p in parts) or int(parts[0]) > int(parts[1]):
            raise invalid_combination()
        lo, hi = int(parts[0]), int(parts[1])

    def change(state: dict[str, str], g: Gpu) -> list[str]:
        _require_root(f"The current user does not have permission to change clocks for GPU {g.bus_id}.")
        if value is None:
            state[key(g, "clocks.locked.min")] = state[key(g, "clocks.locked.max")] = "0"
            return []
        state[key(g, "clocks.locked.min")] = str(lo)
        state[key(g, "clocks.locked.max")] = str(hi)
        return [f'GPU clocks set to "(gpuClkMin {lo}, gpuClkMax {hi})" for GPU {g.bus_id}']

    return _each_gpu(id_arg, change)


def ecc_config(id_arg: str | None, value: str) -> tuple[list[str], int]:
    enable = _bool_arg(value)
    word = "Enabled" if enable else "Disabled"
    changed: list[Gpu] = []

    def change(state: dict[str, str], g: Gpu) -> list[str]:
        unable = f"Unable to set the ECC mode for GPU {g.bus_id}"
        if not g.flag("ecc.supported"):
            return [f"{unable}: {NOT_SUPPORTED}", WARN_MOVE_ON]
        _require_root(f"{unable}: {NO_PERMISSION}")
        if g.flag("ecc.pending") == enable:
            return [f"ECC support is already {word} for GPU {g.bus_id}."]
        state[key(g, "ecc.pending")] = "1" if enable else "0"
        changed.append(g)
        return [f"{word} ECC support for GPU {g.bus_id}."]

    out, rc = _each_gpu(id_arg, change)
    return out + (["Reboot required."] if changed else []), rc  # (none changed after a stop: root comes first)


COMPUTE_MODES = {
    "0": "Default", "DEFAULT": "Default",
    "2": "Prohibited", "PROHIBITED": "Prohibited",
    "3": "Exclusive_Process", "EXCLUSIVE_PROCESS": "Exclusive_Process",
}  # fmt: skip


def compute_mode(id_arg: str | None, value: str) -> tuple[list[str], int]:
    mode = COMPUTE_MODES.get(value.strip().upper())
    if mode is None:
        raise invalid_combination()

    def change(state: dict[str, str], g: Gpu) -> list[str]:
        _require_root(f"Unable to set compute mode for GPU {g.bus_id}: {NO_PERMISSION}")
        state[key(g, "compute_mode")] = mode
        return [f"Set compute mode to {mode.upper()} for GPU {g.bus_id}."]

    return _each_gpu(id_arg, change)
