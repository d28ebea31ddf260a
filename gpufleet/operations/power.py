"""
GPU power limits: set now where they differ, and reapplied at every boot by a oneshot systemd unit.
"""

from __future__ import annotations

import math
import shlex

from pyinfra import host
from pyinfra.api import OperationValueError, StringCommand, operation

from gpufleet.facts.nvidia import GpuInventory

from ._systemd import (
    SETTINGS_DIR,
    all_of,
    get_state,
    gpu_settings_paths,
    install_gpu_settings,
    refuse,
    remove_gpu_settings,
)

CONF = f"{SETTINGS_DIR}/power-limits.conf"
UNIT = "gpufleet-power-limits.service"
DESCRIPTION = "gpufleet: reapply GPU power limits"
# nvidia-smi prints limits with 2 decimals; NVML takes milliwatts
_TOLERANCE_W = 0.005


def format_watts(watts: float) -> str:
    """``560.0`` -> ``"560"``, ``337.5`` -> ``"337.5"`` (at most 2 decimals, as nvidia-smi prints them)."""
    return f"{watts:.2f}".rstrip("0").rstrip(".")


def parse_conf(text: str | None) -> dict[str, str]:
    """``UUID=WATTS`` lines of the values file -> {uuid: watts text} (comments and junk ignored)."""
    values = {}
    for line in (text or "").splitlines():
        uuid, sep, value = line.strip().partition("=")
        if sep and uuid and not uuid.startswith("#"):
            values[uuid] = value
    return values


def conf_text(limits: dict[str, float]) -> str:
    lines = [
        "# Managed by gpufleet (power stage), overwritten on every run.",
        f"# Power limit in watts per GPU UUID, reapplied at boot by {UNIT} (gpufleet-gpu-settings power).",
    ]
    lines += [f"{uuid}={format_watts(watts)}" for uuid, watts in sorted(limits.items())]
    return "\n".join(lines) + "\n"


def _check_limits(limits) -> dict[str, float]:
    if not isinstance(limits, dict):
        raise OperationValueError(f"power_limits: limits must be a dict {{GPU UUID: watts}}, not {limits!r}")
    checked = {}
    for uuid, watts in limits.items():
        if not isinstance(uuid, str) or not uuid.startswith("GPU-") or any(c.isspace() or c in "=#" for c in uuid):
            raise OperationValueError(f"power_limits: {uuid!r} is not a GPU UUID (GPU-xxxxxxxx-xxxx-…)")
        if isinstance(watts, bool) or not isinstance(watts, int | float) or not math.isfinite(watts) or watts <= 0:
            raise OperationValueError(f"power_limits: {uuid}: {watts!r} is not a power limit in watts")
        checked[uuid] = round(float(watts), 2)
    return checked


