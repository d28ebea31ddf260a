"""gpufleet node probe, the NVML part: versions and every GPU read through NVML (``collect_nvml``), and the small
helpers the probe and the benchmarks share (timestamps, NVML status strings, clock event reasons).

Runs ON the node with only the Python standard library (>= 3.9) and nvidia-ml-py (``import pynvml``), like
``probe.py`` and ``bench.py``, which both import it (it imports neither). Every NVML call that fails is recorded
per field as a status string in the ``errors`` map next to the field (the field itself is ``null``).
"""

from __future__ import annotations

import time
from typing import Any

# NVML clock event reasons (nvml.h; DESIGN.md §4). 0x200/0x400 exist only in pynvml.
CLOCK_EVENT_REASONS = (
    (0x0000000000000001, "gpu_idle"),
    (0x0000000000000002, "applications_clocks_setting"),
    (0x0000000000000004, "sw_power_cap"),
    (0x0000000000000008, "hw_slowdown"),
    (0x0000000000000010, "sync_boost"),
    (0x0000000000000020, "sw_thermal_slowdown"),
    (0x0000000000000040, "hw_thermal_slowdown"),
    (0x0000000000000080, "hw_power_brake_slowdown"),
    (0x0000000000000100, "display_clock_setting"),
    (0x0000000000000200, "board_limit"),
    (0x0000000000000400, "reliability"),
)
HARDWARE_PROBLEM_MASK = 0x8 | 0x40 | 0x80

# nvmlReturn_t -> status string recorded in ``errors``.
NVML_STATUS = {
    1: "uninitialized",
    3: "not_supported",
    4: "no_permission",
    9: "driver_not_loaded",
    12: "library_not_found",
    13: "function_not_found",
    15: "gpu_lost",
    18: "lib_rm_version_mismatch",
}
_INVALID_ARGUMENT_STATUS = "unknown:2"  # NVML_ERROR_INVALID_ARGUMENT

# NVML constants used here (stable values from nvml.h; pynvml defines the same).
_CLOCK_GRAPHICS, _CLOCK_SM, _CLOCK_MEM = 0, 1, 2
_TEMP_GPU = 0
_THRESHOLD_SHUTDOWN, _THRESHOLD_SLOWDOWN, _THRESHOLD_MEM_MAX, _THRESHOLD_GPU_MAX = 0, 1, 2, 3
_FI_DEV_MEMORY_TEMP = 82
_FI_DEV_GET_GPU_RECOVERY_ACTION = 230  # NVML 560+; older drivers answer NOT_SUPPORTED for the field
_ECC_CORRECTED, _ECC_UNCORRECTED = 0, 1
_ECC_VOLATILE, _ECC_AGGREGATE = 0, 1
_NVLINK_MAX_LINKS = 36
_GI_PROFILE_COUNT = 0x12
_CI_PROFILE_COUNT = 0x9
_CI_ENGINE_SHARED = 0
_INVALID_ID = 0xFFFFFFFF
_NOT_AVAILABLE_ULL = 0xFFFFFFFFFFFFFFFF


# ----------------------------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------------------------


def utc_timestamp(now: float | None = None) -> str:
    now = time.time() if now is None else now
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int((now % 1) * 1000):03d}Z"


def nvml_status(exc: BaseException) -> str:
    """The status string for an exception raised by a pynvml call."""
    code = getattr(exc, "value", None)
    if isinstance(code, int) and not isinstance(code, bool):
        return NVML_STATUS.get(code, f"unknown:{code}")
    if isinstance(exc, AttributeError):  # an old nvidia-ml-py without this function
        return "function_not_found"
    return f"error:{type(exc).__name__}"


def decode_clock_event_reasons(mask: int) -> tuple[list[str], list[str]]:
    """(names of the active reasons, names of those that are hardware problems) for an NVML bitmask."""
    names = []
    known = 0
    for bit, name in CLOCK_EVENT_REASONS:
        known |= bit
        if mask & bit:
            names.append(name)
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"unknown_0x{bit:x}")
            rest &= ~bit
        bit <<= 1
    hardware = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit & HARDWARE_PROBLEM_MASK]
    return names, hardware


def hex_mask(mask: int) -> str:
    return f"0x{mask:016X}"


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return value


def _watts(milliwatts: Any) -> float | None:
    return None if milliwatts is None else round(milliwatts / 1000.0, 2)


