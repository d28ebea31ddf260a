"""
MIG (Multi-Instance GPU): MIG mode per GPU and the GPU/compute instances on it, kept across reboots.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Mapping, Sequence

from pyinfra import host, logger, state
from pyinfra.api import OperationValueError, StringCommand, operation
from pyinfra.operations import server

from gpufleet.facts.mig import MigState, instances_by_gpu
from gpufleet.facts.nvidia import GpuInventory
from gpufleet.facts.systemd import UNIT_RE
from gpufleet.plan import MIG_APPLIER, MIG_COMPARE, MIG_LAYOUT, MIG_UNIT, Gpu, MigTarget, mig_diff, mig_layout_doc

from .errors import fail, refuse
from .exporters import DCGM_EXPORTER_UNIT, DCGM_UNIT, NVML_UNIT
from .lock import node_lock_command
from .managed_files import all_of, node_script, put_file, render
from .reads import get_state, read_together
from .units import UNIT_DIR, is_running, systemctl

LAYOUT_PATH = MIG_LAYOUT
APPLIER = MIG_APPLIER
# The boot unit applies the layout under the host lock, so a converge arriving while it runs is refused naming it
# (and the boot apply waits for a run that holds the lock). A script, not an ExecStart= shell line: the lock's sh
# program would need systemd's own escaping of $, % and backslashes.
LOCKED_APPLIER = APPLIER + "-locked"
UNIT = MIG_UNIT
UNIT_PATH = posixpath.join(UNIT_DIR, UNIT)
# Written by the node script: GPUs whose MIG mode could not change now (INDEX<TAB>BUS ID<TAB>REASON lines)
STATUS_PATH = "/run/gpufleet/mig-reboot-required"
# Services that keep GPUs open, in the order they are stopped (they are started again in reverse order):
# consumers first (exporters, DCGM's nv-hostengine), then the driver's daemons. Absent ones are skipped.
DEFAULT_HOLDER_SERVICES = (
    NVML_UNIT,
    DCGM_EXPORTER_UNIT,
    DCGM_UNIT,
    "dcgm.service",  # the Alias= of DCGM's packaged nvidia-dcgm.service: the same unit by its other name
    "nvidia-fabricmanager.service",
    "nvidia-persistenced.service",
)
# The applier imports the shared "is this layout applied" comparison from beside itself or from here
COMPARE_PATH = MIG_COMPARE
read_together(UNIT, *DEFAULT_HOLDER_SERVICES, files=(LAYOUT_PATH, APPLIER, COMPARE_PATH, LOCKED_APPLIER, UNIT_PATH),
              contents=(LAYOUT_PATH, STATUS_PATH))
# The boot unit runs once the driver's daemons are up, and before what reads MIG devices or GPU settings.
UNIT_AFTER = ("systemd-modules-load.service", "nvidia-persistenced.service", "nvidia-fabricmanager.service")
UNIT_BEFORE = ("gpufleet-power-limits.service", "gpufleet-gpu-clocks.service", DCGM_UNIT, DCGM_EXPORTER_UNIT,
               NVML_UNIT)

_MODES = {True: "Enabled", False: "Disabled"}


def _check_layout(layout) -> dict[int, dict[str, int] | None]:
    if not isinstance(layout, Mapping):
        raise OperationValueError(f"mig.layout: layout must be a dict {{GPU index: {{profile: count}} or None}}, "
                                  f"not {layout!r}")
    checked: dict[int, dict[str, int] | None] = {}
    for key, want in layout.items():
        # from the pyinfra CLI (layout='{"0": {"1g.10gb": 7}}') the indices arrive as JSON strings
        index = int(key) if isinstance(key, str) and key.strip().isdigit() else key
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise OperationValueError(f"mig.layout: {key!r} is not a GPU index (0, 1, ...)")
        if index in checked:
            raise OperationValueError(f"mig.layout: GPU {index} is listed twice")
        if want is None:
            checked[index] = None
            continue
        if not isinstance(want, Mapping):
            raise OperationValueError(f"mig.layout: GPU {index}: {want!r} is neither None (MIG disabled) nor a "
                                      '{profile: count} dict such as {"1g.10gb": 7}')
        counts: dict[str, int] = {}
        for profile, count in want.items():
            if not isinstance(profile, str) or not profile.strip():
                raise OperationValueError(f"mig.layout: GPU {index}: {profile!r} is not a MIG profile name")
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise OperationValueError(f"mig.layout: GPU {index}: {profile}: {count!r} is not an instance count")
            if count:
                counts[profile.strip()] = count
        checked[index] = counts
    return checked


def _check_units(units) -> tuple[str, ...]:
    if isinstance(units, str) or not isinstance(units, Sequence):
        raise OperationValueError(f"mig.layout: holder_services must be a list of systemd units, not {units!r}")
    checked = []
    for unit in units:
        name = unit if isinstance(unit, str) and "." in unit else f"{unit}.service"
        if not isinstance(unit, str) or not UNIT_RE.match(name):
            raise OperationValueError(f"mig.layout: holder_services: {unit!r} is not a systemd unit name")
        if name not in checked:
            checked.append(name)
    return tuple(checked)


def layout_text(targets: list[MigTarget], holders: Sequence[str], kept: Sequence[dict] = ()) -> str:
    """The layout file read at boot by ``gpufleet-mig-apply apply`` (JSON, stable key order)."""
    return json.dumps(mig_layout_doc(targets, holders, kept), indent=2, sort_keys=True) + "\n"


def unit_text() -> str:
    argv = (LOCKED_APPLIER, APPLIER, "apply", LAYOUT_PATH)
    return render("systemd/gpufleet-mig.service.j2", unit=UNIT, layout=LAYOUT_PATH, after=UNIT_AFTER,
                  before=UNIT_BEFORE, exec_start=" ".join(shlex.quote(a) for a in argv))


def locked_applier_text() -> str:
    """``gpufleet-mig-apply-locked COMMAND...``: COMMAND under the host lock, holder ``gpufleet-mig.service``."""
    program = node_lock_command([], f"{UNIT} (boot)")[2]
    return f"#!/bin/sh\n# gpufleet: the boot-time MIG apply under the host lock (gpufleet.operations.lock)\n{program}\n"


def mode_command(targets: list[MigTarget], holders: Sequence[str]) -> StringCommand:
    args = [APPLIER, "mode"]
    for unit in holders:
        args += ["--holder", unit]
    args += [f"{t.gpu.index}={'enabled' if t.enabled else 'disabled'}" for t in targets]
    return StringCommand(*(shlex.quote(a) for a in args))


def whole_instances(existing: dict[int, dict]) -> list[tuple[int, bool]]:
    """(profile id, holds exactly one full compute instance) of each GPU instance of one GPU (``MigState``)."""
    return [(gi["profile_id"], len(gi["compute_instances"]) == 1
             and gi["compute_instances"][0]["profile"] == gi["profile"]) for gi in existing.values()]


def instance_commands(plan: MigTarget, existing: dict[int, dict]) -> list[StringCommand]:
    """Commands that make the GPU's instances exactly ``plan.profiles`` (each with its full default compute
    instance): destroy what is there, create the layout. Called for a GPU whose instances differ."""
    index = shlex.quote(str(plan.gpu.index))
    commands = []
    if existing:
        # Never destroy instances that processes run in: refuse (the op fails) rather than half-apply.
        message = shlex.quote(f"gpufleet: {plan.gpu.label}: processes run on it (above): its MIG instances were not "
                              "changed; stop them and run again")
        commands.append(StringCommand(
            f"if nvidia-smi -i {index} --query-compute-apps=pid,process_name --format=csv,noheader | grep ,; "
            f"then echo {message} >&2; exit 1; fi"))
        if any(gi["compute_instances"] for gi in existing.values()):
            commands.append(StringCommand("nvidia-smi", "mig", "-i", index, "-dci"))
        commands.append(StringCommand("nvidia-smi", "mig", "-i", index, "-dgi"))
    if plan.profiles:
        ids = shlex.quote(",".join(str(p.id) for p in plan.profiles))
        commands.append(StringCommand("nvidia-smi", "mig", "-i", index, "-cgi", ids, "-C"))
    return commands


def _parse_status(text: str | None) -> dict[int, str]:
    reasons = {}
    for line in (text or "").splitlines():
        index, _bus, why = (line.split("\t", 2) + ["", ""])[:3]
        if index.strip().isdigit():
            reasons[int(index)] = why.strip()
    return reasons


def _warn(message: str) -> None:
    prefix = getattr(host, "print_prefix", f"[{host.name}] ")
    logger.warning(f"{prefix}{message}")


@operation()
def layout(
    layout: Mapping[int, Mapping[str, int] | None],
    allow_reboot: bool = False,
    holder_services: Sequence[str] = DEFAULT_HOLDER_SERVICES,
):
    """
    Set MIG mode and exactly the MIG instances of each GPU in ``layout``, now and at every boot.

    + layout: ``{GPU index: {profile: count}}`` for MIG enabled with exactly those GPU instances (each with one
      compute instance spanning it), ``{GPU index: None}`` for MIG disabled; profiles as ``nvidia-smi mig -lgip``
      names them (``"1g.10gb"``). GPUs not in ``layout`` are left alone; indices may be strings (pyinfra CLI).
    + allow_reboot: reboot the host when a GPU's MIG mode can only change at a reboot
    + holder_services: systemd units that keep GPUs open, stopped while a MIG mode changes and started again
      (exporters, DCGM, fabric manager, nvidia-persistenced by default)

    The layout is checked as preflight checks it, kept by PCI bus id in ``/etc/gpufleet/mig-layout.json`` and
    reapplied at boot by ``gpufleet-mig.service``; a mode that cannot change without a reboot is reported, not
    half-applied. Matching GPUs are not touched. docs/converging.md describes the steps.

    **Example:**

    .. code:: python

        from gpufleet.operations import mig

        mig.layout(
            name="MIG: GPU 0 split in seven, GPU 1 mixed, GPU 2 whole",
            layout={
                0: {"1g.10gb": 7},
                1: {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2},
                2: None,
            },
        )
    """
    wanted = _check_layout(layout)
    holders = _check_units(holder_services)
    if not wanted:
        host.noop("no GPU in the MIG layout")
        return

    inventory = host.get_fact(GpuInventory)
    if inventory.get("status") != "ok" or not inventory.get("gpus"):
        message = (f"MIG layout not applied: nvidia-smi cannot list the GPUs ({inventory.get('status')}: "
                   f"{inventory.get('error')})")
        host.noop(message)
        if state.is_executing:  # not while only checking for changes: an earlier operation may load the driver
            _warn(message)
        return
    gpus = _gpus(inventory)
    lost = inventory.get("lost_gpus") or []
    managed = get_state(paths=(LAYOUT_PATH, APPLIER, COMPARE_PATH, LOCKED_APPLIER, UNIT_PATH), read=(LAYOUT_PATH,),
                        units=(UNIT, *holders))
    diff = mig_diff(host.name, wanted, gpus, lost, managed["contents"][LAYOUT_PATH])
    if diff.problem:
        yield from refuse(f"mig.layout: {diff.problem}")
        return
    plans = list(diff.targets)
    changed = False
    if diff.warning:
        _warn(diff.warning)

    # 1. The layout, the node script and the boot unit, before any change to a GPU.
    files = managed["files"]
    commands = list(put_file(files[LAYOUT_PATH], LAYOUT_PATH, layout_text(plans, holders, diff.kept)))
    commands += put_file(files[APPLIER], APPLIER, node_script("mig_apply.py"), "755")
    commands += put_file(files[COMPARE_PATH], COMPARE_PATH, node_script("mig_compare.py"))
    commands += put_file(files[LOCKED_APPLIER], LOCKED_APPLIER, locked_applier_text(), "755")
    unit_commands = list(put_file(files[UNIT_PATH], UNIT_PATH, unit_text()))
    commands += unit_commands
    unit = managed["units"][UNIT]
    reload = [systemctl("daemon-reload")] if unit_commands or unit["need_daemon_reload"] else []
    commands += all_of(reload + ([systemctl("enable", UNIT)] if unit["unit_file_state"] != "enabled" else []))
    if commands:
        changed = True
        yield from commands

    # 2. MIG mode, where it differs.
    reasons: dict[int, str] = {}
    targets = diff.mode_changes(gpus)
    if targets:
        changed = True
        running = [u for u in holders if is_running(managed["units"][u])]
        yield mode_command(targets, running)
        # Evaluated when the command above has run: what the GPUs say now.
        gpus = _gpus(host.get_fact(GpuInventory))
        reasons = _parse_status(get_state(read=(STATUS_PATH,))["contents"][STATUS_PATH])
    blocked = diff.mode_changes(gpus)

    # 3. A mode that only a reboot can change.
    if blocked and allow_reboot:
        _warn("rebooting to change the MIG mode of " + ", ".join(plan.gpu.label for plan in blocked))
        yield from server.reboot._inner()
        gpus = _gpus(host.get_fact(GpuInventory))
        still = [plan for plan in diff.mode_changes(gpus) if plan in blocked]
        if still:  # a host-state problem: this host fails, the others go on
            yield fail(f"mig.layout: {host.name}: MIG mode still wrong after a reboot on " + "; ".join(
                f"{plan.gpu.label}: {_mode_text(gpus.get(plan.gpu.index), 'current')}, wanted "
                f"{_MODES[plan.enabled]}" for plan in still))
            return
        blocked = []
    for plan in blocked:
        now = gpus.get(plan.gpu.index)
        why = reasons.get(plan.gpu.index) or "the GPU could not be reset"
        _warn(f"{plan.gpu.label}: MIG mode is {_mode_text(now, 'current')} (pending {_mode_text(now, 'pending')}), "
              "the layout "
              f"needs {_MODES[plan.enabled]}: {why}. Reboot required: its MIG instances were left alone; "
              f"{UNIT} applies the layout at boot (or run with allow_reboot=True).")

    # 4. Instances, on the GPUs in the wanted mode: one remote command, stopping at the first failure.
    ready = [plan for plan in plans if plan.enabled and plan not in blocked]
    if ready:
        mig_state = host.get_fact(MigState)
        if mig_state.get("status") not in ("ok", "not_enabled"):
            yield fail(f"mig.layout: {host.name}: nvidia-smi cannot list the MIG instances ({mig_state.get('status')}: "
                       f"{mig_state.get('error')})")
            return
        existing = instances_by_gpu(mig_state)
        observed = {index: whole_instances(gis) for index, gis in existing.items()}
        commands = [c for plan in diff.instance_changes(ready, observed)
                    for c in instance_commands(plan, existing.get(plan.gpu.index, {}))]
        if commands:
            changed = True
            yield from all_of(commands)

    if not changed:
        host.noop(f"MIG layout already applied on {len(plans)} GPU(s), reapplied at boot by {UNIT}")


# Deprecated name (before 0.2): mig.mig_layout
mig_layout = layout


def _gpus(inventory: Mapping) -> dict[int, Gpu]:
    return {gpu.index: gpu for gpu in map(Gpu.from_fact, inventory.get("gpus") or [])}


def _mode_text(gpu: Gpu | None, which: str) -> str | None:
    """The MIG mode as nvidia-smi prints it (``Enabled``/``Disabled``), None when not reported."""
    value = None if gpu is None else getattr(gpu, f"mig_{which}")
    return None if value is None else _MODES[value]
