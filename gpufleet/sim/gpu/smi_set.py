"""Device modification options: -pm, -pl, -mig, -r, -lgc/-rgc, -e, -c. All writes under the state lock."""

from __future__ import annotations

import os

from . import state as st
from .smi_common import (
    ALL_DONE,
    IN_USE,
    NO_PERMISSION,
    NOT_SUPPORTED,
    RC_GPU_IS_LOST,
    RC_IN_USE,
    RC_INVALID_ARGUMENT,
    RC_NO_PERMISSION,
    RC_OTHER,
    TERMINATING,
    Gpu,
    invalid_combination,
    is_root,
    key,
    lost_line,
    major,
    persistence_warning,
    select,
    watts,
)
from .smi_mig import destroy_all_instances

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


def persistence(id_arg: str | None, value: str, version: str) -> tuple[list[str], int]:
    enable = _bool_arg(value)
    word = "Enabled" if enable else "Disabled"
    out: list[str] = []
    rc = 0
    with st.locked() as state:
        for g in select(state, id_arg):
            if g.lost:
                out.append(lost_line(g))
                rc = RC_GPU_IS_LOST
                continue
            if not is_root():
                return out + [
                    f"Unable to set persistence mode for GPU {g.bus_id}: {NO_PERMISSION}",
                    TERMINATING,
                ], RC_NO_PERMISSION
            if g.s("persistence.supported", "1") == "0":
                out += [f"Unable to set persistence mode for GPU {g.bus_id}: {NOT_SUPPORTED}", WARN_MOVE_ON]
                continue
            if g.flag("persistence") == enable:
                out.append(f"Persistence mode is already {word} for GPU {g.bus_id}.")
                continue
            state[key(g, "persistence")] = "1" if enable else "0"
            legacy = "Legacy " if enable and major(version) >= 580 else ""
            out.append(f"{word} {legacy}persistence mode for GPU {g.bus_id}.")
    return out + [ALL_DONE], rc


def power_limit(id_arg: str | None, value: str, version: str) -> tuple[list[str], int]:
    try:
        requested = float(value)
    except ValueError:
        raise invalid_combination() from None
    mw = round(requested * 1000)
    out: list[str] = []
    rc = 0
    with st.locked() as state:
        for g in select(state, id_arg):
            if g.lost:
                out.append(lost_line(g))
                rc = RC_GPU_IS_LOST
                continue
            if not g.has("power.min_mw") or g.i("power.min_mw") == g.i("power.max_mw") == 0:
                out += [f"Changing power management limit is not supported for GPU: {g.bus_id}.", WARN_MOVE_ON]
                continue
            lo, hi = g.i("power.min_mw"), g.i("power.max_mw")
            if not lo <= mw <= hi:
                out += [
                    f"Provided power limit {requested:.2f} W is not a valid power limit which should be between "
                    f"{watts(lo)} W and {watts(hi)} W for GPU {g.bus_id}",
                    TERMINATING,
                ]
                return out, RC_INVALID_ARGUMENT
            if not is_root():
                return out + [
                    f"Failed to set power management limit for GPU {g.bus_id}: {NO_PERMISSION}",
                    TERMINATING,
                ], RC_NO_PERMISSION
            old = g.i("power.limit_mw")
            state[key(g, "power.limit_mw")] = str(mw)
            if g.i("power.draw_mw") > mw:
                state[key(g, "power.draw_mw")] = str(mw)
            out.append(f"Power limit for GPU {g.bus_id} was set to {watts(mw)} W from {watts(old)} W.")
            if not g.flag("persistence"):
                out += persistence_warning(g, version)
    return out + [ALL_DONE], rc