def _mib(nbytes: Any) -> int | None:
    if nbytes is None or nbytes == _NOT_AVAILABLE_ULL:
        return None
    return int(nbytes // (1024 * 1024))


class _Fields:
    """Calls NVML functions by name, recording failures per field instead of raising."""

    def __init__(self, nvml: Any, errors: dict[str, str]):
        self.nvml = nvml
        self.errors = errors

    def call(self, key: str, fn_name: str, *args: Any, alt: str | None = None) -> Any:
        fn = getattr(self.nvml, fn_name, None)
        if fn is None and alt is not None:
            fn = getattr(self.nvml, alt, None)
        if fn is None:
            self.errors[key] = "function_not_found"
            return None
        try:
            return fn(*args)
        except Exception as exc:  # any failure becomes a status, never an abort
            self.errors[key] = nvml_status(exc)
            return None

    def fail(self, key: str, status: str) -> None:
        self.errors[key] = status


# ----------------------------------------------------------------------------------------------------------------
# Per GPU
# ----------------------------------------------------------------------------------------------------------------


def empty_gpu(index: int, status: str = "ok") -> dict[str, Any]:
    """A GPU entry with every field present and null: the shape of a GPU that could not be read."""
    return {
        "index": index, "status": status, "errors": {},
        "uuid": None, "serial": None, "name": None, "pci_bus_id": None, "pci_device_id": None,
        "vbios_version": None, "compute_capability": None, "compute_mode": None, "pstate": None,
        "persistence_mode": None, "recovery_action": None,
        "power": dict.fromkeys(("limit_w", "default_limit_w", "min_limit_w", "max_limit_w", "enforced_limit_w",
                                "draw_w")),
        "temperature": dict.fromkeys(("gpu_c", "memory_c", "shutdown_c", "slowdown_c", "memory_max_c",
                                      "gpu_max_c")),
        "clocks": dict.fromkeys(("sm_mhz", "memory_mhz", "graphics_mhz", "max_sm_mhz", "max_memory_mhz",
                                 "max_graphics_mhz")),
        "clock_event_reasons": dict.fromkeys(("active_mask", "supported_mask", "active", "hardware_problems")),
        "memory": dict.fromkeys(("total_mib", "used_mib", "free_mib")),
        "utilization": dict.fromkeys(("gpu_pct", "memory_pct")),
        "ecc": dict.fromkeys(("mode_current", "mode_pending", "volatile_corrected", "volatile_uncorrected",
                              "aggregate_corrected", "aggregate_uncorrected")),
        "row_remap": dict.fromkeys(("correctable", "uncorrectable", "pending", "failure")),
        "retired_pages_pending": None,
        "pcie": dict.fromkeys(("gen_current", "gen_max", "gen_gpu_max", "width_current", "width_max")),
        "nvlink": {"supported": None, "links": [], "up": None, "down": []},
        "mig": {"mode_current": None, "mode_pending": None, "gpu_instances": []},
        "processes": None,
    }


def _probe_gpu(nvml: Any, index: int) -> dict[str, Any]:
    gpu = empty_gpu(index)
    errors: dict[str, str] = gpu["errors"]
    f = _Fields(nvml, errors)
    handle = f.call("handle", "nvmlDeviceGetHandleByIndex", index)
    if handle is None:
        gpu["status"] = errors["handle"]
        return gpu
    gpu["uuid"] = _text(f.call("uuid", "nvmlDeviceGetUUID", handle))
    if errors.get("uuid") == "gpu_lost":  # fallen off the bus: every further call answers the same
        gpu["status"] = "gpu_lost"
        return gpu
    serial = _text(f.call("serial", "nvmlDeviceGetSerial", handle))
    gpu["serial"] = serial if serial else None
    gpu["name"] = _text(f.call("name", "nvmlDeviceGetName", handle))
    pci = f.call("pci_bus_id", "nvmlDeviceGetPciInfo", handle)
    gpu["pci_bus_id"] = _text(pci.busId) if pci is not None else None
    gpu["pci_device_id"] = f"0x{pci.pciDeviceId:08X}" if pci is not None else None
    gpu["vbios_version"] = _text(f.call("vbios_version", "nvmlDeviceGetVbiosVersion", handle))
    cc = f.call("compute_capability", "nvmlDeviceGetCudaComputeCapability", handle)
    gpu["compute_capability"] = f"{cc[0]}.{cc[1]}" if cc is not None else None
    mode = f.call("compute_mode", "nvmlDeviceGetComputeMode", handle)
    gpu["compute_mode"] = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}.get(
        mode, None if mode is None else str(mode))
    pstate = f.call("pstate", "nvmlDeviceGetPerformanceState", handle)
    gpu["pstate"] = None if pstate is None or pstate == 32 else f"P{pstate}"
    persistence = f.call("persistence_mode", "nvmlDeviceGetPersistenceMode", handle)
    gpu["persistence_mode"] = None if persistence is None else bool(persistence)
    gpu["recovery_action"] = _field_value(f, "recovery_action", handle, _FI_DEV_GET_GPU_RECOVERY_ACTION)

    constraints = f.call("power.min_limit_w", "nvmlDeviceGetPowerManagementLimitConstraints", handle)
    if constraints is None and "power.min_limit_w" in errors:
        errors["power.max_limit_w"] = errors["power.min_limit_w"]
    gpu["power"] = {
        "limit_w": _watts(f.call("power.limit_w", "nvmlDeviceGetPowerManagementLimit", handle)),
        "default_limit_w": _watts(f.call("power.default_limit_w", "nvmlDeviceGetPowerManagementDefaultLimit",
                                         handle)),
        "min_limit_w": _watts(constraints[0]) if constraints is not None else None,
        "max_limit_w": _watts(constraints[1]) if constraints is not None else None,
        "enforced_limit_w": _watts(f.call("power.enforced_limit_w", "nvmlDeviceGetEnforcedPowerLimit", handle)),
        "draw_w": _watts(f.call("power.draw_w", "nvmlDeviceGetPowerUsage", handle)),
    }

    gpu["temperature"] = {
        "gpu_c": f.call("temperature.gpu_c", "nvmlDeviceGetTemperature", handle, _TEMP_GPU),
        "memory_c": _field_value(f, "temperature.memory_c", handle, _FI_DEV_MEMORY_TEMP),
        "shutdown_c": f.call("temperature.shutdown_c", "nvmlDeviceGetTemperatureThreshold", handle,
                             _THRESHOLD_SHUTDOWN),
        "slowdown_c": f.call("temperature.slowdown_c", "nvmlDeviceGetTemperatureThreshold", handle,
                             _THRESHOLD_SLOWDOWN),
        "memory_max_c": f.call("temperature.memory_max_c", "nvmlDeviceGetTemperatureThreshold", handle,
                               _THRESHOLD_MEM_MAX),
        "gpu_max_c": f.call("temperature.gpu_max_c", "nvmlDeviceGetTemperatureThreshold", handle,
                            _THRESHOLD_GPU_MAX),
    }
    gpu["clocks"] = {
        "sm_mhz": f.call("clocks.sm_mhz", "nvmlDeviceGetClockInfo", handle, _CLOCK_SM),
        "memory_mhz": f.call("clocks.memory_mhz", "nvmlDeviceGetClockInfo", handle, _CLOCK_MEM),
        "graphics_mhz": f.call("clocks.graphics_mhz", "nvmlDeviceGetClockInfo", handle, _CLOCK_GRAPHICS),
        "max_sm_mhz": f.call("clocks.max_sm_mhz", "nvmlDeviceGetMaxClockInfo", handle, _CLOCK_SM),
        "max_memory_mhz": f.call("clocks.max_memory_mhz", "nvmlDeviceGetMaxClockInfo", handle, _CLOCK_MEM),
        "max_graphics_mhz": f.call("clocks.max_graphics_mhz", "nvmlDeviceGetMaxClockInfo", handle, _CLOCK_GRAPHICS),
    }
    active = f.call("clock_event_reasons.active_mask", "nvmlDeviceGetCurrentClocksEventReasons", handle,
                    alt="nvmlDeviceGetCurrentClocksThrottleReasons")
    supported = f.call("clock_event_reasons.supported_mask", "nvmlDeviceGetSupportedClocksEventReasons", handle,
                       alt="nvmlDeviceGetSupportedClocksThrottleReasons")
    names, hardware = decode_clock_event_reasons(active) if active is not None else (None, None)
    gpu["clock_event_reasons"] = {
        "active_mask": hex_mask(active) if active is not None else None,
        "supported_mask": hex_mask(supported) if supported is not None else None,
        "active": names,
        "hardware_problems": hardware,
    }

    mem = f.call("memory.total_mib", "nvmlDeviceGetMemoryInfo", handle)
    if mem is None:
        errors["memory.used_mib"] = errors["memory.free_mib"] = errors["memory.total_mib"]
    gpu["memory"] = {
        "total_mib": _mib(mem.total) if mem is not None else None,
        "used_mib": _mib(mem.used) if mem is not None else None,
        "free_mib": _mib(mem.free) if mem is not None else None,
    }
    util = f.call("utilization.gpu_pct", "nvmlDeviceGetUtilizationRates", handle)
    if util is None:
        errors["utilization.memory_pct"] = errors["utilization.gpu_pct"]
    gpu["utilization"] = {
        "gpu_pct": util.gpu if util is not None else None,
        "memory_pct": util.memory if util is not None else None,
    }

    ecc_mode = f.call("ecc.mode_current", "nvmlDeviceGetEccMode", handle)
    if ecc_mode is None:
        errors["ecc.mode_pending"] = errors["ecc.mode_current"]
    gpu["ecc"] = {
        "mode_current": bool(ecc_mode[0]) if ecc_mode is not None else None,
        "mode_pending": bool(ecc_mode[1]) if ecc_mode is not None else None,
        "volatile_corrected": f.call("ecc.volatile_corrected", "nvmlDeviceGetTotalEccErrors", handle,
                                     _ECC_CORRECTED, _ECC_VOLATILE),
        "volatile_uncorrected": f.call("ecc.volatile_uncorrected", "nvmlDeviceGetTotalEccErrors", handle,
                                       _ECC_UNCORRECTED, _ECC_VOLATILE),
        "aggregate_corrected": f.call("ecc.aggregate_corrected", "nvmlDeviceGetTotalEccErrors", handle,
                                      _ECC_CORRECTED, _ECC_AGGREGATE),
        "aggregate_uncorrected": f.call("ecc.aggregate_uncorrected", "nvmlDeviceGetTotalEccErrors", handle,
                                        _ECC_UNCORRECTED, _ECC_AGGREGATE),
    }
    remap = f.call("row_remap.correctable", "nvmlDeviceGetRemappedRows", handle)
    if remap is None:
        for key in ("uncorrectable", "pending", "failure"):
            errors["row_remap." + key] = errors["row_remap.correctable"]
    gpu["row_remap"] = {
        "correctable": remap[0] if remap is not None else None,
        "uncorrectable": remap[1] if remap is not None else None,
        "pending": bool(remap[2]) if remap is not None else None,
        "failure": bool(remap[3]) if remap is not None else None,
    }
    retired = f.call("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus", handle)
    gpu["retired_pages_pending"] = None if retired is None else bool(retired)

    gpu["pcie"] = {
        "gen_current": f.call("pcie.gen_current", "nvmlDeviceGetCurrPcieLinkGeneration", handle),
        "gen_max": f.call("pcie.gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", handle),
        "gen_gpu_max": f.call("pcie.gen_gpu_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration", handle),
        "width_current": f.call("pcie.width_current", "nvmlDeviceGetCurrPcieLinkWidth", handle),
        "width_max": f.call("pcie.width_max", "nvmlDeviceGetMaxPcieLinkWidth", handle),
    }
    gpu["nvlink"] = _nvlink(nvml, handle, errors)
    gpu["mig"] = _mig(nvml, f, handle, errors)
    gpu["processes"] = _processes(nvml, f, handle)

    if "gpu_lost" in errors.values():
        gpu["status"] = "gpu_lost"
    return gpu


