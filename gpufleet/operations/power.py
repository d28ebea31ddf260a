"""
GPU power limits: set now where they differ, and reapplied at every boot by a oneshot systemd unit.
"""

from __future__ import annotations

import math
import shlex

from pyinfra import host, logger
from pyinfra.api import OperationValueError, StringCommand, operation

from gpufleet.facts.nvidia import GpuInventory
from gpufleet.plan import POWER_CONF, POWER_UNIT, Gpu, format_watts, parse_uuid_conf, power_conf_text, power_plan_diff

from .errors import refuse
from .gpu_settings import gpu_settings_paths, install_gpu_settings, remove_gpu_settings
from .managed_files import all_of
from .reads import get_state, read_together

CONF = POWER_CONF
UNIT = POWER_UNIT
read_together(UNIT, files=gpu_settings_paths(UNIT, CONF), contents=(CONF,))
DESCRIPTION = "gpufleet: reapply GPU power limits"
parse_conf = parse_uuid_conf
conf_text = power_conf_text


def _check_limits(limits) -> dict[str, float]:
    if not isinstance(limits, dict):
        raise OperationValueError(f"power.limits: limits must be a dict {{GPU UUID: watts}}, not {limits!r}")
    checked = {}
    for uuid, watts in limits.items():
        if not isinstance(uuid, str) or not uuid.startswith("GPU-") or any(c.isspace() or c in "=#" for c in uuid):
            raise OperationValueError(f"power.limits: {uuid!r} is not a GPU UUID (GPU-xxxxxxxx-xxxx-…)")
        if isinstance(watts, bool) or not isinstance(watts, int | float) or not math.isfinite(watts) or watts <= 0:
            raise OperationValueError(f"power.limits: {uuid}: {watts!r} is not a power limit in watts")
        checked[uuid] = round(float(watts), 2)
    return checked


@operation()
def limits(limits: dict[str, float]):
    """
    Set GPU power limits, keyed by GPU UUID, and keep them across reboots.

    + limits: ``{GPU UUID: watts}``; the GPUs must be on this host (``nvidia-smi -L`` shows their UUIDs)

    Power limits are volatile, so besides ``nvidia-smi -i <uuid> -pl <watts>`` for each GPU whose limit differs,
    the desired values go to ``/etc/gpufleet/power-limits.conf`` and the oneshot unit
    ``gpufleet-power-limits.service`` reapplies them at boot (a GPU missing then is skipped). The file is the
    record of what gpufleet manages: a GPU dropped from ``limits`` goes back to its default limit, and
    ``limits={}`` removes the unit and the file. A lost GPU or an unloaded driver leaves the value to the boot
    unit (docs/error-policy.md).

    **Example:**

    .. code:: python

        from gpufleet.operations import power

        power.limits(
            name="A100 power capped to 320 W",
            limits={"GPU-0c5ef656-7642-5c6a-a509-453b0e5cca1e": 320},
        )
    """
    wanted = _check_limits(limits)
    inventory = host.get_fact(GpuInventory)
    managed = get_state(paths=gpu_settings_paths(UNIT, CONF), read=(CONF,), units=(UNIT,))
    gpus = [Gpu.from_fact(gpu) for gpu in inventory["gpus"] if gpu.get("uuid")]
    diff = power_plan_diff(host.name, wanted, gpus, inventory.get("lost_gpus") or [],
                           parse_conf(managed["contents"][CONF]))
    if diff.problem:
        yield from refuse(f"power.limits: {diff.problem}")
        return
    if diff.warning:
        logger.warning(diff.warning)
    if not gpus and wanted:
        host.noop(f"no GPU reachable ({inventory['status']}): power limits apply at the next boot")

    # one round trip for all GPUs
    commands = all_of([_set_limit(uuid, watts) for uuid, watts in {**diff.set, **diff.reset}.items()])
    if wanted:
        commands += install_gpu_settings(managed, UNIT, DESCRIPTION, "power", CONF, conf_text(diff.file_limits),
                                         start=bool(gpus))
    else:
        commands += remove_gpu_settings(managed, UNIT, CONF)

    if not commands:
        host.noop(f"power limits already set on {len(wanted)} GPU(s), reapplied at boot by {UNIT}"
                  if wanted else "no power limits managed")
    yield from commands


# Deprecated name (before 0.2): power.power_limits
power_limits = limits


def _set_limit(uuid: str, watts: float) -> StringCommand:
    return StringCommand("nvidia-smi", "-i", shlex.quote(uuid), "-pl", shlex.quote(format_watts(watts)))
