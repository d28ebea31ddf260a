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
  a multiset of profile ids; both :func:`mig_differences`, the comparison the node-side applier, the exporter and
  verify share), and the boot file :func:`mig_layout_doc`;
* clocks: the lock range against the GPU's maximum SM clock, and the boot file :func:`clocks_conf_text`;
* driver: the kernel module flavour by GPU (:func:`choose_kernel_flavour`), the package naming by OS
  (:func:`packages_style_for`), DKMS, whether a loaded driver is of the branch (:func:`driver_on_branch`);
* persistence: the mode nvidia-persistenced runs with and which GPUs are not in it (:class:`PersistencePlan`);
* exporters: DCGM or gpufleet's NVML exporter (:func:`choose_gpu_exporter`), profiling and DCGM's proprietary
  package by GPU generation (:class:`ExportersPlan`); which DCGM fields a dcgm-exporter release knows
  (``dcgm_counters``: its counters file holds only those);
* the stage order (:data:`STAGE_ORDER`).

The operations take plain arguments (``limits={uuid: watts}``, ``layout={index: ...}``, ``lock_mhz``) so that
they can be called from any deploy or the pyinfra CLI; they build the same records from their facts
(:meth:`Gpu.from_fact`) and decide with the same functions. A desired value of a GPU that is lost now (fallen
off the bus) is kept in the boot files (:func:`missing_gpu_warning`, :func:`kept_mig_entries`).

One module per part: ``gpu`` (the GPU, whoever saw it), ``problems``, ``power``, ``mig`` (with the comparison
shared with the node, ``gpufleet/node/mig_compare.py``), ``clocks``, ``driver``, ``persistence``, ``nccl``,
``exporters``, ``dcgm_counters``, ``stages`` (the order the stages run in), ``files`` (the boot files and units),
``node`` (:class:`NodePlan`, all of them). What an operation does is ONE call into its part: :func:`mig_diff`,
:func:`power_plan_diff`, :func:`clocks_plan_diff`, :meth:`PersistencePlan.diff`; verify renders the same comparisons
against the probe (and :meth:`NcclPlan.diff` for ``/etc/nccl.conf``).

Lower layer than operations and verify: imports config, catalog and the node-side comparison only (no pyinfra).
"""

from __future__ import annotations

from .architecture import LAST_BRANCH, branch_supported
from .clocks import ClocksDiff, ClocksPlan, clocks_conf_text, clocks_plan_diff
from .driver import (
    OPEN_ONLY_ARCHITECTURES,
    PRE_TURING_ARCHITECTURES,
    DriverPlan,
    choose_kernel_flavour,
    driver_on_branch,
    kernel_flavour_of,
    packages_style_for,
    required_kernel_flavour,
)
from .exporters import PROFILING_PACKAGE_UP_TO, ExportersPlan, choose_gpu_exporter
from .files import (
    CLOCKS_CONF,
    CLOCKS_UNIT,
    MIG_APPLIER,
    MIG_COMPARE,
    MIG_LAYOUT,
    MIG_UNIT,
    POWER_CONF,
    POWER_UNIT,
    SETTINGS_DIR,
)
from .gpu import Gpu, catalog_model, gpu_label, gpus_from_facts, gpus_from_probe
from .mig import (
    MigDiff,
    MigIssue,
    MigPlan,
    MigTarget,
    creation_order,
    kept_mig_entries,
    mig_diff,
    mig_differences,
    mig_fit,
    mig_instances_ok,
    mig_layout_doc,
    mig_mode_ok,
    mig_target,
)
from .nccl import NcclDiff, NcclPlan
from .node import NodePlan
from .persistence import PERSISTENCED, PersistencePlan
from .power import (
    ABSENT_KEPT,
    ABSENT_REFUSED,
    ABSENT_UNKNOWN,
    POWER_TOLERANCE_W,
    PowerDiff,
    PowerPlan,
    PowerTarget,
    absent_uuids,
    format_watts,
    outside_range,
    parse_uuid_conf,
    power_conf_text,
    power_diff,
    power_differs,
    power_limit_for,
    power_plan_diff,
    power_refusal,
)
from .problems import Problem, Problems, Shown, missing_gpu_warning
from .stages import GPU_STAGES, STAGE_ORDER, stage_order

__all__ = [
    "ABSENT_KEPT",
    "ABSENT_REFUSED",
    "ABSENT_UNKNOWN",
    "CLOCKS_CONF",
    "CLOCKS_UNIT",
    "ClocksDiff",
    "ClocksPlan",
    "DriverPlan",
    "ExportersPlan",
    "GPU_STAGES",
    "Gpu",
    "MIG_APPLIER",
    "MIG_COMPARE",
    "MIG_LAYOUT",
    "MIG_UNIT",
    "MigDiff",
    "MigIssue",
    "MigPlan",
    "MigTarget",
    "NcclDiff",
    "NcclPlan",
    "NodePlan",
    "OPEN_ONLY_ARCHITECTURES",
    "LAST_BRANCH",
    "PERSISTENCED",
    "POWER_CONF",
    "POWER_TOLERANCE_W",
    "POWER_UNIT",
    "PRE_TURING_ARCHITECTURES",
    "PROFILING_PACKAGE_UP_TO",
    "PersistencePlan",
    "PowerDiff",
    "PowerPlan",
    "PowerTarget",
    "Problem",
    "Problems",
    "SETTINGS_DIR",
    "STAGE_ORDER",
    "Shown",
    "absent_uuids",
    "catalog_model",
    "choose_gpu_exporter",
    "choose_kernel_flavour",
    "kernel_flavour_of",
    "branch_supported",
    "clocks_conf_text",
    "clocks_plan_diff",
    "creation_order",
    "driver_on_branch",
    "format_watts",
    "gpu_label",
    "gpus_from_facts",
    "gpus_from_probe",
    "kept_mig_entries",
    "mig_diff",
    "mig_differences",
    "mig_fit",
    "mig_instances_ok",
    "mig_layout_doc",
    "mig_mode_ok",
    "mig_target",
    "missing_gpu_warning",
    "outside_range",
    "packages_style_for",
    "parse_uuid_conf",
    "power_conf_text",
    "power_diff",
    "power_differs",
    "power_limit_for",
    "power_plan_diff",
    "power_refusal",
    "required_kernel_flavour",
    "stage_order",
]