def _field_value(f: _Fields, key: str, handle: Any, field_id: int) -> Any:
    values = f.call(key, "nvmlDeviceGetFieldValues", handle, [field_id])
    if values is None:
        return None
    try:
        value = values[0]
        ret = int(value.nvmlReturn)
        if ret != 0:
            f.fail(key, NVML_STATUS.get(ret, f"unknown:{ret}"))
            return None
        kind = int(value.valueType)
        member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(kind)
        if member is None:
            f.fail(key, f"unknown_value_type:{kind}")
            return None
        return getattr(value.value, member)
    except Exception as exc:
        f.fail(key, f"error:{type(exc).__name__}")
        return None


def _nvlink(nvml: Any, handle: Any, errors: dict[str, str]) -> dict[str, Any]:
    links = []
    fn = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
    status = None
    if fn is None:
        status = "function_not_found"
    else:
        for link in range(_NVLINK_MAX_LINKS):
            try:
                state = fn(handle, link)
            except Exception as exc:
                code = nvml_status(exc)
                # Past the last link NVML answers not_supported / invalid_argument: that ends the list.
                if link == 0 or code not in ("not_supported", _INVALID_ARGUMENT_STATUS):
                    status = code
                break
            links.append({"link": link, "up": bool(state)})
    if status is not None and not links:
        if status != "not_supported":
            errors["nvlink"] = status
        return {"supported": False if status == "not_supported" else None, "links": [], "up": None, "down": []}
    if status is not None:
        errors["nvlink"] = status
    return {
        "supported": True,
        "links": links,
        "up": sum(1 for link in links if link["up"]),
        "down": [link["link"] for link in links if not link["up"]],
    }


