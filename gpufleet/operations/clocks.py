"""
Locked GPU clocks (``nvidia-smi -lgc``) for reproducible benchmarks, with a reset path. Optional, off by
default.
"""

from __future__ import annotations

import shlex

from pyinfra import host, logger
from pyinfra.api import OperationValueError, StringCommand, operation

from gpufleet.facts.nvidia import GpuInventory
from gpufleet.plan import CLOCKS_CONF, CLOCKS_UNIT, Gpu, clocks_conf_text, clocks_plan_diff, parse_uuid_conf

from .errors import refuse
from .gpu_settings import gpu_settings_paths, install_gpu_settings, remove_gpu_settings
from .managed_files import all_of, put_file, remove_file
from .reads import get_state, read_together

CONF = CLOCKS_CONF
UNIT = CLOCKS_UNIT
conf_text = clocks_conf_text
DESCRIPTION = "gpufleet: reapply locked GPU clocks"
# The driver has no way to read a clock lock back (no nvidia-smi field, no NVML getter): the locks gpufleet
# applied since boot are recorded here, by this operation and by gpufleet-gpu-settings. /run is a tmpfs,
# emptied at boot, when the locks are gone too.
LOCKED = "/run/gpufleet/gpu-clocks.locked"
read_together(UNIT, files=(*gpu_settings_paths(UNIT, CONF), LOCKED), contents=(LOCKED, CONF))


def _check_lock(lock_mhz) -> tuple[int, int] | None:
    if lock_mhz is None:
        return None
    if (
        not isinstance(lock_mhz, tuple | list)
        or len(lock_mhz) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in lock_mhz)
    ):
        raise OperationValueError(f"clocks.locked: lock_mhz must be (min MHz, max MHz) integers, not {lock_mhz!r}")
    low, high = lock_mhz
    if not 0 < low <= high:
        raise OperationValueError(f"clocks.locked: lock_mhz {low},{high}: need 0 < min <= max")
    return low, high


def locked_text(locks: dict[str, str]) -> str:
    return "".join(f"{uuid}={value}\n" for uuid, value in sorted(locks.items()))


@operation()
def locked(lock_mhz: tuple[int, int] | None):
    """
    Lock the GPU clocks of every GPU of the host to a range, or reset them.

    + lock_mhz: ``(min MHz, max MHz)`` for ``nvidia-smi -lgc MIN,MAX``; ``None``: reset (``nvidia-smi -rgc``)

    Locked clocks make benchmarks reproducible (no boost variation). With a range, each GPU not already
    locked at it gets ``nvidia-smi -i <uuid> -lgc MIN,MAX``; the range is written by GPU UUID to
    ``/etc/gpufleet/gpu-clocks.conf`` and reapplied at boot by ``gpufleet-gpu-clocks.service`` (oneshot,
    ordered like ``gpufleet-power-limits.service``). With ``None``, the GPUs gpufleet locked are reset with
    ``nvidia-smi -i <uuid> -rgc`` and the file and unit are removed.

    The driver offers no way to read a clock lock back, so what is locked is what gpufleet recorded in
    ``/run/gpufleet/gpu-clocks.locked`` when it locked them (emptied at boot, like the locks): a lock set or
    reset by hand, or dropped by a GPU reset, is not seen (``systemctl restart gpufleet-gpu-clocks`` locks
    again). The driver clamps the range to what the GPU supports.

    **Example:**

    .. code:: python

        from gpufleet.operations import clocks

        clocks.locked(name="Clocks locked for benchmarks", lock_mhz=(1755, 1755))
        clocks.locked(name="Clocks back to default", lock_mhz=None)
    """
    lock = _check_lock(lock_mhz)
    inventory = host.get_fact(GpuInventory)
    state = get_state(paths=(*gpu_settings_paths(UNIT, CONF), LOCKED), read=(LOCKED, CONF), units=(UNIT,))
    present = {gpu["uuid"]: gpu for gpu in inventory["gpus"] if gpu.get("uuid")}
    applied = parse_uuid_conf(state["contents"][LOCKED])
    commands: list = []

    if lock is not None:
        diff = clocks_plan_diff(host.name, lock, map(Gpu.from_fact, present.values()),
                                inventory.get("lost_gpus") or [], applied, parse_uuid_conf(state["contents"][CONF]))
        if diff.problem:
            yield from refuse(f"clocks.locked: {diff.problem}")
            return
        if diff.warning:
            logger.warning(diff.warning)
        commands += all_of([StringCommand("nvidia-smi", "-i", shlex.quote(uuid), "-lgc", shlex.quote(value))
                            for uuid, value in diff.lock.items()])
        if not present:
            # the file is keyed by UUID: without the GPUs' UUIDs there is nothing to write yet
            host.noop(f"no GPU reachable ({inventory['status']}): clocks are locked by the next run")
        else:
            if applied != diff.desired:
                commands += put_file(state["files"][LOCKED], LOCKED, locked_text(diff.desired))
            # the host's GPUs by UUID (a GPU replaced later is locked by the next run)
            commands += install_gpu_settings(state, UNIT, DESCRIPTION, "clocks", CONF, conf_text(diff.file_locks),
                                             start=True)
    else:
        commands += all_of([
            StringCommand("nvidia-smi", "-i", shlex.quote(uuid), "-rgc") for uuid in sorted(applied) if uuid in present
        ])
        commands += remove_file(state["files"][LOCKED], LOCKED)
        commands += remove_gpu_settings(state, UNIT, CONF)

    if not commands and (present or lock is None):
        host.noop(f"clocks locked at {lock[0]},{lock[1]} MHz on {len(present)} GPU(s)" if lock
                  else "no GPU clocks locked by gpufleet")
    yield from commands


# Deprecated name (before 0.2): clocks.gpu_clocks
gpu_clocks = locked
