"""Checks: a probe document (+ its benchmarks, + kernel-log Xid lines) against the expected state and thresholds.

Control side. ``evaluate()`` returns the CheckResults of one host; ``evaluate_host()`` wraps them in a HostResult
with the per-GPU summary the reports draw; ``build_fleet_result()`` adds the fleet-relative outlier checks.

Check ids (stable: JUnit test names and the Prometheus ``check`` label):

host.reachable, host.probe,
config.driver_branch, config.persistence, config.power_limit, config.mig, config.nccl, config.service.<unit>,
health.gpu_count, health.gpu_model, health.gpu_status, health.temperature, health.clock_events, health.ecc,
health.row_remap, health.pcie, health.nvlink, health.recovery_action, health.xid, health.services,
perf.bench, perf.matmul.<precision>, perf.memory_bandwidth, perf.host_transfer, perf.clock_events_during_run,
perf.nccl_all_reduce, perf.dcgm_diag,
fleet.gpu_outlier, fleet.node_outlier.

Every verdict names the host and, for GPU checks, the GPU index and UUID; every non-pass carries a one-line
remediation hint.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.catalog import Catalog, GpuModel, UnknownGpuModel, UnknownMigProfile, load_catalog
from gpufleet.node import mig_compare
from gpufleet.plan import (
    Gpu,
    NcclPlan,
    PersistencePlan,
    driver_on_branch,
    mig_differences,
    outside_range,
    power_differs,
)

from .exporter_checks import check_exporters
from .model import FAIL, PASS, SKIP, UNREACHABLE, WARN, CheckResult, FleetResult, HostResult, worst_verdict
from .recovery import recovery_action
from .thresholds import TemperatureLimits, Thresholds, default_thresholds
from .xid import XidEvent, parse_xid_lines

SUPPORTED_PROBE_SCHEMA_VERSION = 1
BENCH_PRECISIONS = ("bf16", "fp16", "tf32", "fp32", "fp8")


@dataclass(frozen=True)
class ExpectedState:
    """What the node should look like (from the same validated config the deploy uses; ``None`` = not checked).

    ``driver_branch``: e.g. ``"570"`` (the loaded driver's version must be ``570.*``).
    ``persistence``: persistence mode of every GPU. ``power_limits_w``: GPU UUID -> watts;
    ``power_limit_w_all``: watts for GPUs without a UUID entry.
    ``mig``: GPU index -> {profile name: count} (MIG enabled with exactly these GPU instances; ``{}`` = enabled,
    no instances) or ``None`` (MIG disabled) — the layout convention of gpufleet.operations.mig; GPUs not listed
    are not checked; ``mig=None`` checks no GPU.
    ``nccl``: the KEY=VALUE pairs /etc/nccl.conf must hold ({} = no file expected).
    ``gpu_count`` / ``gpu_model`` (catalog key or nvidia-smi name). ``services``: unit -> "active" | "inactive".
    """

    driver_branch: str | None = None
    persistence: bool | None = True
    power_limits_w: Mapping[str, float] = field(default_factory=dict)
    power_limit_w_all: float | None = None
    mig: Mapping[int, Mapping[str, int] | None] | None = None
    nccl: Mapping[str, str] | None = None
    gpu_count: int | None = None
    gpu_model: str | None = None
    services: Mapping[str, str] = field(default_factory=dict)
    exporters: Mapping[str, Any] | None = None  # gpufleet.verify.exporter_checks.expected_exporters

    def power_limit_for(self, uuid: str | None) -> float | None:
        if uuid and uuid in self.power_limits_w:
            return float(self.power_limits_w[uuid])
        return None if self.power_limit_w_all is None else float(self.power_limit_w_all)


_NVML_ERROR_HINTS = {
    "driver_not_loaded": "load the NVIDIA kernel module (modprobe nvidia) or reboot; rerun the gpu_node deploy if "
                         "the driver is missing",
    "lib_rm_version_mismatch": "the loaded kernel module and the installed driver differ: reboot to load the "
                               "installed driver",
    "library_not_found": "libnvidia-ml.so.1 not found: install the NVIDIA driver with the gpu_node deploy",
    "pynvml_not_installed": "verify ships pynvml.py with its probe: check that the node's python3 runs and its "
                            "temporary directory is writable",
    "no_permission": "run the probe as a user allowed to open /dev/nvidia*",
}


class _Ctx:
    def __init__(self, host: str, thresholds: Thresholds, catalog: Catalog):
        self.host = host
        self.thr = thresholds
        self.catalog = catalog
        self.checks: list[CheckResult] = []

    def add(self, check: str, verdict: str, message: str, remediation: str = "", gpu: dict[str, Any] | None = None,
            observed: Any = None, expected: Any = None) -> CheckResult:
        result = CheckResult(check=check, verdict=verdict, host=self.host, message=message,
                             remediation="" if verdict == PASS else remediation,
                             gpu_index=gpu.get("index") if gpu else None, gpu_uuid=gpu.get("uuid") if gpu else None,
                             observed=observed, expected=expected)
        self.checks.append(result)
        return result

    def model(self, name: str | None) -> GpuModel | None:
        if not name:
            return None
        try:
            return self.catalog.by_name(name)
        except UnknownGpuModel:
            return None


def _err(gpu: dict[str, Any], key: str) -> str:
    status = (gpu.get("errors") or {}).get(key)
    return f" ({status})" if status else ""


# ----------------------------------------------------------------------------------------------------------------
# Host-level: probe, driver, count, model, services, nccl
# ----------------------------------------------------------------------------------------------------------------


def _check_probe(ctx: _Ctx, probe: dict[str, Any]) -> bool:
    """host.probe; returns True when NVML data is there to check."""
    version = probe.get("schema_version")
    if probe.get("schema") != "gpufleet.probe" or not isinstance(version, int):
        ctx.add("host.probe", FAIL, "the node's answer is not a gpufleet probe document",
                "rerun gpufleet verify (it uploads the probe on every run), the same gpufleet version on both sides")
        return False
    if version > SUPPORTED_PROBE_SCHEMA_VERSION:
        ctx.add("host.probe", FAIL, f"probe schema_version {version} is newer than this gpufleet reads "
                f"({SUPPORTED_PROBE_SCHEMA_VERSION})", "upgrade gpufleet on the control machine")
        return False
    error = probe.get("nvml_error")
    if error:
        message = probe.get("nvml_error_message") or error
        ctx.add("host.probe", FAIL, f"NVML could not be initialised: {error} ({message})",
                _NVML_ERROR_HINTS.get(error, "check the NVIDIA driver on the node (nvidia-smi)"), observed=error)
        return False
    ctx.add("host.probe", PASS, f"driver {probe.get('driver_version')}, CUDA {probe.get('cuda_driver_version')}, "
            f"{probe.get('gpu_count')} GPU(s), probe took {probe.get('duration_s')} s",
            observed=probe.get("driver_version"))
    return True


def _check_driver(ctx: _Ctx, probe: dict[str, Any], expected: ExpectedState, nvml_ok: bool) -> None:
    if expected.driver_branch is None:
        return
    branch = str(expected.driver_branch)
    if not nvml_ok:
        ctx.add("config.driver_branch", SKIP, "driver version unknown: NVML unavailable", expected=branch)
        return
    version = probe.get("driver_version") or ""
    if driver_on_branch(version, branch):  # the plan's comparison
        ctx.add("config.driver_branch", PASS, f"driver {version} is on branch {branch}", observed=version,
                expected=branch)
    else:
        ctx.add("config.driver_branch", FAIL, f"driver {version or 'unknown'} is not on branch {branch}",
                f"run the gpu_node deploy to install driver branch {branch}, then reboot", observed=version,
                expected=branch)


def _check_count_and_model(ctx: _Ctx, probe: dict[str, Any], expected: ExpectedState) -> None:
    gpus = probe.get("gpus") or []
    usable = [g for g in gpus if g.get("status") == "ok"]
    bad = [g for g in gpus if g.get("status") != "ok"]
    want = expected.gpu_count if expected.gpu_count is not None else len(gpus)
    detail = ", ".join(f"gpu{g['index']} {g.get('status')}" for g in bad)
    if len(usable) == want and not bad:
        ctx.add("health.gpu_count", PASS, f"{len(usable)} GPU(s) usable", observed=len(usable), expected=want)
    elif len(usable) < want:
        ctx.add("health.gpu_count", FAIL, f"{len(usable)} of {want} GPU(s) usable" + (f": {detail}" if detail else ""),
                "a GPU is missing or lost: check `nvidia-smi -L` and Xid 79 in the kernel log; reseat or RMA",
                observed=len(usable), expected=want)
    else:
        ctx.add("health.gpu_count", WARN, f"{len(usable)} GPU(s) usable, {want} expected",
                "the inventory's GPU count is lower than what the node has: fix the host or group data",
                observed=len(usable), expected=want)

    names = sorted({g.get("name") for g in usable if g.get("name")})
    if not names:
        return
    unknown = [n for n in names if ctx.model(n) is None]
    if expected.gpu_model:
        try:
            want_model = ctx.catalog.get(expected.gpu_model)
        except UnknownGpuModel:
            want_model = ctx.model(expected.gpu_model)
        want_name = want_model.name if want_model else expected.gpu_model
        wrong = [n for n in names if n != want_name]
        if wrong:
            ctx.add("health.gpu_model", FAIL, f"GPU model {', '.join(names)}; expected {want_name}",
                    "the node has other GPUs than its inventory group says: fix the group or host data",
                    observed=names, expected=want_name)
            return
    if len(names) > 1:
        ctx.add("health.gpu_model", WARN, f"mixed GPU models on one host: {', '.join(names)}",
                "check the node's hardware and its inventory group", observed=names)
    elif unknown:
        ctx.add("health.gpu_model", WARN, f"{unknown[0]} is not in the gpufleet catalog: no performance thresholds",
                "learn it: gpufleet catalog learn INVENTORY HOST (then gpufleet_catalog_dir)", observed=names)
    else:
        ctx.add("health.gpu_model", PASS, f"{len(usable)}x {names[0]}", observed=names)


def _check_services(ctx: _Ctx, probe: dict[str, Any], expected: ExpectedState) -> None:
    services = probe.get("services") or {}
    units = services.get("units") or {}
    status = services.get("status")
    for unit, want in sorted(expected.services.items()):
        check = f"config.service.{unit}"
        if status != "ok":
            ctx.add(check, SKIP, f"service states unknown: {services.get('error') or status}", expected=want)
            continue
        info = units.get(unit)
        if info is None:
            ctx.add(check, SKIP, f"{unit} was not probed", expected=want)
            continue
        active = info.get("active")
        if (want == "active") == (active == "active"):
            ctx.add(check, PASS, f"{unit} is {active} ({info.get('enabled')})", observed=active, expected=want)
        elif want == "active":
            ctx.add(check, FAIL, f"{unit} is {active} (enabled: {info.get('enabled')}), expected active",
                    f"systemctl enable --now {unit}, or rerun the deploy that manages it", observed=active,
                    expected=want)
        else:
            ctx.add(check, FAIL, f"{unit} is {active}, expected inactive",
                    f"systemctl disable --now {unit}, or rerun the deploy", observed=active, expected=want)
    failed = sorted(u for u, info in units.items() if info.get("active") == "failed")
    if status == "ok" and units:
        if failed:
            ctx.add("health.services", WARN, f"failed unit(s): {', '.join(failed)}",
                    f"journalctl -u {failed[0]} on the node, then systemctl restart it", observed=failed)
        else:
            ctx.add("health.services", PASS, f"no failed unit among {len(units)} probed", observed=[])


def _check_nccl(ctx: _Ctx, probe: dict[str, Any], expected: ExpectedState) -> None:
    if expected.nccl is None:
        return
    conf = probe.get("nccl_conf") or {}
    values = conf.get("values") or {}
    want = {str(k): str(v) for k, v in expected.nccl.items()}
    path = conf.get("path") or "/etc/nccl.conf"
    hint = f"rewrite {path} with the gpu_node deploy"
    if conf.get("error"):
        ctx.add("config.nccl", FAIL, f"{path} unreadable: {conf['error']}", hint, expected=want)
        return
    if not conf.get("exists"):
        if want:
            ctx.add("config.nccl", FAIL, f"{path} is missing", hint, expected=want)
        else:
            ctx.add("config.nccl", PASS, f"no {path}, as expected", expected=want)
        return
    diff = NcclPlan(want).diff(values)  # the plan's comparison, rendered
    if diff.missing or diff.wrong:
        parts = [f"missing {', '.join(diff.missing)}"] if diff.missing else []
        parts += [f"{k}={value!r} (expected {want[k]!r})" for k, value in diff.wrong.items()]
        ctx.add("config.nccl", FAIL, f"{path}: " + "; ".join(parts), hint, observed=values, expected=want)
    elif diff.extra:
        ctx.add("config.nccl", WARN, f"{path} has unmanaged key(s): {', '.join(diff.extra)}",
                f"add them to the inventory's nccl settings or remove them from {path}", observed=values,
                expected=want)
    else:
        ctx.add("config.nccl", PASS, f"{path} holds the {len(want)} expected key(s)", observed=values,
                expected=want)


# ----------------------------------------------------------------------------------------------------------------
# Per GPU: config
# ----------------------------------------------------------------------------------------------------------------


def _check_persistence(ctx: _Ctx, gpu: dict[str, Any], expected: ExpectedState) -> None:
    """config.persistence: the plan's comparison (:meth:`gpufleet.plan.PersistencePlan.differs`) of the probe's GPU."""
    if expected.persistence is None:
        return
    observed = gpu.get("persistence_mode")
    differs = PersistencePlan(expected.persistence).differs(Gpu.from_probe(gpu, ctx.catalog))
    if differs is None:
        ctx.add("config.persistence", SKIP, "persistence mode not reported" + _err(gpu, "persistence_mode"), gpu=gpu)
    elif not differs:
        ctx.add("config.persistence", PASS, f"persistence mode {'on' if observed else 'off'}", gpu=gpu,
                observed=observed, expected=expected.persistence)
    else:
        hint = ("enable nvidia-persistenced with --persistence-mode (gpu_node deploy)" if expected.persistence
                else "disable persistence mode (gpu_node deploy)")
        ctx.add("config.persistence", FAIL, f"persistence mode {'on' if observed else 'off'}, expected "
                f"{'on' if expected.persistence else 'off'}", hint, gpu=gpu, observed=observed,
                expected=expected.persistence)


def _check_power_limit(ctx: _Ctx, gpu: dict[str, Any], expected: ExpectedState) -> None:
    want = expected.power_limit_for(gpu.get("uuid"))
    if want is None:
        return
    power = gpu.get("power") or {}
    limit = power.get("limit_w")
    if limit is None:
        ctx.add("config.power_limit", SKIP, "power limit not reported" + _err(gpu, "power.limit_w"), gpu=gpu,
                expected=want)
        return
    lo, hi = power.get("min_limit_w"), power.get("max_limit_w")
    index = gpu.get("index")
    if lo is not None and hi is not None and outside_range(want, lo, hi):
        ctx.add("config.power_limit", FAIL, f"expected {want:g} W is outside this GPU's range {lo:g}-{hi:g} W",
                "fix the power limit in the inventory (config validation should have refused it)", gpu=gpu,
                observed=limit, expected=want)
    elif power_differs(limit, want):  # the power operation's own comparison: what it leaves is what passes
        ctx.add("config.power_limit", FAIL, f"power limit {limit:g} W, expected {want:g} W",
                f"reapply with the gpu_node deploy (nvidia-smi -i {index} -pl {want:g}); check the power-limit boot "
                "unit ran", gpu=gpu, observed=limit, expected=want)
    elif power.get("enforced_limit_w") is not None and power["enforced_limit_w"] + 1.0 < limit:
        ctx.add("config.power_limit", WARN, f"power limit {limit:g} W set, but {power['enforced_limit_w']:g} W "
                "enforced", "something else caps the GPU (BMC / chassis power policy): check the BMC", gpu=gpu,
                observed=limit, expected=want)
    else:
        ctx.add("config.power_limit", PASS, f"power limit {limit:g} W", gpu=gpu, observed=limit, expected=want)


def _check_mig(ctx: _Ctx, gpu: dict[str, Any], expected: ExpectedState) -> None:
    """config.mig: the plan's MIG comparison (:func:`gpufleet.plan.mig_differences`, the one the MIG operation, its
    node-side applier and the exporter use) of the probe's view of the GPU, rendered: PASS only when the layout is
    applied; a wrong mode or other instances FAIL; a pending mode or compute instances not as created WARN."""
    if expected.mig is None or gpu.get("index") not in expected.mig:
        return
    layout = expected.mig[gpu["index"]]
    want = None if layout is None else {str(k): int(v) for k, v in layout.items() if int(v) > 0}
    mig = gpu.get("mig") or {}
    instances = mig.get("gpu_instances") or []
    observed: dict[str, int] = {}
    for gi in instances:
        name = gi.get("profile_name") or f"profile {gi.get('profile_id')}"
        observed[name] = observed.get(name, 0) + 1
    create, compared = _compared_instances(ctx.model(gpu.get("name")), want or {}, instances)
    found = mig_differences(want is not None, create, Gpu.from_probe(gpu, ctx.catalog), compared)
    hint = "reapply the MIG layout with the gpu_node deploy (a mode change needs an idle GPU and a reset or reboot)"
    pending = mig.get("mode_pending")

    def add(verdict: str, message: str, remediation: str = hint) -> None:
        ctx.add("config.mig", verdict, message, remediation, gpu=gpu, observed=observed, expected=want)

    if mig_compare.NO_MIG in found:
        add(FAIL, "MIG layout expected, but this GPU reports no MIG mode" + _err(gpu, "mig.mode_current"),
            "remove the MIG layout for this GPU model from the inventory")
    elif mig_compare.MODE in found:
        if want is None:
            add(FAIL, "MIG enabled, expected disabled")
        else:
            extra = " (enable pending a GPU reset or reboot)" if pending else ""
            add(FAIL, f"MIG disabled{extra}, expected {_layout(want) or 'MIG enabled'}")
    elif mig_compare.INSTANCES in found:
        add(FAIL, f"MIG layout {_layout(observed) or 'empty'}, expected {_layout(want or {}) or 'no instances'}")
    elif mig_compare.COMPUTE in found:
        without = [gi.get("id") for gi in instances if not gi.get("compute_instances")]
        if without:
            add(WARN, f"GPU instance(s) {without} have no compute instance (not usable by CUDA)")
        else:
            other = [gi.get("id") for gi in instances if not _whole(gi)]
            add(WARN, f"GPU instance(s) {other} do not hold one compute instance spanning them (the layout creates "
                "one each)")
    elif mig_compare.PENDING in found:
        add(WARN, "MIG disabled, but enabling is pending a GPU reset" if want is None
            else f"MIG layout {_layout(observed)}, but MIG disable is pending a reset")
    elif (mig.get("mode_current")) is None:
        add(PASS, "no MIG on this GPU, none expected")
    elif want is None:
        add(PASS, "MIG disabled")
    else:
        add(PASS, f"MIG layout {_layout(observed) or 'enabled, no instances'}")


def _whole(gi: Mapping[str, Any]) -> bool:
    """A GPU instance of the probe holding exactly one compute instance spanning it (its profile is the GPU
    instance's, as ``nvidia-smi mig -cgi … -C`` creates it)."""
    cis = gi.get("compute_instances") or []
    return len(cis) == 1 and cis[0].get("profile_name") == gi.get("profile_name")


def _compared_instances(model: GpuModel | None, want: Mapping[str, int], instances: list
                        ) -> tuple[list, list[tuple[Any, bool]]]:
    """The layout and the probe's GPU instances as the comparison takes them: by profile id, as the MIG operation
    and the boot script judge, when the catalog knows the GPU's profiles; else by profile name."""
    if model is None or model.mig is None:
        return ([name for name, count in want.items() for _ in range(count)],
                [(gi.get("profile_name") or f"profile {gi.get('profile_id')}", _whole(gi)) for gi in instances])
    try:
        ids = [model.mig.profile(name).id for name, count in want.items() for _ in range(count)]
    except UnknownMigProfile:
        ids = [-1]  # a profile this GPU does not offer: never the instances it holds
    return ids, [(gi.get("profile_id"), _whole(gi)) for gi in instances]


def _layout(layout: Mapping[str, int]) -> str:
    return ", ".join(f"{n}x {p}" for p, n in sorted(layout.items()))


# ----------------------------------------------------------------------------------------------------------------
# Per GPU: health
# ----------------------------------------------------------------------------------------------------------------


def _temperature_limits(thresholds: Thresholds, gpu: dict[str, Any], model: GpuModel | None) -> TemperatureLimits:
    """The GPU core's limits by the one temperature decision (verify's thresholds data, as the alerts use it)."""
    rule = thresholds.temperature_rule(model.key if model else None)
    return rule.limits((gpu.get("temperature") or {}).get("slowdown_c"), model.temp_slowdown_c if model else None)


def _temperature_limits_text(limits: TemperatureLimits) -> str:
    if limits.slowdown_c is None:
        return f"warn {limits.warn_c:g}, fail {limits.fail_c:g}: no slowdown temperature reported"
    fail = "" if limits.fail_c == limits.slowdown_c else f"fail {limits.fail_c:g}, "
    where = " from the catalog" if limits.source == "catalog" else ""
    return f"warn {limits.warn_c:g}, {fail}slowdown {limits.slowdown_c:g}{where}"


def _check_temperature(ctx: _Ctx, gpu: dict[str, Any], limits: dict[str, Any], model: GpuModel | None) -> None:
    temp = gpu.get("temperature") or {}
    t = limits["temperature"]
    core = temp.get("gpu_c")
    if core is None:
        ctx.add("health.temperature", SKIP, "temperature not reported" + _err(gpu, "temperature.gpu_c"), gpu=gpu)
        return
    decided = _temperature_limits(ctx.thr, gpu, model)
    warn_at, fail_at = decided.warn_c, decided.fail_c
    verdicts = [FAIL if core >= fail_at else WARN if core >= warn_at else PASS]
    parts = [f"GPU {core} °C ({_temperature_limits_text(decided)})"]
    mem = temp.get("memory_c")
    if mem is not None:
        mem_max = temp.get("memory_max_c")
        mem_fail = mem_max if mem_max is not None else t["memory_fallback_fail_c"]
        mem_warn = mem_max - t["memory_warn_below_max_c"] if mem_max is not None else t["memory_fallback_warn_c"]
        verdicts.append(FAIL if mem >= mem_fail else WARN if mem >= mem_warn else PASS)
        parts.append(f"memory {mem} °C (limit {mem_fail:g})")
    verdict = worst_verdict(verdicts)
    ctx.add("health.temperature", verdict, ", ".join(parts),
            "check airflow, fans and inlet temperature of the chassis; a GPU alone being hot points at its "
            "heatsink or slot", gpu=gpu, observed={"gpu_c": core, "memory_c": mem},
            expected={"warn_c": warn_at, "fail_c": fail_at, "source": decided.source})


def _check_clock_events(ctx: _Ctx, gpu: dict[str, Any], check: str, active: list[str] | None,
                        hardware: list[str] | None, mask: str | None, missing_reason: str) -> None:
    if active is None:
        ctx.add(check, SKIP, missing_reason, gpu=gpu)
        return
    shown = ", ".join(active) or "none"
    if hardware:
        ctx.add(check, FAIL, f"hardware clock slowdown: {', '.join(hardware)} (mask {mask})",
                "HW slowdown / thermal / power brake: check PSU and power cables, cooling, and the chassis' power "
                "brake signal (BMC event log)", gpu=gpu, observed=active)
    elif "sw_thermal_slowdown" in active:
        ctx.add(check, WARN, f"software thermal slowdown active ({shown})",
                "the GPU runs hot enough for the driver to lower clocks: check cooling", gpu=gpu, observed=active)
    else:
        ctx.add(check, PASS, f"clock event reasons: {shown}", gpu=gpu, observed=active)


def _check_ecc(ctx: _Ctx, gpu: dict[str, Any], limits: dict[str, Any], model: GpuModel | None) -> None:
    ecc = gpu.get("ecc") or {}
    if ecc.get("mode_current") is None:
        ctx.add("health.ecc", SKIP, "ECC not supported by this GPU" + _err(gpu, "ecc.mode_current"), gpu=gpu)
        return
    vol, agg = ecc.get("volatile_uncorrected"), ecc.get("aggregate_uncorrected")
    observed = {"mode": ecc["mode_current"], "volatile_uncorrected": vol, "aggregate_uncorrected": agg}
    if vol:
        ctx.add("health.ecc", FAIL, f"{vol} uncorrected ECC error(s) since the last driver load (aggregate {agg})",
                "drain the node, reset the GPU (nvidia-smi -r) or reboot; RMA if uncorrected errors return", gpu=gpu,
                observed=observed)
    elif agg is not None and agg >= limits["ecc_aggregate_uncorrected_warn"]:
        ctx.add("health.ecc", WARN, f"{agg} uncorrected ECC error(s) over the GPU's lifetime",
                "watch this GPU; RMA if the count grows", gpu=gpu, observed=observed)
    elif not ecc["mode_current"] and model is not None and model.ecc_supported and model.datacenter:
        ctx.add("health.ecc", WARN, "ECC is disabled on a GPU that supports it",
                "enable ECC (nvidia-smi -e 1) and reboot", gpu=gpu, observed=observed)
    elif ecc.get("mode_pending") is not None and ecc["mode_pending"] != ecc["mode_current"]:
        ctx.add("health.ecc", WARN, "an ECC mode change is pending a reboot", "reboot the node to apply it",
                gpu=gpu, observed=observed)
    else:
        ctx.add("health.ecc", PASS, f"ECC {'on' if ecc['mode_current'] else 'off'}, no uncorrected errors",
                gpu=gpu, observed=observed)


def _check_row_remap(ctx: _Ctx, gpu: dict[str, Any], limits: dict[str, Any]) -> None:
    remap = gpu.get("row_remap") or {}
    if all(remap.get(k) is None for k in ("correctable", "uncorrectable", "pending", "failure")):
        ctx.add("health.row_remap", SKIP, "row remapping not supported by this GPU" + _err(gpu, "row_remap.pending"),
                gpu=gpu)
        return
    counts = f"correctable {remap.get('correctable')}, uncorrectable {remap.get('uncorrectable')}"
    if remap.get("failure"):
        ctx.add("health.row_remap", FAIL, f"row remapping failed ({counts})",
                "the GPU ran out of spare rows: drain the node and RMA the GPU", gpu=gpu, observed=remap)
    elif remap.get("pending"):
        ctx.add("health.row_remap", FAIL, f"row remapping pending ({counts})",
                "drain the node and reset the GPU (nvidia-smi -r) or reboot to apply the pending remap", gpu=gpu,
                observed=remap)
    elif (remap.get("uncorrectable") or 0) >= limits["row_remap_uncorrectable_warn"]:
        ctx.add("health.row_remap", WARN, f"rows remapped for uncorrectable errors ({counts})",
                "watch this GPU; RMA if the count keeps growing", gpu=gpu, observed=remap)
    else:
        ctx.add("health.row_remap", PASS, f"no pending or failed remap ({counts})", gpu=gpu, observed=remap)


def _check_pcie(ctx: _Ctx, gpu: dict[str, Any]) -> None:
    pcie = gpu.get("pcie") or {}
    gen, gen_max = pcie.get("gen_current"), pcie.get("gen_max")
    width, width_max = pcie.get("width_current"), pcie.get("width_max")
    if None in (gen, gen_max, width, width_max):
        ctx.add("health.pcie", SKIP, "PCIe link not reported" + _err(gpu, "pcie.width_current"), gpu=gpu)
        return
    text = f"PCIe gen {gen}/{gen_max} x{width}/x{width_max}"
    idle = "gpu_idle" in ((gpu.get("clock_event_reasons") or {}).get("active") or [])
    if width < width_max:
        ctx.add("health.pcie", FAIL, f"{text}: link width below max",
                "reseat the GPU / riser and check the slot; check BIOS PCIe bifurcation settings", gpu=gpu,
                observed=pcie)
    elif gen < gen_max and not idle:
        ctx.add("health.pcie", WARN, f"{text}: link generation below max while busy",
                "check the slot, riser and BIOS PCIe speed settings", gpu=gpu, observed=pcie)
    elif gen < gen_max:
        ctx.add("health.pcie", PASS, f"{text} (gen lowered at idle to save power)", gpu=gpu, observed=pcie)
    else:
        ctx.add("health.pcie", PASS, text, gpu=gpu, observed=pcie)


def _check_nvlink(ctx: _Ctx, gpu: dict[str, Any]) -> None:
    nvlink = gpu.get("nvlink") or {}
    if not nvlink.get("supported"):
        return
    links, down = nvlink.get("links") or [], nvlink.get("down") or []
    if down:
        ctx.add("health.nvlink", FAIL, f"NVLink(s) down: {', '.join(map(str, down))} ({len(links) - len(down)}/"
                f"{len(links)} up)", "check nvidia-fabricmanager, then reset the GPU or reboot; RMA the baseboard "
                "if links stay down", gpu=gpu, observed=down)
    else:
        ctx.add("health.nvlink", PASS, f"{len(links)}/{len(links)} NVLinks up", gpu=gpu, observed=[])


def _check_recovery_action(ctx: _Ctx, gpu: dict[str, Any]) -> None:
    """The driver's recovery action for the GPU (NVML; older drivers have none: no check), rated as the alerts
    GpuRecoveryActionRequired / GpuRecoveryActionDrain rate it (gpufleet.verify.recovery)."""
    value = gpu.get("recovery_action")
    if value is None:
        return
    action = recovery_action(value)
    verdict = {None: PASS, "warning": WARN}.get(action.severity, FAIL)
    ctx.add("health.recovery_action", verdict, f"recovery action {action.name} ({value})",
            f"{action.todo}; then run verify again", gpu=gpu,
            observed={"value": value, "action": action.name})


def _xid_verdict(ctx: _Ctx, events: list[XidEvent]) -> tuple[str, str]:
    codes = sorted({e.code for e in events})
    verdict = FAIL if any(ctx.thr.xid_severity(c) == FAIL for c in codes) else WARN
    text = "; ".join(f"Xid {c} x{sum(1 for e in events if e.code == c)}: {ctx.thr.xid_description(c)}"
                     for c in codes)
    return verdict, text


_XID_HINT = ("see the Xid in the kernel log (journalctl -k | grep Xid); critical Xids: drain the node and reset the "
             "GPU or reboot, RMA if they repeat")


def _check_xid(ctx: _Ctx, probe: dict[str, Any], usable: list[dict[str, Any]], kernel_log: Any) -> None:
    log = probe.get("kernel_log") or {}
    if kernel_log is None:
        if log.get("status") != "ok":
            if log.get("status") != "skipped":
                ctx.add("health.xid", SKIP, f"kernel log unavailable: {log.get('error') or log.get('status')}")
            return
        kernel_log = log.get("xid_lines") or []
    events = parse_xid_lines(kernel_log)
    matched: set[int] = set()
    for gpu in usable:
        mine = [e for e in events if e.matches_bus_id(gpu.get("pci_bus_id"))]
        matched.update(id(e) for e in mine)
        if mine:
            verdict, text = _xid_verdict(ctx, mine)
            ctx.add("health.xid", verdict, text, _XID_HINT, gpu=gpu, observed=[e.line for e in mine])
        else:
            ctx.add("health.xid", PASS, "no Xid for this GPU in the kernel log", gpu=gpu, observed=[])
    rest = [e for e in events if id(e) not in matched]
    if rest:
        by_pci: dict[str, list[XidEvent]] = {}
        for e in rest:
            by_pci.setdefault(e.pci, []).append(e)
        for pci, group in sorted(by_pci.items()):
            verdict, text = _xid_verdict(ctx, group)
            ctx.add("health.xid", verdict, f"PCI {pci} (no responsive GPU at this address): {text}", _XID_HINT,
                    observed=[e.line for e in group])


# ----------------------------------------------------------------------------------------------------------------
# Performance
# ----------------------------------------------------------------------------------------------------------------


def _bench_gpu(bench: dict[str, Any] | None, gpu: dict[str, Any]) -> dict[str, Any] | None:
    for entry in (bench or {}).get("gpus") or []:
        if gpu.get("uuid") and entry.get("uuid") == gpu.get("uuid"):
            return entry
    for entry in (bench or {}).get("gpus") or []:
        if entry.get("index") == gpu.get("index"):
            return entry
    return None


def _fraction_verdict(value: float, reference: float, pair: dict[str, float]) -> tuple[str, float]:
    fraction = value / reference if reference else 0.0
    if fraction < pair["fail"]:
        return FAIL, fraction
    if fraction < pair["warn"]:
        return WARN, fraction
    return PASS, fraction


_PERF_HINT = ("check the clocks, power limit and clock event reasons seen during the run, and compare with a "
              "healthy node of the same model")


def _check_gpu_perf(ctx: _Ctx, gpu: dict[str, Any], entry: dict[str, Any] | None, model: GpuModel | None,
                    limits: dict[str, Any]) -> None:
    if entry is None:
        ctx.add("perf.bench", SKIP, "no benchmark result for this GPU", gpu=gpu)
        return
    if (gpu.get("mig") or {}).get("mode_current"):
        ctx.add("perf.bench", SKIP, "MIG mode: benchmarks would measure one instance, not the GPU", gpu=gpu)
        return
    for precision, item in (entry.get("matmul") or {}).items():
        check = f"perf.matmul.{precision}"
        status = item.get("status")
        if status == "skipped":
            ctx.add(check, SKIP, item.get("reason") or "skipped", gpu=gpu)
            continue
        if status != "ok":
            ctx.add(check, FAIL, f"matmul {precision} failed: {item.get('reason')}",
                    "rerun the benchmark; a CUDA error on one GPU points at the GPU (check Xid)", gpu=gpu)
            continue
        tflops = item["tflops"]
        peak = model.dense_peak(precision) if model else None
        pair = (limits.get("matmul_fraction") or {}).get(precision)
        if peak is None or pair is None:
            why = "GPU model not in the catalog" if model is None else f"no dense {precision} peak in the catalog"
            ctx.add(check, SKIP, f"{tflops:.1f} TFLOP/s measured; {why}", gpu=gpu, observed=tflops)
            continue
        verdict, fraction = _fraction_verdict(tflops, peak, pair)
        ctx.add(check, verdict, f"{tflops:.1f} TFLOP/s = {fraction:.0%} of dense peak {peak:g} "
                f"(warn < {pair['warn']:.0%}, fail < {pair['fail']:.0%}; spread {item.get('spread_pct')}%)",
                _PERF_HINT, gpu=gpu, observed=tflops, expected={"peak": peak, **pair})
    item = entry.get("memory_bandwidth")
    if item:
        if item.get("status") == "ok":
            peak = model.memory_bandwidth_gbs if model else None
            pair = limits["memory_bandwidth_fraction"]
            if peak:
                verdict, fraction = _fraction_verdict(item["gbs"], peak, pair)
                ctx.add("perf.memory_bandwidth", verdict, f"{item['gbs']:.0f} GB/s = {fraction:.0%} of "
                        f"{peak:g} GB/s (warn < {pair['warn']:.0%}, fail < {pair['fail']:.0%})", _PERF_HINT,
                        gpu=gpu, observed=item["gbs"], expected={"peak": peak, **pair})
            else:
                ctx.add("perf.memory_bandwidth", SKIP, f"{item['gbs']:.0f} GB/s measured; no catalog bandwidth",
                        gpu=gpu, observed=item["gbs"])
        elif item.get("status") == "skipped":
            ctx.add("perf.memory_bandwidth", SKIP, item.get("reason") or "skipped", gpu=gpu)
        else:
            ctx.add("perf.memory_bandwidth", FAIL, f"memory bandwidth test failed: {item.get('reason')}",
                    "rerun the benchmark; check Xid for this GPU", gpu=gpu)
    _check_host_transfer(ctx, gpu, entry, limits)
    during = entry.get("during_run") or {}
    _check_clock_events(ctx, gpu, "perf.clock_events_during_run", during.get("clock_event_reasons"),
                        during.get("hardware_problems"), during.get("clock_event_reasons_mask"),
                        "no NVML samples during the run" + (f" ({during['error']})" if during.get("error") else ""))


def _check_host_transfer(ctx: _Ctx, gpu: dict[str, Any], entry: dict[str, Any], limits: dict[str, Any]) -> None:
    items = {k: entry.get(k) for k in ("host_to_device", "device_to_host") if entry.get(k)}
    if not items:
        return
    bad = {k: v for k, v in items.items() if v.get("status") == "error"}
    if bad:
        ctx.add("perf.host_transfer", FAIL, "; ".join(f"{k} failed: {v.get('reason')}" for k, v in bad.items()),
                "rerun the benchmark; check the PCIe link and Xid for this GPU", gpu=gpu)
        return
    ok = {k: v["gbs"] for k, v in items.items() if v.get("status") == "ok"}
    if not ok:
        ctx.add("perf.host_transfer", SKIP, next(iter(items.values())).get("reason") or "skipped", gpu=gpu)
        return
    pcie = gpu.get("pcie") or {}
    lane = ctx.thr.pcie_lane_gbs(pcie.get("gen_max"))
    text = ", ".join(f"{k.replace('_', ' ')} {v:.1f} GB/s" for k, v in ok.items())
    if lane is None or not pcie.get("width_max"):
        ctx.add("perf.host_transfer", SKIP, f"{text}; PCIe link maximum unknown", gpu=gpu, observed=ok)
        return
    reference = lane * pcie["width_max"]
    pair = limits["host_transfer_fraction"]
    verdict, fraction = _fraction_verdict(min(ok.values()), reference, pair)
    ctx.add("perf.host_transfer", verdict, f"{text}; slowest = {fraction:.0%} of PCIe gen {pcie['gen_max']} "
            f"x{pcie['width_max']} ({reference:.1f} GB/s)", "check the PCIe link (gen/width), NUMA placement and "
            "IOMMU settings", gpu=gpu, observed=ok, expected={"reference_gbs": round(reference, 2), **pair})


def _check_node_perf(ctx: _Ctx, probe: dict[str, Any], bench: dict[str, Any], model: GpuModel | None,
                     limits: dict[str, Any]) -> None:
    nccl = bench.get("nccl_all_reduce")
    if nccl:
        status = nccl.get("status")
        if status == "skipped":
            ctx.add("perf.nccl_all_reduce", SKIP, nccl.get("reason") or "skipped")
        elif status != "ok":
            ctx.add("perf.nccl_all_reduce", FAIL, f"all_reduce_perf failed: {nccl.get('reason')}",
                    "run all_reduce_perf by hand with NCCL_DEBUG=INFO to see why")
        elif (nccl.get("out_of_bounds") or 0) > 0 or (nccl.get("wrong_total") or 0) > 0:
            ctx.add("perf.nccl_all_reduce", FAIL, f"all-reduce returned wrong values (#wrong {nccl.get('wrong_total')},"
                    f" out of bounds {nccl.get('out_of_bounds')})", "data corruption across GPUs: check NVLink / "
                    "NVSwitch and Xid, drain the node", observed=nccl.get("max_busbw_gbs"))
        else:
            busbw, n = nccl.get("max_busbw_gbs"), nccl.get("n_gpus")
            pair = limits.get("nccl_busbw_gbs")
            text = f"bus bandwidth {busbw} GB/s max, {nccl.get('avg_busbw_gbs')} GB/s average over {n} GPUs"
            if pair and busbw is not None and n == probe.get("gpu_count"):
                verdict = FAIL if busbw < pair["fail"] else WARN if busbw < pair["warn"] else PASS
                ctx.add("perf.nccl_all_reduce", verdict, f"{text} (warn < {pair['warn']}, fail < {pair['fail']})",
                        "check NVLink state, nvidia-fabricmanager and NCCL_* settings (NCCL_DEBUG=INFO)",
                        observed=busbw, expected=pair)
            else:
                ctx.add("perf.nccl_all_reduce", PASS, text + " (no threshold for this model/GPU count)",
                        observed=busbw)
    diag = bench.get("dcgm_diag")
    if diag:
        status = diag.get("status")
        if status == "skipped":
            ctx.add("perf.dcgm_diag", SKIP, diag.get("reason") or "skipped")
        elif status != "ok":
            ctx.add("perf.dcgm_diag", WARN, f"dcgmi diag gave no result: {diag.get('reason')}",
                    "check nv-hostengine / nvidia-dcgm is running, then run dcgmi diag -r 1 by hand")
        else:
            result = diag.get("result")
            failing = [t for t in diag.get("tests") or [] if t.get("status") in ("fail", "warn")]
            detail = "; ".join(
                f"{t.get('name')}: {t.get('status')}"
                + (f" ({next((w for r in t.get('results', []) for w in r.get('warnings', [])), '')})"
                   if any(r.get("warnings") for r in t.get("results", [])) else "")
                for t in failing)
            level = diag.get("level")
            if result == "fail":
                ctx.add("perf.dcgm_diag", FAIL, f"dcgmi diag -r {level} failed: {detail or diag.get('runtime_error')}",
                        "read the failing DCGM test's message; drain the node if it names a GPU fault",
                        observed=result)
            elif result == "warn":
                ctx.add("perf.dcgm_diag", WARN, f"dcgmi diag -r {level} warnings: {detail}",
                        "read DCGM's warning text", observed=result)
            elif result == "pass":
                ctx.add("perf.dcgm_diag", PASS, f"dcgmi diag -r {level}: {len(diag.get('tests') or [])} test(s) "
                        "passed", observed=result)
            else:
                ctx.add("perf.dcgm_diag", SKIP, f"dcgmi diag -r {level}: no test ran ({result})", observed=result)


# ----------------------------------------------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------------------------------------------


def evaluate(probe: dict[str, Any], expected: ExpectedState | None = None, *, bench: dict[str, Any] | None = None,
             kernel_log: str | list[str] | None = None, thresholds: Thresholds | None = None,
             catalog: Catalog | None = None, host: str | None = None) -> list[CheckResult]:
    """All checks of one host's probe document.

    ``bench`` defaults to ``probe["bench"]``; ``kernel_log`` (text or lines holding ``NVRM: Xid`` lines) defaults
    to the probe's ``kernel_log.xid_lines``. ``host`` defaults to the probe's host name.
    """
    expected = expected or ExpectedState()
    ctx = _Ctx(host or probe.get("host") or "?", thresholds or default_thresholds(), catalog or load_catalog())
    nvml_ok = _check_probe(ctx, probe)
    _check_driver(ctx, probe, expected, nvml_ok)
    _check_services(ctx, probe, expected)
    check_exporters(ctx.add, probe, expected.exporters)
    _check_nccl(ctx, probe, expected)
    if not nvml_ok:
        return ctx.checks
    _check_count_and_model(ctx, probe, expected)
    gpus = probe.get("gpus") or []
    usable = [g for g in gpus if g.get("status") == "ok"]
    bench = bench if bench is not None else probe.get("bench")
    run_perf = bool(bench) and bench.get("profile") != "none"
    if run_perf and bench.get("status") == "skipped" and not bench.get("gpus"):
        ctx.add("perf.bench", SKIP, f"benchmarks skipped: {bench.get('reason')}")
    for gpu in gpus:
        if gpu.get("status") != "ok":
            status = gpu.get("status")
            hint = ("the GPU has fallen off the bus: drain the node and power-cycle it; RMA if it recurs"
                    if status == "gpu_lost" else "check the GPU with nvidia-smi -q -i " + str(gpu.get("index")))
            ctx.add("health.gpu_status", FAIL, f"GPU not responding: {status}", hint, gpu=gpu, observed=status)
            continue
        model = ctx.model(gpu.get("name"))
        limits = ctx.thr.for_model(model.key if model else None)
        ctx.add("health.gpu_status", PASS, f"{gpu.get('name')} at {gpu.get('pci_bus_id')}", gpu=gpu, observed="ok")
        _check_persistence(ctx, gpu, expected)
        _check_power_limit(ctx, gpu, expected)
        _check_mig(ctx, gpu, expected)
        _check_temperature(ctx, gpu, limits, model)
        reasons = gpu.get("clock_event_reasons") or {}
        _check_clock_events(ctx, gpu, "health.clock_events", reasons.get("active"), reasons.get("hardware_problems"),
                            reasons.get("active_mask"), "clock event reasons not reported"
                            + _err(gpu, "clock_event_reasons.active_mask"))
        _check_ecc(ctx, gpu, limits, model)
        _check_row_remap(ctx, gpu, limits)
        _check_pcie(ctx, gpu)
        _check_nvlink(ctx, gpu)
        _check_recovery_action(ctx, gpu)
        if run_perf and (bench.get("gpus") or bench.get("status") != "skipped"):
            _check_gpu_perf(ctx, gpu, _bench_gpu(bench, gpu), model, limits)
    _check_xid(ctx, probe, usable, kernel_log)
    if run_perf:
        model = ctx.model(usable[0].get("name")) if usable else None
        _check_node_perf(ctx, probe, bench, model, ctx.thr.for_model(model.key if model else None))
    return ctx.checks


def gpu_summary(probe: dict[str, Any], bench: dict[str, Any] | None = None, *, thresholds: Thresholds | None = None,
                catalog: Catalog | None = None) -> list[dict[str, Any]]:
    """Per-GPU figures the reports draw: identity, temperatures and limits, power, bench results next to the
    catalog's dense peaks."""
    thr = thresholds or default_thresholds()
    catalog = catalog or load_catalog()
    bench = bench if bench is not None else probe.get("bench")
    rows = []
    for gpu in probe.get("gpus") or []:
        try:
            model = catalog.by_name(gpu["name"]) if gpu.get("name") else None
        except UnknownGpuModel:
            model = None
        temp = gpu.get("temperature") or {}
        decided = _temperature_limits(thr, gpu, model)
        warn_at, fail_at = decided.warn_c, decided.fail_c
        power = gpu.get("power") or {}
        entry = _bench_gpu(bench, gpu) or {}
        matmul = {}
        for precision, item in (entry.get("matmul") or {}).items():
            peak = model.dense_peak(precision) if model else None
            tflops = item.get("tflops") if item.get("status") == "ok" else None
            matmul[precision] = {"status": item.get("status"), "tflops": tflops, "peak_tflops": peak,
                                 "fraction": round(tflops / peak, 4) if tflops is not None and peak else None}

        def gbs(key: str, entry: dict[str, Any] = entry) -> float | None:
            item = entry.get(key) or {}
            return item.get("gbs") if item.get("status") == "ok" else None

        rows.append({
            "index": gpu.get("index"), "uuid": gpu.get("uuid"), "name": gpu.get("name"),
            "model": model.key if model else None, "status": gpu.get("status"), "pci_bus_id": gpu.get("pci_bus_id"),
            "temperature_c": temp.get("gpu_c"), "temperature_warn_c": warn_at, "temperature_fail_c": fail_at,
            "memory_temperature_c": temp.get("memory_c"), "power_draw_w": power.get("draw_w"),
            "power_limit_w": power.get("limit_w"), "persistence_mode": gpu.get("persistence_mode"),
            "mig": (gpu.get("mig") or {}).get("mode_current"), "matmul": matmul,
            "memory_bandwidth_gbs": gbs("memory_bandwidth"),
            "memory_bandwidth_peak_gbs": model.memory_bandwidth_gbs if model else None,
            "host_to_device_gbs": gbs("host_to_device"), "device_to_host_gbs": gbs("device_to_host"),
            "verdict": None,
        })
    return rows


def evaluate_host(host: str, probe: dict[str, Any], expected: ExpectedState | None = None, **kwargs: Any
                  ) -> HostResult:
    """evaluate() + gpu_summary() for one host. kwargs: bench, kernel_log, thresholds, catalog."""
    checks = evaluate(probe, expected, host=host, **kwargs)
    gpus = gpu_summary(probe, kwargs.get("bench"), thresholds=kwargs.get("thresholds"),
                       catalog=kwargs.get("catalog")) if not probe.get("nvml_error") else []
    result = HostResult(host=host, status="ok", probe=probe, checks=checks, gpus=gpus)
    _set_gpu_verdicts(result)
    return result


def unreachable_host(host: str, reason: str) -> HostResult:
    """The result of a host verify could not connect to: its own verdict, ``unreachable``."""
    check = CheckResult(check="host.reachable", verdict=UNREACHABLE, host=host, message=f"unreachable: {reason}",
                        remediation="check SSH / network / power of the host, then rerun verify (the other hosts "
                                    "were verified)")
    return HostResult(host=host, status="unreachable", error=reason, checks=[check])


def probe_failed_host(host: str, error: str) -> HostResult:
    """A host that answered, but whose probe produced no document (crash, missing Python, bad JSON)."""
    check = CheckResult(check="host.probe", verdict=FAIL, host=host, message=f"the probe did not run: {error}",
                        remediation="rerun gpufleet verify (it uploads the probe each run); check the node's python3")
    return HostResult(host=host, status="error", error=error, checks=[check])


def _set_gpu_verdicts(host: HostResult) -> None:
    for row in host.gpus:
        mine = [c.verdict for c in host.checks if c.gpu_index is not None and c.gpu_index == row["index"]]
        row["verdict"] = worst_verdict(mine) if mine else None


# ----------------------------------------------------------------------------------------------------------------
# Fleet-relative outliers
# ----------------------------------------------------------------------------------------------------------------


def _gpu_metrics(row: dict[str, Any]) -> dict[str, float]:
    metrics = {f"matmul.{p}": m["tflops"] for p, m in (row.get("matmul") or {}).items() if m.get("tflops")}
    if row.get("memory_bandwidth_gbs"):
        metrics["memory_bandwidth"] = row["memory_bandwidth_gbs"]
    return metrics


def fleet_checks(hosts: list[HostResult], thresholds: Thresholds | None = None) -> list[CheckResult]:
    """fleet.gpu_outlier (a GPU below the median of the same model across the fleet) and fleet.node_outlier (a
    node's mean below the median of the nodes with the same model and GPU count). Appended to each host."""
    thr = (thresholds or default_thresholds()).fleet
    min_n = thr["min_group_size"]
    added: list[CheckResult] = []
    groups: dict[tuple[str, str], list[float]] = {}
    for host in hosts:
        for row in host.gpus:
            if row.get("mig"):
                continue
            for metric, value in _gpu_metrics(row).items():
                groups.setdefault((row.get("name") or "?", metric), []).append(value)
    medians = {k: statistics.median(v) for k, v in groups.items() if len(v) >= min_n}
    for host in hosts:
        for row in host.gpus:
            deficits = {}
            for metric, value in _gpu_metrics(row).items():
                median = medians.get((row.get("name") or "?", metric))
                if median and not row.get("mig"):
                    deficits[metric] = (median - value) / median * 100.0
            if not deficits:
                continue
            metric, deficit = max(deficits.items(), key=lambda kv: kv[1])
            verdict = (FAIL if deficit >= thr["gpu_outlier_fail_pct"] else
                       WARN if deficit >= thr["gpu_outlier_warn_pct"] else PASS)
            text = (f"{metric} {deficit:.1f}% below the fleet median of {row.get('name')}" if deficit > 0
                    else f"at or above the fleet median of {row.get('name')} on {len(deficits)} metric(s)")
            check = CheckResult(check="fleet.gpu_outlier", verdict=verdict, host=host.host, message=text,
                                remediation="" if verdict == PASS else "compare clocks, power limit, temperatures and "
                                "PCIe/NVLink state with a GPU at the median; reseat or RMA if it stays slow",
                                gpu_index=row.get("index"), gpu_uuid=row.get("uuid"),
                                observed={k: round(v, 2) for k, v in deficits.items()},
                                expected={"warn_pct": thr["gpu_outlier_warn_pct"],
                                          "fail_pct": thr["gpu_outlier_fail_pct"]})
            host.checks.append(check)
            added.append(check)

    node_groups: dict[tuple[str, int], list[tuple[HostResult, float]]] = {}
    for host in hosts:
        if host.status != "ok" or not host.gpus:
            continue
        values = [m["tflops"] for row in host.gpus if not row.get("mig")
                  for p, m in (row.get("matmul") or {}).items() if p == "bf16" and m.get("tflops")]
        if not values:
            continue
        key = (host.gpus[0].get("name") or "?", len(host.gpus))
        node_groups.setdefault(key, []).append((host, statistics.mean(values)))
    for (name, count), members in node_groups.items():
        if len(members) < min_n:
            continue
        median = statistics.median(v for _, v in members)
        for host, value in members:
            deficit = (median - value) / median * 100.0 if median else 0.0
            verdict = (FAIL if deficit >= thr["node_outlier_fail_pct"] else
                       WARN if deficit >= thr["node_outlier_warn_pct"] else PASS)
            where = f"the median of {len(members)} nodes with {count}x {name}"
            text = (f"mean bf16 {value:.1f} TFLOP/s, {deficit:.1f}% below {where}" if deficit > 0 else
                    f"mean bf16 {value:.1f} TFLOP/s, at or above {where}")
            check = CheckResult(check="fleet.node_outlier", verdict=verdict, host=host.host, message=text,
                                remediation="" if verdict == PASS else "the whole node is slow: check its power "
                                "limits, cooling, BIOS power profile and driver version against a median node",
                                observed=round(value, 2), expected=round(median, 2))
            host.checks.append(check)
            added.append(check)
    for host in hosts:
        _set_gpu_verdicts(host)
    return added


def build_fleet_result(hosts: list[HostResult], *, thresholds: Thresholds | None = None,
                       bench_profile: str | None = None, meta: dict[str, Any] | None = None) -> FleetResult:
    """Add the fleet-relative checks to ``hosts`` and return the FleetResult (regressions: see
    gpufleet.report.regression.attach_regressions)."""
    fleet_checks(hosts, thresholds)
    return FleetResult(hosts=hosts, bench_profile=bench_profile, meta=dict(meta or {}))


__all__ = [
    "BENCH_PRECISIONS",
    "ExpectedState",
    "build_fleet_result",
    "evaluate",
    "evaluate_host",
    "fleet_checks",
    "gpu_summary",
    "probe_failed_host",
    "unreachable_host",
]