def mig_mode(id_arg: str | None, value: str, version: str) -> tuple[list[str], int]:
    enable = _bool_arg(value)
    verb = "enable" if enable else "disable"
    word = "Enabled" if enable else "Disabled"
    out: list[str] = []
    rc = 0
    with st.locked() as state:
        for g in select(state, id_arg):
            if g.lost:
                out.append(lost_line(g))
                rc = RC_GPU_IS_LOST
                continue
            if not is_root():
                return out + [
                    f"Unable to {verb} MIG Mode for GPU {g.bus_id}: {NO_PERMISSION}",
                    TERMINATING,
                ], RC_NO_PERMISSION
            if not g.flag("mig.supported"):
                out += [f"Unable to {verb} MIG Mode for GPU {g.bus_id}: {NOT_SUPPORTED}", WARN_MOVE_ON]
                continue
            busy = _holders(state, g)
            if not enable and g.gis():
                return out + [f"Unable to {verb} MIG Mode for GPU {g.bus_id}: {IN_USE}", TERMINATING], RC_IN_USE
            if busy:
                if g.s("architecture") == "Ampere":
                    # Ampere: the mode is stored as pending and applies at the next reset / reboot
                    state[key(g, "mig.pending")] = "1" if enable else "0"
                    out += [
                        f"Warning: MIG mode is in pending {verb} state for GPU {g.bus_id}:{IN_USE}",
                        f"{g.bus_id} is currently being used by one or more other processes (e.g. CUDA application "
                        "or a monitoring application such as another instance of nvidia-smi). Please first kill all "
                        "processes using the device and retry the command or reboot the system to make MIG mode "
                        "effective.",
                    ]
                    continue
                return out + [f"Unable to {verb} MIG Mode for GPU {g.bus_id}: {IN_USE}", TERMINATING], RC_IN_USE
            state[key(g, "mig.current")] = state[key(g, "mig.pending")] = "1" if enable else "0"
            destroy_all_instances(state, g)
            out.append(f"{word} MIG Mode for GPU {g.bus_id}")
            if not g.flag("persistence"):
                out += persistence_warning(g, version)
    return out + [ALL_DONE], rc


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
    out: list[str] = []
    busy: list[Gpu] = []
    rc = 0
    with st.locked() as state:
        for g in select(state, id_arg):
            if g.lost:
                out.append(lost_line(g))
                rc = RC_GPU_IS_LOST
                continue
            if not is_root():
                return out + [f"Unable to reset GPU {g.bus_id}: {NO_PERMISSION}", TERMINATING], RC_NO_PERMISSION
            if _holders(state, g):
                busy.append(g)
                continue
            reset_gpu_state(state, g)
            out.append(f"GPU {g.bus_id} was successfully reset.")
    if busy:
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
    out: list[str] = []
    rc = 0
    with st.locked() as state:
        for g in select(state, id_arg):
            if g.lost:
                out.append(lost_line(g))
                rc = RC_GPU_IS_LOST
                continue
            if not is_root():
                return out + [
                    f"The current user does not have permission to change clocks for GPU {g.bus_id}.",
                    TERMINATING,
                ], RC_NO_PERMISSION
            if value is None:
                state[key(g, "clocks.locked.min")] = state[key(g, "clocks.locked.max")] = "0"
                continue
            state[key(g, "clocks.locked.min")] = str(lo)
            state[key(g, "clocks.locked.max")] = str(hi)
            out.append(f'GPU clocks set to "(gpuClkMin {lo}, gpuClkMax {hi})" for GPU {g.bus_id}')
    return out + [ALL_DONE], rc


def ecc_config(id_arg: str | None, value: str) -> tuple[list[str], int]:
    enable = _bool_arg(value)
    out: list[str] = []
    rc = 0
    changed = False
    with st.locked() as state:
        for g in select(state, id_arg):
            if g.lost:
                out.append(lost_line(g))
                rc = RC_GPU_IS_LOST
                continue
            if not g.flag("ecc.supported"):
                out += [f"Unable to set the ECC mode for GPU {g.bus_id}: {NOT_SUPPORTED}", WARN_MOVE_ON]
                continue
            if not is_root():
                return out + [
                    f"Unable to set the ECC mode for GPU {g.bus_id}: {NO_PERMISSION}",
                    TERMINATING,
                ], RC_NO_PERMISSION
            if g.flag("ecc.pending") == enable:
                out.append(f"ECC support is already {'Enabled' if enable else 'Disabled'} for GPU {g.bus_id}.")
                continue
            state[key(g, "ecc.pending")] = "1" if enable else "0"
            out.append(f"{'Enabled' if enable else 'Disabled'} ECC support for GPU {g.bus_id}.")
            changed = True
    return out + [ALL_DONE] + (["Reboot required."] if changed else []), rc


COMPUTE_MODES = {
    "0": "Default", "DEFAULT": "Default",
    "2": "Prohibited", "PROHIBITED": "Prohibited",
    "3": "Exclusive_Process", "EXCLUSIVE_PROCESS": "Exclusive_Process",
}  # fmt: skip


def compute_mode(id_arg: str | None, value: str) -> tuple[list[str], int]:
    mode = COMPUTE_MODES.get(value.strip().upper())
    if mode is None:
        raise invalid_combination()
    out: list[str] = []
    rc = 0
    with st.locked() as state:
        for g in select(state, id_arg):
            if g.lost:
                out.append(lost_line(g))
                rc = RC_GPU_IS_LOST
                continue
            if not is_root():
                return out + [
                    f"Unable to set compute mode for GPU {g.bus_id}: {NO_PERMISSION}",
                    TERMINATING,
                ], RC_NO_PERMISSION
            state[key(g, "compute_mode")] = mode
            out.append(f"Set compute mode to {mode.upper()} for GPU {g.bus_id}.")
    return out + [ALL_DONE], rc
