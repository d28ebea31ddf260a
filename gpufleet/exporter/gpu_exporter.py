"""gpufleet-gpu-exporter: GPU metrics from NVML in dcgm-exporter's names and labels, plus what gpufleet knows.

Node-side program, standalone: Python 3.9+, nvidia-ml-py (``pynvml``) and prometheus-client; it imports nothing
else from gpufleet (the deploy ships it with both libraries in one zip file, like verify ships its probe).

    python3 gpufleet-gpu-exporter.pyz --listen 0.0.0.0:9400 [--settings-dir /etc/gpufleet]

Every scrape reads NVML afresh (no background polling): one series per GPU for each metric below, labelled like
dcgm-exporter's (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``hostname``, and
``DCGM_FI_DRIVER_VERSION``), so one set of rules and dashboards serves both exporters. A metric the GPU does not
support (NVML ``NOT_SUPPORTED``) is left out for that GPU, as dcgm-exporter does; a GPU NVML cannot reach
(fallen off the bus) exports nothing but ``gpufleet_gpu_exporter_errors``.

gpufleet extra (DCGM has no such field): ``gpufleet_gpu_mig_layout_match`` (0/1: MIG mode and GPU-instance profiles
vs ``SETTINGS_DIR/mig-layout.json``, the MIG stage's file, GPUs by PCI bus id, only for GPUs in the layout). The
desired power limit, persistence and MIG mode are not exported here: the exporters stage publishes them from the
node plan as a node_exporter textfile, for both exporters.

Xids: a background thread (:class:`XidWatcher`) registers every GPU for NVML's Xid critical-error events and waits
on them; ``DCGM_FI_DEV_XID_ERRORS`` is the last Xid of each GPU since the exporter started (0 before any), as
DCGM's field, and ``gpufleet_gpu_xid_errors_total{xid=CODE}`` counts them. Where NVML has no events (WSL, some
platforms: ``NOT_SUPPORTED``) no Xid series is exported for that GPU, ``gpufleet_gpu_exporter_xid_events_supported``
is 0 and the log says so once.
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

import pynvml
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.process_collector import ProcessCollector

SETTINGS_DIR = "/etc/gpufleet"
LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname", "DCGM_FI_DRIVER_VERSION")

# name -> (help, NVML reader returning a number); the order is the exposition order
_HELP = {
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "Current power limit (in W).",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "Total energy consumption since boot (in mJ).",
    "DCGM_FI_DEV_SM_CLOCK": "SM clock frequency (in MHz).",
    "DCGM_FI_DEV_MEM_CLOCK": "Memory clock frequency (in MHz).",
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "Memory utilization (in %).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "Current clock event reasons (bitmask).",
    "DCGM_FI_DEV_PERSISTENCE_MODE": "Persistence mode (1 enabled).",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "Total number of single-bit volatile ECC errors.",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "Total number of double-bit volatile ECC errors.",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "Total number of single-bit persistent ECC errors.",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "Total number of double-bit persistent ECC errors.",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "Number of remapped rows for correctable errors",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "Number of remapped rows for uncorrectable errors",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "Whether remapping of rows is pending",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "Whether remapping of rows has failed",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "Total number of PCIe retries.",
    "DCGM_FI_DEV_MIG_MODE": "MIG mode (1 enabled).",
    "DCGM_FI_DEV_XID_ERRORS": "Value of the last XID error encountered.",
    "gpufleet_gpu_mig_layout_match": "1 when MIG mode and GPU instances are the layout gpufleet applied, else 0.",
}


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


def norm_bus(bus_id: str) -> str:
    """PCI bus id in NVML's form, upper case, 8-digit domain (``00000000:18:00.0``)."""
    head = bus_id.strip().upper()
    domain, sep, rest = head.partition(":")
    return f"{domain:0>8}{sep}{rest}" if sep else head


