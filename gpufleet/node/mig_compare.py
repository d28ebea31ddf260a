"""Is this MIG layout applied to this GPU? The one comparison of gpufleet (DESIGN.md §3: one decision, one place).

The MIG operation, the node-side applier, the NVML exporter and verify each read the GPU their own way (nvidia-smi,
NVML, the probe's JSON) and hand the same observations to :func:`differences`:

* ``enabled``/``create``: the layout (MIG mode wanted; GPU-instance profile ids, compared as a multiset);
* ``present``: whether the GPU is there at all;
* ``current``/``pending``: MIG mode now and after a reset (``None``: not reported; a ``current`` of ``None``
  means no MIG, which counts as disabled);
* ``instances``: ``(GPU-instance profile id, whole)`` per GPU instance, ``whole`` when one compute instance spans it.

Node-side: Python 3.7+ standard library, no import of gpufleet.
"""

from __future__ import annotations

# What is not as the layout says, in the order they are found (the callers choose the remedy or the verdict):
ABSENT = "absent"  # the GPU is not there
NO_MIG = "no_mig"  # MIG wanted on a GPU without MIG
MODE = "mode"  # MIG mode now is not the wanted one
PENDING = "pending"  # the mode now is right, but another one is pending (a reset would change it)
INSTANCES = "instances"  # the GPU instances are not the layout's profiles (missing, extra or other ones)
COMPUTE = "compute"  # a GPU instance without exactly one compute instance spanning it
MODE_DIFFERENCES = (ABSENT, NO_MIG, MODE, PENDING)
INSTANCE_DIFFERENCES = (INSTANCES, COMPUTE)


def mode_of(value):
    """A MIG mode as a bool: nvidia-smi's ``Enabled``/``Disabled``, NVML's 1/0, the probe's booleans; ``None`` when
    not reported (``[N/A]``, ``N/A``, None)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value == 1 if value in (0, 1) else None
    return {"enabled": True, "disabled": False, "1": True, "0": False}.get(str(value).strip().lower())


def norm_bus(bus_id) -> str:
    """``0000:18:00.0`` / ``00000000:18:00.0`` / lower case -> ``00000000:18:00.0``, as nvidia-smi and NVML print a
    PCI bus id (the layout file keys GPUs by it)."""
    text = str(bus_id or "").strip().upper()
    domain, sep, rest = text.partition(":")
    return f"{domain.zfill(8)}:{rest}" if sep and rest.count(":") == 1 else text


def mode_differences(enabled: bool, present: bool = True, current=None, pending=None) -> list:
    """Why the GPU is not in the wanted MIG mode, now and after a reset ([]: it is)."""
    if not present:
        return [ABSENT]
    if current is None:  # no MIG on this GPU: "disabled" is what it always is
        return [NO_MIG] if enabled else []
    if current != enabled:
        return [MODE]
    if pending is not None and pending != enabled:
        return [PENDING]
    return []


def instance_differences(create, instances) -> list:
    """Why the GPU instances ``instances`` ((profile id, whole) each) are not exactly ``create`` (profile ids, a
    multiset; names where the profile ids are unknown) each with one compute instance spanning it ([]: they are)."""
    instances = list(instances)
    if sorted(pid for pid, _whole in instances) != sorted(create):
        return [INSTANCES]
    if not all(whole for _pid, whole in instances):
        return [COMPUTE]
    return []


def differences(enabled: bool, create=(), present: bool = True, current=None, pending=None, instances=()) -> list:
    """Everything that is not as the layout says on one GPU ([]: the layout is applied). Instances count only on a
    GPU whose MIG is on and wanted on."""
    found = mode_differences(enabled, present, current, pending)
    if enabled and present and current:
        found += instance_differences(create or (), instances or ())
    return found


def applied(enabled: bool, create=(), present: bool = True, current=None, pending=None, instances=()) -> bool:
    """Whether the layout is applied on this GPU (:func:`differences` finds nothing)."""
    return not differences(enabled, create, present, current, pending, instances)