def _profile_name(info: Any) -> str | None:
    name = _text(getattr(info, "name", None))
    if not name:
        return None
    return name[4:] if name.startswith("MIG ") else name


def _mig(nvml: Any, f: _Fields, handle: Any, errors: dict[str, str]) -> dict[str, Any]:
    mode = f.call("mig.mode_current", "nvmlDeviceGetMigMode", handle)
    if mode is None:
        errors["mig.mode_pending"] = errors["mig.mode_current"]
        return {"mode_current": None, "mode_pending": None, "gpu_instances": []}
    result: dict[str, Any] = {"mode_current": bool(mode[0]), "mode_pending": bool(mode[1]), "gpu_instances": []}
    if not mode[0]:
        return result
    try:
        result["gpu_instances"] = _gpu_instances(nvml, handle, errors)
    except Exception as exc:
        errors["mig.gpu_instances"] = nvml_status(exc)
    return result


def _gpu_instances(nvml: Any, handle: Any, errors: dict[str, str]) -> list[dict[str, Any]]:
    import ctypes

    mig_uuids = _mig_device_uuids(nvml, handle, errors)
    instances = []
    for enum in range(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", _GI_PROFILE_COUNT)):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum)
        except Exception as exc:
            if nvml_status(exc) in ("not_supported", _INVALID_ARGUMENT_STATUS):
                continue
            errors["mig.gpu_instances"] = nvml_status(exc)
            continue
        if not info.instanceCount:
            continue
        array = (nvml.c_nvmlGpuInstance_t * info.instanceCount)()
        count = ctypes.c_uint(info.instanceCount)
        try:
            nvml.nvmlDeviceGetGpuInstances(handle, info.id, array, ctypes.byref(count))
        except Exception as exc:
            errors["mig.gpu_instances"] = nvml_status(exc)
            continue
        for k in range(count.value):
            gi = array[k]
            try:
                gi_info = nvml.nvmlGpuInstanceGetInfo(gi)
            except Exception as exc:
                errors["mig.gpu_instances"] = nvml_status(exc)
                continue
            instances.append({
                "id": gi_info.id,
                "profile_id": gi_info.profileId,
                "profile_name": _profile_name(info),
                "placement": {"start": gi_info.placement.start, "size": gi_info.placement.size},
                "compute_instances": _compute_instances(nvml, gi, gi_info.id, mig_uuids, errors),
            })
    instances.sort(key=lambda gi: gi["id"])
    return instances


def _compute_instances(nvml: Any, gi: Any, gi_id: int, mig_uuids: dict[tuple[int, int], str],
                       errors: dict[str, str]) -> list[dict[str, Any]]:
    import ctypes

    result = []
    seen = set()
    for enum in range(getattr(nvml, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", _CI_PROFILE_COUNT)):
        try:
            info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, enum, _CI_ENGINE_SHARED)
        except Exception as exc:
            if nvml_status(exc) in ("not_supported", _INVALID_ARGUMENT_STATUS):
                continue
            errors["mig.compute_instances"] = nvml_status(exc)
            continue
        if not info.instanceCount or info.id in seen:
            continue
        seen.add(info.id)
        array = (nvml.c_nvmlComputeInstance_t * info.instanceCount)()
        count = ctypes.c_uint(info.instanceCount)
        try:
            nvml.nvmlGpuInstanceGetComputeInstances(gi, info.id, array, ctypes.byref(count))
        except Exception as exc:
            errors["mig.compute_instances"] = nvml_status(exc)
            continue
        for k in range(count.value):
            try:
                ci_info = nvml.nvmlComputeInstanceGetInfo(array[k])
            except Exception as exc:
                errors["mig.compute_instances"] = nvml_status(exc)
                continue
            result.append({
                "id": ci_info.id,
                "profile_id": ci_info.profileId,
                "profile_name": _profile_name(info),
                "placement": {"start": ci_info.placement.start, "size": ci_info.placement.size},
                "uuid": mig_uuids.get((gi_id, ci_info.id)),
            })
    result.sort(key=lambda ci: ci["id"])
    return result


def _mig_device_uuids(nvml: Any, handle: Any, errors: dict[str, str]) -> dict[tuple[int, int], str]:
    uuids: dict[tuple[int, int], str] = {}
    try:
        count = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    except Exception as exc:
        errors["mig.uuids"] = nvml_status(exc)
        return uuids
    for i in range(count):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except Exception:  # NOT_FOUND for unused slots
            continue
        try:
            key = (nvml.nvmlDeviceGetGpuInstanceId(mig), nvml.nvmlDeviceGetComputeInstanceId(mig))
            uuids[key] = _text(nvml.nvmlDeviceGetUUID(mig))
        except Exception as exc:
            errors["mig.uuids"] = nvml_status(exc)
    return uuids


def _processes(nvml: Any, f: _Fields, handle: Any) -> list[dict[str, Any]] | None:
    procs = f.call("processes", "nvmlDeviceGetComputeRunningProcesses", handle)
    if procs is None:
        return None
    result = []
    for proc in procs:
        pid = int(proc.pid)
        name = None
        try:
            name = _text(nvml.nvmlSystemGetProcessName(pid))
        except Exception:  # the name is a courtesy; /proc may know it
            try:
                with open(f"/proc/{pid}/comm") as fh:
                    name = fh.read().strip()
            except OSError:
                name = None
        gi = getattr(proc, "gpuInstanceId", _INVALID_ID)
        ci = getattr(proc, "computeInstanceId", _INVALID_ID)
        result.append({
            "pid": pid,
            "name": name or None,
            "used_mib": _mib(getattr(proc, "usedGpuMemory", None)),
            "gpu_instance_id": None if gi in (None, _INVALID_ID) else int(gi),
            "compute_instance_id": None if ci in (None, _INVALID_ID) else int(ci),
        })
    return result


# ----------------------------------------------------------------------------------------------------------------
# System: NVML versions, services, nccl.conf, kernel log
# ----------------------------------------------------------------------------------------------------------------


def _cuda_version(value: Any) -> str | None:
    if value is None:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"


def collect_nvml(nvml: Any = None) -> dict[str, Any]:
    """The NVML part of the document: versions and GPUs, or ``nvml_error`` when NVML cannot be initialised."""
    doc: dict[str, Any] = {
        "nvml_error": None,
        "nvml_error_message": None,
        "driver_version": None,
        "cuda_driver_version": None,
        "nvml_version": None,
        "errors": {},
        "gpu_count": None,
        "gpus": [],
    }
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError as exc:
            doc["nvml_error"] = "pynvml_not_installed"
            doc["nvml_error_message"] = str(exc)
            return doc
    try:
        nvml.nvmlInit()
    except Exception as exc:
        doc["nvml_error"] = nvml_status(exc)
        doc["nvml_error_message"] = str(exc)
        return doc
    try:
        f = _Fields(nvml, doc["errors"])
        doc["driver_version"] = _text(f.call("driver_version", "nvmlSystemGetDriverVersion"))
        doc["cuda_driver_version"] = _cuda_version(f.call("cuda_driver_version", "nvmlSystemGetCudaDriverVersion_v2",
                                                          alt="nvmlSystemGetCudaDriverVersion"))
        doc["nvml_version"] = _text(f.call("nvml_version", "nvmlSystemGetNVMLVersion"))
        count = f.call("gpu_count", "nvmlDeviceGetCount")
        doc["gpu_count"] = count
        doc["gpus"] = [_probe_gpu(nvml, i) for i in range(count or 0)]
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # nothing useful to do
            pass
    return doc