def gpu_instance_profiles(handle) -> Counter:
    """GPU-instance profile ids present on a MIG-enabled GPU (the probe's walk: every profile, its instances)."""
    found: Counter = Counter()
    for profile in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = _nvml_optional(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, profile)
        if info is None or not info.instanceCount:
            continue
        array = (pynvml.c_nvmlGpuInstance_t * info.instanceCount)()
        count = ctypes.c_uint(info.instanceCount)
        pynvml.nvmlDeviceGetGpuInstances(handle, info.id, array, ctypes.byref(count))
        if count.value:
            found[info.id] += count.value
    return found


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

    def collect(self):
        with self.lock:
            ready = self._nvml_ready()
            samples, errors = self._read() if ready else ({}, 0)
        yield from self._xid_families(samples)
        up = GaugeMetricFamily("gpufleet_gpu_exporter_nvml_up", "1 when NVML answers (the driver is loaded).",
                               labels=("hostname",))
        up.add_metric((self.hostname,), 1 if ready else 0)
        yield up
        for name, help_text in _HELP.items():
            family = GaugeMetricFamily(name, help_text, labels=LABELS)
            for labels, value in samples.get(name, []):
                family.add_metric(labels, value)
            yield family
        errors_family = GaugeMetricFamily("gpufleet_gpu_exporter_errors",
                                          "GPUs NVML could not read in this scrape.", labels=("hostname",))
        errors_family.add_metric((self.hostname,), errors)
        yield errors_family

    def _xid_families(self, samples):
        """The Xid counter and the events-supported flag, labelled like the GPU's other series."""
        if self.xids is None:
            return
        _, counts, supported = self.xids.snapshot()
        labels_of = {labels[1]: labels for labels, _ in samples.get("DCGM_FI_DEV_GPU_TEMP", [])}
        flag = GaugeMetricFamily("gpufleet_gpu_exporter_xid_events_supported",
                                 "1 when NVML delivers Xid events for this GPU (else no Xid series for it).",
                                 labels=LABELS)
        total = CounterMetricFamily("gpufleet_gpu_xid_errors", "Xid errors of this GPU since the exporter started.",
                                    labels=(*LABELS, "xid"))
        for uuid, labels in labels_of.items():
            if uuid in supported:
                flag.add_metric(labels, 1 if supported[uuid] else 0)
        for (uuid, code), count in sorted(counts.items()):
            if uuid in labels_of:
                total.add_metric((*labels_of[uuid], str(code)), count)
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
        labels = (str(index), uuid, bus, f"nvidia{minor if minor is not None else index}",
                  _text(pynvml.nvmlDeviceGetName(h)), self.hostname, driver)
        values = {}
        values["DCGM_FI_DEV_GPU_TEMP"] = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
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
        memory = _nvml_optional(pynvml.nvmlDeviceGetMemoryInfo, h)
        if memory is not None:
            values["DCGM_FI_DEV_FB_FREE"] = memory.free // (1024 * 1024)
            values["DCGM_FI_DEV_FB_USED"] = memory.used // (1024 * 1024)
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
        if self.xids is not None:
            last, _, supported = self.xids.snapshot()
            if supported.get(uuid):
                values["DCGM_FI_DEV_XID_ERRORS"] = last.get(uuid, 0)
        wanted = mig.get(norm_bus(bus))
        if wanted is not None:
            values["gpufleet_gpu_mig_layout_match"] = self._mig_match(h, wanted, current_mig)
        for name, value in values.items():
            if value is not None:
                samples.setdefault(name, []).append((labels, float(value)))

    @staticmethod
    def _mig_match(handle, wanted: dict, current_mig) -> int:
        enabled = bool(wanted.get("mig_enabled"))
        if bool(current_mig) != enabled:
            return 0
        if not enabled:
            return 1
        return 1 if gpu_instance_profiles(handle) == Counter(wanted.get("create") or []) else 0


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"--listen {text!r}: expected ADDRESS:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def build_registry(settings_dir: str = SETTINGS_DIR, hostname: str | None = None,
                   xids: XidWatcher | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(settings_dir, hostname, xids))
    registry.register(ProcessCollector(registry=None))
    return registry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpufleet-gpu-exporter", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=parse_listen, default=("0.0.0.0", 9400), help="ADDRESS:PORT")
    parser.add_argument("--settings-dir", default=SETTINGS_DIR)
    args = parser.parse_args(argv)
    xids = XidWatcher().start()
    registry = build_registry(args.settings_dir, xids=xids)
    address, port = args.listen
    start_http_server(port, addr=address, registry=registry)
    print(f"gpufleet-gpu-exporter: listening on {address}:{port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    xids.stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