@operation()
def power_limits(limits: dict[str, float]):
    """
    Set GPU power limits, keyed by GPU UUID, and keep them across reboots.

    + limits: ``{GPU UUID: watts}``; the GPUs must be on this host (``nvidia-smi -L`` shows their UUIDs)

    Power limits are volatile: they are back to the default after a reboot or a driver reload. This
    operation:

    - runs ``nvidia-smi -i <uuid> -pl <watts>`` for each GPU whose current limit differs (to 0.01 W);
    - writes the desired values to ``/etc/gpufleet/power-limits.conf`` (``UUID=WATTS`` lines, sorted);
    - installs ``/usr/local/sbin/gpufleet-gpu-settings`` and the ``Type=oneshot`` ``RemainAfterExit=yes`` unit
      ``gpufleet-power-limits.service`` (``Wants=nvidia-persistenced.service``, ``After=`` persistenced,
      fabric manager and ``gpufleet-mig.service``) that reapplies the file at boot, by UUID: a GPU missing
      at boot is logged and skipped, not fatal. The unit is enabled, and started once now.

    A UUID that is not on the host, or a limit outside the GPU's min/max, is refused with an error naming
    it (before any command). When no GPU is reachable (driver installed but not loaded, reboot pending), the
    file and unit are written and the limits apply at the next boot.

    GPUs listed in the existing file but no longer in ``limits`` are set back to their default limit: the
    file is the record of what gpufleet manages. ``limits={}`` stops managing power limits: those GPUs go
    back to their default limit, the unit is stopped, disabled and removed, and the file is removed.

    **Example:**

    .. code:: python

        from gpufleet.operations import power

        power.power_limits(
            name="A100 power capped to 320 W",
            limits={"GPU-0c5ef656-7642-5c6a-a509-453b0e5cca1e": 320},
        )
    """
    limits = _check_limits(limits)
    inventory = host.get_fact(GpuInventory)
    state = get_state(paths=gpu_settings_paths(UNIT, CONF), read=(CONF,), units=(UNIT,))
    by_uuid = {gpu["uuid"]: gpu for gpu in inventory["gpus"] if gpu.get("uuid")}
    previous = parse_conf(state["contents"][CONF])
    apply: list[StringCommand] = []

    if by_uuid:
        problem = _refusal(limits, by_uuid, inventory["lost_gpus"])
        if problem:
            yield from refuse(f"power_limits: {problem}")
            return
        for uuid, watts in sorted(limits.items(), key=lambda item: by_uuid[item[0]]["index"]):
            if abs(by_uuid[uuid]["power_limit_w"] - watts) >= _TOLERANCE_W:
                apply.append(_set_limit(uuid, watts))
        # GPUs managed before and dropped from `limits`: back to their default
        for uuid in sorted(set(previous) - set(limits)):
            gpu = by_uuid.get(uuid)
            default = gpu and gpu.get("power_default_w")
            if default is not None and gpu.get("power_limit_w") is not None:
                if abs(gpu["power_limit_w"] - default) >= _TOLERANCE_W:
                    apply.append(_set_limit(uuid, default))
    elif limits:
        host.noop(f"no GPU reachable ({inventory['status']}): power limits apply at the next boot")

    commands = all_of(apply)  # one round trip for all GPUs
    if limits:
        commands += install_gpu_settings(state, UNIT, DESCRIPTION, "power", CONF, conf_text(limits),
                                         start=bool(by_uuid))
    else:
        commands += remove_gpu_settings(state, UNIT, CONF)

    if not commands:
        host.noop(f"power limits already set on {len(limits)} GPU(s), reapplied at boot by {UNIT}"
                  if limits else "no power limits managed")
    yield from commands


def _refusal(limits: dict[str, float], by_uuid: dict[str, dict], lost: list[str]) -> str | None:
    """Why ``limits`` cannot be applied to these GPUs (a UUID not on the host, no power management, a limit
    out of the GPU's range), or None."""
    missing = sorted(uuid for uuid in limits if uuid not in by_uuid)
    if missing:
        lost_text = f"; nvidia-smi reports lost GPU(s) {', '.join(lost)}" if lost else ""
        return f"GPU {', '.join(missing)} is not on {host.name} (its GPUs: {', '.join(sorted(by_uuid))}{lost_text})"
    for uuid, watts in sorted(limits.items()):
        gpu = by_uuid[uuid]
        low, high = gpu.get("power_min_w"), gpu.get("power_max_w")
        if gpu.get("power_limit_w") is None:
            return f"GPU {uuid} ({gpu['name']}) on {host.name} does not report a power limit (not supported)"
        if low is not None and high is not None and not low - _TOLERANCE_W <= watts <= high + _TOLERANCE_W:
            return (f"{format_watts(watts)} W for GPU {uuid} ({gpu['name']}) on {host.name} is outside its range "
                    f"{format_watts(low)}-{format_watts(high)} W")
    return None


def _set_limit(uuid: str, watts: float) -> StringCommand:
    return StringCommand("nvidia-smi", "-i", shlex.quote(uuid), "-pl", shlex.quote(format_watts(watts)))
