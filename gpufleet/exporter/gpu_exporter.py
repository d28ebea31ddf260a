"""gpufleet-gpu-exporter: GPU metrics from NVML in dcgm-exporter's names and labels, plus what gpufleet knows.

Node-side and standalone (Python 3.9+, nvidia-ml-py and prometheus-client, shipped together in one zip file):

    python3 gpufleet-gpu-exporter.pyz --listen 0.0.0.0:9400 [--settings-dir /etc/gpufleet]

Each scrape reads NVML afresh and renders dcgm-exporter's exposition (names, types, labels), so one set of rules and
dashboards serves both exporters; a metric the GPU does not support is left out, as dcgm-exporter does. Xids come
from NVML's events in a background thread (:class:`XidWatcher`). ``gpufleet_gpu_mig_layout_match`` is gpufleet's
own: the MIG stage's layout against the GPU, judged by ``mig_compare.py``. docs/monitoring.md lists the metrics.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pynvml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.process_collector import ProcessCollector

try:  # in the bundle every module is top level
    import web
    from mig_compare import applied as mig_applied
    from mig_compare import mode_of, norm_bus
    from xid_err_msg import err_msg
except ImportError:  # pragma: no cover - imported from the gpufleet package (docs, tools)
    from gpufleet.exporter import web
    from gpufleet.exporter.xid_err_msg import err_msg
    from gpufleet.node.mig_compare import applied as mig_applied
    from gpufleet.node.mig_compare import mode_of, norm_bus

SETTINGS_DIR = "/etc/gpufleet"
LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION")
XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"

# name -> (Prometheus type as dcgm-exporter's counters file gives it, help); the order is the exposition order
METRICS = {
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gauge", "Memory temperature (in C)."),
    "DCGM_FI_DEV_SLOWDOWN_TEMP": ("gauge", "Slowdown temperature threshold of the GPU (in C)."),
    "DCGM_FI_DEV_SHUTDOWN_TEMP": ("gauge", "Shutdown temperature threshold of the GPU (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("gauge", "Current power limit (in W)."),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("counter", "Total energy consumption since boot (in mJ)."),
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz)."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "Framebuffer memory reserved (in MiB)."),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("gauge", "Current clock event reasons (bitmask)."),
    "DCGM_FI_DEV_PERSISTENCE_MODE": ("gauge", "Persistence mode (1 enabled)."),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("counter", "Total number of single-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Total number of double-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("counter", "Total number of single-bit persistent ECC errors."),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("counter", "Total number of double-bit persistent ECC errors."),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for correctable errors"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for uncorrectable errors"),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("gauge", "Whether remapping of rows is pending"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "Total number of PCIe retries."),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("counter", "Total number of NVLink flow-control CRC errors."),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": ("counter", "Total number of NVLink data CRC errors."),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("counter", "Total number of NVLink retries."),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": ("counter", "Total number of NVLink recovery errors."),
    "DCGM_FI_DEV_MIG_MODE": ("gauge", "MIG mode (1 enabled)."),
    XID_METRIC: ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": ("gauge", "Recovery action the driver asks for (nvmlGpuRecoveryAction_t: "
                                            "0 none; 1 GPU reset; 2 node reboot; 3 drain P2P; 4 drain and reset)."),
    "gpufleet_gpu_mig_layout_match": ("gauge",
                                      "1 when MIG mode and GPU instances are the layout gpufleet applied, else 0."),
}
# DCGM's floating-point fields (printed with six decimals as dcgm-exporter prints them); the others are integers
DOUBLE_FIELDS = ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_POWER_MGMT_LIMIT")
# NVML field values read per GPU: field id -> metric (DCGM reads these fields through nvmlDeviceGetFieldValues too)
FIELD_VALUES = {
    pynvml.NVML_FI_DEV_MEMORY_TEMP: "DCGM_FI_DEV_MEMORY_TEMP",
    pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
}
_FIELD_VALUE_TYPES = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


class Family:
    """One metric of the exposition: name, Prometheus type, help and samples ([(label, value)] pairs, value)."""

    def __init__(self, name: str, kind: str, help_text: str):
        self.name, self.kind, self.help = name, kind, help_text
        self.samples: list[tuple[list[tuple[str, str]], float]] = []

    def add(self, labels, value: float) -> None:
        self.samples.append((list(labels), value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value(name: str, value: float) -> str:
    if name in DOUBLE_FIELDS:
        return f"{value:f}"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def exposition(families) -> str:
    """Prometheus text format 0.0.4 of ``families``, each with its own name and type (prometheus-client would append
    ``_total`` to a counter's name: dcgm-exporter's counters keep theirs)."""
    out = []
    for family in families:
        if not family.samples:
            continue
        out += [f"# HELP {family.name} {family.help}", f"# TYPE {family.name} {family.kind}"]
        for labels, value in family.samples:
            text = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels)
            out.append(f"{family.name}{{{text}}} {_value(family.name, value)}" if text
                       else f"{family.name} {_value(family.name, value)}")
    return "\n".join(out) + "\n" if out else ""


def _nvml_optional(call, *args):
    """The value, or None when this GPU does not support the query."""
    try:
        return call(*args)
    except pynvml.NVMLError as error:
        if error.value in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                           pynvml.NVML_ERROR_NO_PERMISSION, pynvml.NVML_ERROR_INVALID_ARGUMENT):
            return None
        raise


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def gpu_instances(handle) -> list:
    """(profile id, whole) of each GPU instance of a MIG-enabled GPU (the probe's walk: every profile, its instances);
    ``whole`` when it holds exactly one compute instance spanning it (the shared comparison's input)."""
    found = []
    for profile in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = _nvml_optional(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, profile)
        if info is None or not info.instanceCount:
            continue
        array = (pynvml.c_nvmlGpuInstance_t * info.instanceCount)()
        count = ctypes.c_uint(info.instanceCount)
        pynvml.nvmlDeviceGetGpuInstances(handle, info.id, array, ctypes.byref(count))
        found += [(info.id, _compute_slices(array[k]) == [info.sliceCount]) for k in range(count.value)]
    return found


def _compute_slices(gpu_instance) -> list:
    """The compute-slice count of each compute instance of a GPU instance."""
    slices = []
    seen = set()
    for profile in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        info = _nvml_optional(pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gpu_instance, profile,
                              pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        if info is None or not info.instanceCount or info.id in seen:
            continue
        seen.add(info.id)
        array = (pynvml.c_nvmlComputeInstance_t * info.instanceCount)()
        count = ctypes.c_uint(info.instanceCount)
        pynvml.nvmlGpuInstanceGetComputeInstances(gpu_instance, info.id, array, ctypes.byref(count))
        slices += [info.sliceCount] * count.value
    return slices


class XidWatcher:
    """NVML Xid events of every GPU, in a background thread: last Xid and count per GPU UUID."""

    WAIT_MS = 1000
    RETRY_S = 5.0

    def __init__(self, log=None):
        self.lock = threading.Lock()
        self.last: dict[str, int] = {}  # UUID -> last Xid (0: registered, none yet)
        self.counts: Counter = Counter()  # (UUID, xid) -> events
        self.supported: dict[str, bool] = {}  # UUID -> Xid events registered
        self.stop = threading.Event()
        self.log = log or (lambda text: print(f"gpufleet-gpu-exporter: {text}", file=sys.stderr, flush=True))
        self._told: set[str] = set()
        self.thread = threading.Thread(target=self.run, name="xid-events", daemon=True)

    def start(self) -> XidWatcher:
        self.thread.start()
        return self

    def snapshot(self):
        with self.lock:
            return dict(self.last), Counter(self.counts), dict(self.supported)

    def _say_once(self, text: str) -> None:
        if text not in self._told:
            self._told.add(text)
            self.log(text)

    def _register(self):
        """A new event set with every GPU that supports Xid events; {index: UUID} of those."""
        event_set = pynvml.nvmlEventSetCreate()
        registered = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            except pynvml.NVMLError:
                continue  # lost GPU: the collector reports it
            supported = _nvml_optional(pynvml.nvmlDeviceGetSupportedEventTypes, handle)
            ok = bool(supported and supported & pynvml.nvmlEventTypeXidCriticalError)
            if ok:
                try:
                    pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
                except pynvml.NVMLError as error:
                    ok = False
                    self._say_once(f"GPU {index} ({uuid}): Xid events cannot be registered ({error})")
            if not ok:
                self._say_once(f"GPU {index} ({uuid}): NVML has no Xid events here (NOT_SUPPORTED): "
                               "DCGM_FI_DEV_XID_ERRORS is not exported for it")
            with self.lock:
                self.supported[uuid] = ok
                if ok:
                    self.last.setdefault(uuid, 0)
            if ok:
                registered[index] = uuid
        return event_set, registered

    def run(self) -> None:
        while not self.stop.is_set():
            event_set = None
            try:
                pynvml.nvmlInit()  # reference-counted: the collector's init is separate
            except pynvml.NVMLError as error:
                self._say_once(f"Xid events: NVML unavailable ({error}); retrying")
                self.stop.wait(self.RETRY_S)
                continue
            try:
                event_set, registered = self._register()
                if not registered:
                    self.stop.wait(self.RETRY_S * 12)  # nothing to wait on; look again (a GPU may come back)
                    continue
                self._wait(event_set, registered)
            except pynvml.NVMLError as error:
                self._say_once(f"Xid events: {error}; registering again")
                self.stop.wait(self.RETRY_S)
            finally:
                if event_set is not None:
                    try:
                        pynvml.nvmlEventSetFree(event_set)
                    except pynvml.NVMLError:
                        pass
                try:
                    pynvml.nvmlShutdown()
                except pynvml.NVMLError:
                    pass

    def _wait(self, event_set, registered: dict[int, str]) -> None:
        while not self.stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait_v2(event_set, self.WAIT_MS)
            except pynvml.NVMLError as error:
                if error.value == pynvml.NVML_ERROR_TIMEOUT:
                    continue
                raise
            if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                continue
            uuid = registered.get(pynvml.nvmlDeviceGetIndex(data.device))
            if uuid is None:
                continue
            code = int(data.eventData)
            with self.lock:
                self.last[uuid] = code
                self.counts[(uuid, code)] += 1
            self.log(f"GPU {uuid}: Xid {code}")


class GpuCollector:
    """One NVML read of every GPU per scrape."""

    def __init__(self, settings_dir: str = SETTINGS_DIR, hostname: str | None = None,
                 xids: XidWatcher | None = None):
        self.xids = xids
        self.settings_dir = settings_dir
        self.hostname = hostname or socket.gethostname()
        self.lock = threading.Lock()  # NVML handles are shared by concurrent scrapes
        self.initialized = False
        self.init_error: str | None = None

    def _mig_layout(self):
        layout = read_json(os.path.join(self.settings_dir, "mig-layout.json"))
        return {norm_bus(g["pci_bus_id"]): g for g in layout.get("gpus") or []
                if isinstance(g, dict) and isinstance(g.get("pci_bus_id"), str)}

    def _nvml_ready(self) -> bool:
        """NVML initialised (retried at every scrape: the driver may load after the exporter started)."""
        if not self.initialized:
            try:
                pynvml.nvmlInit()
                self.initialized = True
            except pynvml.NVMLError as error:
                self.init_error = str(error)
        return self.initialized

    def families(self) -> list[Family]:
        """Every metric of one collection, in exposition order."""
        with self.lock:
            ready = self._nvml_ready()
            samples, errors = self._read() if ready else ({}, 0)
        out = list(self._xid_families(samples))
        up = Family("gpufleet_gpu_exporter_nvml_up", "gauge", "1 when NVML answers (the driver is loaded).")
        up.add([("hostname", self.hostname)], 1 if ready else 0)
        out.append(up)
        for name, (kind, help_text) in METRICS.items():
            family = Family(name, kind, help_text)
            for labels, value in samples.get(name, []):
                family.add(labels, value)
            out.append(family)
        errors_family = Family("gpufleet_gpu_exporter_errors", "gauge", "GPUs NVML could not read in this scrape.")
        errors_family.add([("hostname", self.hostname)], errors)
        out.append(errors_family)
        return out

    def _xid_families(self, samples):
        """The Xid counter and the events-supported flag, labelled like the GPU's other series."""
        if self.xids is None:
            return
        _, counts, supported = self.xids.snapshot()
        labels_of = {dict(labels)["UUID"]: labels for labels, _ in samples.get("DCGM_FI_DEV_GPU_TEMP", [])}
        flag = Family("gpufleet_gpu_exporter_xid_events_supported", "gauge",
                      "1 when NVML delivers Xid events for this GPU (else no Xid series for it).")
        total = Family("gpufleet_gpu_xid_errors_total", "counter", "Xid errors of this GPU since the exporter started.")
        for uuid, labels in labels_of.items():
            if uuid in supported:
                flag.add(labels, 1 if supported[uuid] else 0)
        for (uuid, code), count in sorted(counts.items()):
            if uuid in labels_of:
                total.add([*labels_of[uuid], ("xid", str(code))], count)
        yield flag
        yield total

    def _read(self):
        mig = self._mig_layout()
        samples: dict[str, list] = {}
        errors = 0
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        for index in range(pynvml.nvmlDeviceGetCount()):
            try:
                self._read_gpu(index, driver, mig, samples)
            except pynvml.NVMLError:
                errors += 1
        return samples, errors

    def _read_gpu(self, index, driver, mig, samples):
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(pynvml.nvmlDeviceGetUUID(h))
        bus = _text(pynvml.nvmlDeviceGetPciInfo(h).busId)
        minor = _nvml_optional(pynvml.nvmlDeviceGetMinorNumber, h)
        labels = [("gpu", str(index)), ("UUID", uuid), ("pci_bus_id", bus),
                  ("device", f"nvidia{minor if minor is not None else index}"),
                  ("modelName", _text(pynvml.nvmlDeviceGetName(h))), ("Hostname", self.hostname),
                  ("DCGM_FI_DRIVER_VERSION", driver)]
        values = {}
        values["DCGM_FI_DEV_GPU_TEMP"] = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        values.update(self._field_values(h))
        values["DCGM_FI_DEV_SLOWDOWN_TEMP"] = _nvml_optional(pynvml.nvmlDeviceGetTemperatureThreshold, h,
                                                             pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        values["DCGM_FI_DEV_SHUTDOWN_TEMP"] = _nvml_optional(pynvml.nvmlDeviceGetTemperatureThreshold, h,
                                                             pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
        draw = _nvml_optional(pynvml.nvmlDeviceGetPowerUsage, h)
        values["DCGM_FI_DEV_POWER_USAGE"] = None if draw is None else draw / 1000.0
        limit = _nvml_optional(pynvml.nvmlDeviceGetPowerManagementLimit, h)
        values["DCGM_FI_DEV_POWER_MGMT_LIMIT"] = None if limit is None else limit / 1000.0
        values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] = _nvml_optional(
            pynvml.nvmlDeviceGetTotalEnergyConsumption, h)
        values["DCGM_FI_DEV_SM_CLOCK"] = _nvml_optional(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
        values["DCGM_FI_DEV_MEM_CLOCK"] = _nvml_optional(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM)
        util = _nvml_optional(pynvml.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            values["DCGM_FI_DEV_GPU_UTIL"] = util.gpu
            values["DCGM_FI_DEV_MEM_COPY_UTIL"] = util.memory
        values.update(self._memory(h))
        values["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] = _nvml_optional(
            pynvml.nvmlDeviceGetCurrentClocksEventReasons, h)
        persistence = _nvml_optional(pynvml.nvmlDeviceGetPersistenceMode, h)
        values["DCGM_FI_DEV_PERSISTENCE_MODE"] = persistence
        for name, bit, counter in (("SBE_VOL", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
                                   ("DBE_VOL", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
                                   ("SBE_AGG", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
                                   ("DBE_AGG", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                    pynvml.NVML_AGGREGATE_ECC)):
            values[f"DCGM_FI_DEV_ECC_{name}_TOTAL"] = _nvml_optional(pynvml.nvmlDeviceGetTotalEccErrors, h, bit,
                                                                     counter)
        remap = _nvml_optional(pynvml.nvmlDeviceGetRemappedRows, h)
        if remap is not None:
            (values["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"], values["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"],
             values["DCGM_FI_DEV_ROW_REMAP_PENDING"], values["DCGM_FI_DEV_ROW_REMAP_FAILURE"]) = remap
        values["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] = _nvml_optional(pynvml.nvmlDeviceGetPcieReplayCounter, h)
        mig_mode = _nvml_optional(pynvml.nvmlDeviceGetMigMode, h)
        current_mig = None if mig_mode is None else mig_mode[0]
        values["DCGM_FI_DEV_MIG_MODE"] = current_mig
        wanted = mig.get(norm_bus(bus))
        if wanted is not None:
            values["gpufleet_gpu_mig_layout_match"] = self._mig_match(h, wanted, mig_mode)
        for name, value in values.items():
            if value is not None:
                samples.setdefault(name, []).append((labels, float(value)))
        if self.xids is not None:
            last, _, supported = self.xids.snapshot()
            if supported.get(uuid):  # dcgm-exporter's shape: the last Xid, with its code and text as labels
                code = last.get(uuid, 0)
                samples.setdefault(XID_METRIC, []).append(
                    ([*labels, ("err_code", str(code)), ("err_msg", err_msg(code))], float(code)))

    @staticmethod
    def _memory(handle) -> dict:
        """FB_USED / FB_FREE / FB_RESERVED in MiB as DCGM reads them: NVML's v2 memory info (used without the
        driver's reserved memory); v1 where the driver has no v2 (its used includes the reserved memory)."""
        mib = 1024 * 1024
        try:
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        except pynvml.NVMLError as error:
            if error.value not in (pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                                   pynvml.NVML_ERROR_NOT_SUPPORTED):
                raise
            memory = _nvml_optional(pynvml.nvmlDeviceGetMemoryInfo, handle)
            if memory is None:
                return {}
            return {"DCGM_FI_DEV_FB_FREE": memory.free // mib, "DCGM_FI_DEV_FB_USED": memory.used // mib}
        return {"DCGM_FI_DEV_FB_FREE": memory.free // mib, "DCGM_FI_DEV_FB_USED": memory.used // mib,
                "DCGM_FI_DEV_FB_RESERVED": memory.reserved // mib}

    @staticmethod
    def _field_values(handle) -> dict:
        """The NVML field values of FIELD_VALUES (one call); a field the GPU does not support is left out."""
        try:
            found = pynvml.nvmlDeviceGetFieldValues(handle, list(FIELD_VALUES))
        except pynvml.NVMLError as error:
            if error.value in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                return {}
            raise
        values = {}
        for value in found:
            member = _FIELD_VALUE_TYPES.get(value.valueType)
            if value.nvmlReturn == pynvml.NVML_SUCCESS and member is not None:
                values[FIELD_VALUES[value.fieldId]] = getattr(value.value, member)
        return values

    @staticmethod
    def _mig_match(handle, wanted: dict, mig_mode) -> int:
        """1 when the GPU is as its entry of the layout file says (the shared comparison, ``mig_compare``)."""
        current, pending = (None, None) if mig_mode is None else (mode_of(mig_mode[0]), mode_of(mig_mode[1]))
        enabled = bool(wanted.get("mig_enabled"))
        instances = gpu_instances(handle) if enabled and current else []
        return int(mig_applied(enabled, wanted.get("create") or [], True, current, pending, instances))


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"--listen {text!r}: expected ADDRESS:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def scrape_text(collector: GpuCollector, process: CollectorRegistry | None = None) -> str:
    """One scrape: the GPU metrics in dcgm-exporter's exposition, then the exporter's own process metrics."""
    text = exposition(collector.families())
    return text + (generate_latest(process).decode() if process is not None else "")


def process_registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProcessCollector(registry=None))
    return registry


def serve(address: str, port: int, collector: GpuCollector,
          web_config: web.WebConfig | None = None) -> ThreadingHTTPServer:
    """``/metrics`` on ADDRESS:PORT (text format 0.0.4, as dcgm-exporter serves it), in a background thread; basic
    auth and TLS as ``web_config`` (exporter-toolkit's web configuration file, :mod:`web`) says."""
    process = process_registry()
    web_config = web_config or web.WebConfig(None)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # http.server's name
            if not web.guard(self, web_config):
                return
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = scrape_text(collector, process).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            web.add_headers(self, web_config)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
    server = server_class((address, port), Handler)
    web.wrap_tls(server, web_config)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpufleet-gpu-exporter", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=parse_listen, default=("0.0.0.0", 9400), help="ADDRESS:PORT")
    parser.add_argument("--settings-dir", default=SETTINGS_DIR)
    parser.add_argument("--web-config-file", default="",
                        help="exporter-toolkit web configuration (basic auth, TLS), as dcgm-exporter's flag")
    args = parser.parse_args(argv)
    try:
        web_config = web.WebConfig(args.web_config_file or None)
    except web.WebConfigError as error:
        print(f"gpufleet-gpu-exporter: {error}", file=sys.stderr, flush=True)
        return 2
    xids = XidWatcher().start()
    address, port = args.listen
    try:
        serve(address, port, GpuCollector(args.settings_dir, xids=xids), web_config)
    except web.WebConfigError as error:
        print(f"gpufleet-gpu-exporter: {error}", file=sys.stderr, flush=True)
        return 2
    print(f"gpufleet-gpu-exporter: listening on {address}:{port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    xids.stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
