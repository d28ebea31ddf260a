"""The simulated NVML (gpufleet/sim/gpu/libnvidia-ml.c) seen through the real nvidia-ml-py.

The library is built once per session into a temporary directory; every scenario runs pynvml in its own
Python subprocess (LD_LIBRARY_PATH=<build dir>, GPUFLEET_SIM_STATE, GPUFLEET_SIM_DRIVER_VERSION_FILE) so
that nothing cached by ctypes/pynvml leaks between scenarios.

States come from the hardware profiles (``gpufleet.sim.hardware.build_state``) with the driver loaded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from gpufleet.sim.gpu import state as simstate
from gpufleet.sim.gpu.build_nvml import build
from gpufleet.sim.hardware import build_state

DRIVER = "570.172.08"
PROFILES = ["h100-sxm-8", "h200-8", "a100-80gb-8", "a100-40gb-1", "l40s-4", "rtx4090-1"]


def make_state(profile: str, hostname: str = "node1") -> dict[str, str]:
    state = dict(build_state(profile, hostname))
    # Boot state: driver loaded, the package's version, no processes.
    state["driver.loaded"] = "1"
    state["driver.version"] = DRIVER
    state["driver.cuda_version"] = "12.8"
    for key in [k for k in state if ".client." in k or ".proc." in k]:
        del state[key]
    return state


# --------------------------------------------------------------------------------------------------------------
# Fixtures and the subprocess runner
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def libdir():
    # World-readable, so that a scenario can drop to an unprivileged uid and still load the library.
    path = Path(tempfile.mkdtemp(prefix="simnvml-"))
    path.chmod(0o755)
    build(path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Sim:
    def __init__(self, libdir: Path, root: Path):
        self.libdir = libdir
        self.root = root
        self.path = root / "gpus.state"
        self.version_file = root / "driver-version"
        self.version_file.write_text(DRIVER + "\n")

    def write(self, state: dict[str, str]) -> None:
        simstate.write_state(str(self.path), state)
        self.path.chmod(0o644)

    def read(self) -> dict[str, str]:
        return simstate.read_state(str(self.path))

    def text(self) -> str:
        return self.path.read_text()

    def run(self, body: str, drop_to_nobody: bool = False, check: bool = True):
        """Run ``body`` with pynvml imported and ``out = {}``; return the JSON-decoded ``out``."""
        script = _PRELUDE + ("drop_privileges()\n" if drop_to_nobody else "") + textwrap.dedent(body) + _EPILOGUE
        env = dict(os.environ, LD_LIBRARY_PATH=str(self.libdir), GPUFLEET_SIM_STATE=str(self.path),
                   GPUFLEET_SIM_DRIVER_VERSION_FILE=str(self.version_file))
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                              timeout=60, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"scenario failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


_PRELUDE = '''
import json, os, sys
import pynvml
from pynvml import *

out = {}

def err(fn, *args):
    """The pynvml exception class name raised by fn(*args), or the result."""
    try:
        return fn(*args)
    except NVMLError as exc:
        return type(exc).__name__

def s(value):
    return value.decode() if isinstance(value, bytes) else value

def drop_privileges():
    if os.geteuid() == 0:
        os.setgid(65534)
        os.setuid(65534)
'''
_EPILOGUE = "\nprint(json.dumps(out, default=str))\n"


@pytest.fixture
def sim(libdir):
    root = Path(tempfile.mkdtemp(prefix="simstate-"))
    root.chmod(0o755)
    yield Sim(libdir, root)
    shutil.rmtree(root, ignore_errors=True)


def _live_process():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# --------------------------------------------------------------------------------------------------------------
# Library build
# --------------------------------------------------------------------------------------------------------------


def test_build_exports_soname_and_only_real_symbols(libdir):
    lib = libdir / "libnvidia-ml.so.1"
    assert lib.exists()
    dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout \
        if shutil.which("readelf") else "Library soname: [libnvidia-ml.so.1]"
    assert "[libnvidia-ml.so.1]" in dyn
    # Must compile without warnings with -Wall -Wextra.
    src = Path(__file__).resolve().parents[2] / "gpufleet" / "sim" / "gpu" / "libnvidia-ml.c"
    result = subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-fsyntax-only", str(src)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_build_module_cli(tmp_path):
    result = subprocess.run([sys.executable, "-m", "gpufleet.sim.gpu.build_nvml", str(tmp_path / "out")],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "libnvidia-ml.so.1").exists()


# --------------------------------------------------------------------------------------------------------------
# Every profile: what pynvml reads equals the state
# --------------------------------------------------------------------------------------------------------------

_READ_ALL = '''
nvmlInit()
out["driver"] = s(nvmlSystemGetDriverVersion())
out["nvml"] = s(nvmlSystemGetNVMLVersion())
out["cuda"] = nvmlSystemGetCudaDriverVersion()
out["cuda_v2"] = nvmlSystemGetCudaDriverVersion_v2()
out["count"] = nvmlDeviceGetCount()
out["gpus"] = []
for i in range(out["count"]):
    h = nvmlDeviceGetHandleByIndex(i)
    pci = nvmlDeviceGetPciInfo(h)
    mem = nvmlDeviceGetMemoryInfo(h)
    mem2 = nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)
    util = err(nvmlDeviceGetUtilizationRates, h)
    g = {
        "index": nvmlDeviceGetIndex(h), "minor": nvmlDeviceGetMinorNumber(h),
        "name": s(nvmlDeviceGetName(h)), "uuid": s(nvmlDeviceGetUUID(h)), "serial": s(err(nvmlDeviceGetSerial, h)),
        "brand": nvmlDeviceGetBrand(h), "arch": nvmlDeviceGetArchitecture(h),
        "cc": list(nvmlDeviceGetCudaComputeCapability(h)), "vbios": s(nvmlDeviceGetVbiosVersion(h)),
        "bus_id": s(pci.busId), "bus_legacy": s(pci.busIdLegacy), "pci_domain": pci.domain, "pci_bus": pci.bus,
        "pci_device_id": pci.pciDeviceId, "pci_subsys": pci.pciSubSystemId,
        "by_uuid": nvmlDeviceGetIndex(nvmlDeviceGetHandleByUUID(nvmlDeviceGetUUID(h))),
        "by_bus": nvmlDeviceGetIndex(nvmlDeviceGetHandleByPciBusId(pci.busId)),
        "by_short_bus": nvmlDeviceGetIndex(nvmlDeviceGetHandleByPciBusId(pci.busIdLegacy)),
        "mem": [mem.total, mem.free, mem.used], "mem2": [mem2.total, mem2.reserved, mem2.free, mem2.used],
        "persistence": nvmlDeviceGetPersistenceMode(h), "pm_mode": nvmlDeviceGetPowerManagementMode(h),
        "limit": nvmlDeviceGetPowerManagementLimit(h), "default": nvmlDeviceGetPowerManagementDefaultLimit(h),
        "constraints": nvmlDeviceGetPowerManagementLimitConstraints(h),
        "enforced": nvmlDeviceGetEnforcedPowerLimit(h), "usage": nvmlDeviceGetPowerUsage(h),
        "temp": nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU),
        "temp_v": nvmlDeviceGetTemperatureV(h, NVML_TEMPERATURE_GPU),
        "t_shutdown": err(nvmlDeviceGetTemperatureThreshold, h, NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
        "t_slowdown": err(nvmlDeviceGetTemperatureThreshold, h, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        "t_max": err(nvmlDeviceGetTemperatureThreshold, h, NVML_TEMPERATURE_THRESHOLD_GPU_MAX),
        "t_target": err(nvmlDeviceGetTemperatureThreshold, h, NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR),
        "fan": err(nvmlDeviceGetFanSpeed, h), "pstate": nvmlDeviceGetPerformanceState(h),
        "util": [util.gpu, util.memory] if not isinstance(util, str) else util,
        "clocks": [nvmlDeviceGetClockInfo(h, t) for t in range(4)],
        "max_clocks": [nvmlDeviceGetMaxClockInfo(h, t) for t in range(4)],
        "clock_current": nvmlDeviceGetClock(h, NVML_CLOCK_SM, NVML_CLOCK_ID_CURRENT),
        "app_clock": err(nvmlDeviceGetApplicationsClock, h, NVML_CLOCK_GRAPHICS),
        "reasons": nvmlDeviceGetCurrentClocksEventReasons(h),
        "throttle": nvmlDeviceGetCurrentClocksThrottleReasons(h),
        "supported_reasons": nvmlDeviceGetSupportedClocksEventReasons(h),
        "ecc": err(nvmlDeviceGetEccMode, h),
        "ecc_unc": err(nvmlDeviceGetTotalEccErrors, h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC),
        "remap": err(nvmlDeviceGetRemappedRows, h),
        "retired": err(nvmlDeviceGetRetiredPages, h, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        "pcie": [nvmlDeviceGetCurrPcieLinkGeneration(h), nvmlDeviceGetMaxPcieLinkGeneration(h),
                 nvmlDeviceGetGpuMaxPcieLinkGeneration(h), nvmlDeviceGetCurrPcieLinkWidth(h),
                 nvmlDeviceGetMaxPcieLinkWidth(h)],
        "nvlink0": err(nvmlDeviceGetNvLinkState, h, 0),
        "mig": err(nvmlDeviceGetMigMode, h), "compute_mode": nvmlDeviceGetComputeMode(h),
        "procs": nvmlDeviceGetComputeRunningProcesses(h), "gprocs": nvmlDeviceGetGraphicsRunningProcesses(h),
        "display_active": nvmlDeviceGetDisplayActive(h), "display_mode": err(nvmlDeviceGetDisplayMode, h),
    }
    out["gpus"].append(g)
nvmlShutdown()
'''

_BRANDS = {"NVIDIA": 14, "Nvidia": 14, "GeForce": 5, "Tesla": 2}
_ARCHS = {"Ampere": 7, "Ada Lovelace": 8, "Hopper": 9, "Blackwell": 10}


def _opt_int(value: str, missing="NVMLError_NotSupported"):
    return int(value) if value not in ("", None) else missing


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_reads_equal_state(sim, profile):
    state = make_state(profile, "node7")
    sim.write(state)
    out = sim.run(_READ_ALL)
    assert out["driver"] == DRIVER
    major, minor = (int(x) for x in state["driver.cuda_version"].split("."))
    assert out["cuda"] == out["cuda_v2"] == major * 1000 + minor * 10
    assert out["nvml"] == f"{major}.{DRIVER}"
    assert out["count"] == simstate.gpu_count(state)
    uuids, buses = set(), set()
    for i, g in enumerate(out["gpus"]):
        f = simstate.gpu(state, i)
        mib = 1024 * 1024
        assert g["index"] == i and g["minor"] == int(f["minor"])
        assert g["name"] == f["name"]
        assert g["uuid"] == f["uuid"]
        assert g["serial"] == (f["serial"] or "NVMLError_NotSupported")
        assert g["brand"] == _BRANDS[f["brand"]]
        assert g["arch"] == _ARCHS[f["architecture"]]
        assert g["cc"] == [int(x) for x in f["compute_cap"].split(".")]
        assert g["vbios"] == f["vbios"]
        assert g["bus_id"] == f["pci.bus_id"]
        assert g["bus_legacy"] == f["pci.bus_id"][4:]
        assert g["pci_bus"] == int(f["pci.bus_id"].split(":")[1], 16)
        assert g["pci_device_id"] == int(f["pci.device_id"], 16)
        assert g["pci_subsys"] == int(f["pci.sub_device_id"], 16)
        assert g["by_uuid"] == g["by_bus"] == g["by_short_bus"] == i
        total, reserved, used = (int(f[k]) * mib for k in ("memory.total_mib", "memory.reserved_mib",
                                                           "memory.used_mib"))
        assert g["mem2"] == [total, reserved, total - reserved - used, used]
        assert g["mem"] == [total, total - reserved - used, reserved + used]
        assert g["persistence"] == int(f["persistence"])
        assert g["pm_mode"] == 1
        assert g["limit"] == g["enforced"] == int(f["power.limit_mw"])
        assert g["default"] == int(f["power.default_mw"])
        assert g["constraints"] == [int(f["power.min_mw"]), int(f["power.max_mw"])]
        assert g["usage"] == int(f["power.draw_mw"])
        assert g["temp"] == g["temp_v"] == int(f["temp.gpu"])
        assert g["t_shutdown"] == _opt_int(f["temp.shutdown"])
        assert g["t_slowdown"] == _opt_int(f["temp.slowdown"])
        assert g["t_max"] == _opt_int(f["temp.max_operating"])
        assert g["t_target"] == _opt_int(f["temp.target"])
        assert g["fan"] == _opt_int(f["fan"])
        assert g["pstate"] == int(f["pstate"][1:])
        if f["mig.current"] == "1":
            assert g["util"] == "NVMLError_NotSupported"
        else:
            assert g["util"] == [int(f["util.gpu"]), int(f["util.memory"])]
        assert g["clocks"] == [int(f[f"clocks.{t}"]) for t in ("graphics", "sm", "mem", "video")]
        assert g["max_clocks"] == [int(f[f"clocks.max.{t}"]) for t in ("graphics", "sm", "mem", "video")]
        assert g["clock_current"] == int(f["clocks.sm"])
        assert g["app_clock"] == "NVMLError_Deprecated"
        assert g["reasons"] == g["throttle"] == int(f["clocks.event_reasons"], 16)
        assert g["supported_reasons"] == 0x1FF
        if f["ecc.supported"] == "1":
            assert g["ecc"] == [int(f["ecc.current"]), int(f["ecc.pending"])]
            assert g["ecc_unc"] == int(f["ecc.volatile.uncorrected"])
        else:
            assert g["ecc"] == g["ecc_unc"] == "NVMLError_NotSupported"
        if f["remap.supported"] == "1":
            assert g["remap"] == [int(f[f"remap.{k}"]) for k in ("correctable", "uncorrectable", "pending",
                                                                  "failure")]
        else:
            assert g["remap"] == "NVMLError_NotSupported"
        assert g["retired"] == "NVMLError_NotSupported"  # Ampere+: row remapping instead
        assert g["pcie"] == [int(f["pcie.gen_current"]), int(f["pcie.gen_max"]), int(f["pcie.gen_max"]),
                             int(f["pcie.width_current"]), int(f["pcie.width_max"])]
        assert g["nvlink0"] == (1 if int(f.get("nvlink.count") or 0) else "NVMLError_NotSupported")
        if f["mig.supported"] == "1":
            assert g["mig"] == [int(f["mig.current"]), int(f["mig.pending"])]
        else:
            assert g["mig"] == "NVMLError_NotSupported"
        assert g["compute_mode"] == {"Default": 0, "Prohibited": 2, "Exclusive_Process": 3}[f["compute_mode"]]
        assert g["procs"] == [] and g["gprocs"] == []
        assert g["display_active"] == 0
        assert g["display_mode"] == "NVMLError_Deprecated"
        uuids.add(g["uuid"])
        buses.add(g["bus_id"])
    assert len(uuids) == len(buses) == out["count"]


def test_geforce_not_supported_fields(sim):
    state = make_state("rtx4090-1")
    state["gpu.0.ecc.supported"] = "0"  # like the RTX 4080 SUPER capture: ECC Mode N/A
    sim.write(state)
    out = sim.run('''
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(0)
        out["ecc"] = err(nvmlDeviceGetEccMode, h)
        out["ecc_count"] = err(nvmlDeviceGetTotalEccErrors, h, 0, 1)
        out["mem_err"] = err(nvmlDeviceGetMemoryErrorCounter, h, 0, 1, NVML_MEMORY_LOCATION_DRAM)
        out["remap"] = err(nvmlDeviceGetRemappedRows, h)
        out["mig"] = err(nvmlDeviceGetMigMode, h)
        out["serial"] = err(nvmlDeviceGetSerial, h)
        out["boost"] = err(nvmlDeviceGetMaxCustomerBoostClock, h, NVML_CLOCK_GRAPHICS)
        out["fan"] = nvmlDeviceGetFanSpeed(h)
        out["constraints"] = nvmlDeviceGetPowerManagementLimitConstraints(h)
    ''')
    for key in ("ecc", "ecc_count", "mem_err", "remap", "mig", "serial", "boost"):
        assert out[key] == "NVMLError_NotSupported", key
    state = sim.read()
    assert out["fan"] == int(state["gpu.0.fan"])
    assert out["constraints"] == [int(state["gpu.0.power.min_mw"]), int(state["gpu.0.power.max_mw"])]


def test_datacenter_fan_not_supported_and_ecc_counters(sim):
    state = make_state("h100-sxm-8")
    state["gpu.2.ecc.aggregate.uncorrected"] = "3"
    state["gpu.2.ecc.volatile.corrected"] = "7"
    state["gpu.2.remap.uncorrectable"] = "2"
    state["gpu.2.remap.pending"] = "1"
    sim.write(state)
    out = sim.run('''
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(2)
        out["fan"] = err(nvmlDeviceGetFanSpeed, h)
        out["agg_unc"] = nvmlDeviceGetTotalEccErrors(h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC)
        out["vol_cor"] = nvmlDeviceGetTotalEccErrors(h, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC)
        out["dram_unc"] = nvmlDeviceGetMemoryErrorCounter(h, 1, NVML_AGGREGATE_ECC, NVML_MEMORY_LOCATION_DRAM)
        out["l2_unc"] = nvmlDeviceGetMemoryErrorCounter(h, 1, NVML_AGGREGATE_ECC, NVML_MEMORY_LOCATION_L2_CACHE)
        out["remap"] = nvmlDeviceGetRemappedRows(h)
    ''')
    assert out["fan"] == "NVMLError_NotSupported"
    assert out["agg_unc"] == 3 and out["vol_cor"] == 7
    assert out["dram_unc"] == 3 and out["l2_unc"] == 0
    assert out["remap"] == [0, 2, 1, 0]


def test_clock_event_reasons_and_nvlink(sim):
    state = make_state("h100-sxm-8")
    state["gpu.1.clocks.event_reasons"] = "0x0000000000000060"  # SW + HW thermal slowdown
    state["gpu.1.nvlink.down"] = "3,17"
    sim.write(state)
    out = sim.run('''
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(1)
        out["reasons"] = nvmlDeviceGetCurrentClocksEventReasons(h)
        out["links"] = [nvmlDeviceGetNvLinkState(h, l) for l in range(18)]
        out["past"] = err(nvmlDeviceGetNvLinkState, h, 18)
        out["version"] = nvmlDeviceGetNvLinkVersion(h, 0)
    ''')
    assert out["reasons"] == 0x60
    assert out["links"] == [0 if link in (3, 17) else 1 for link in range(18)]
    assert out["past"] == "NVMLError_InvalidArgument"
    assert out["version"] == 6  # NVML_NVLINK_VERSION_4_0 (Hopper)


def test_ecc_compute_mode_setters_and_display(sim):
    state = make_state("l40s-4")
    state["gpu.2.display.active"] = "1"
    sim.write(state)
    out = sim.run('''
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(2)
        nvmlDeviceSetEccMode(h, 0)
        out["ecc"] = nvmlDeviceGetEccMode(h)
        nvmlDeviceSetComputeMode(h, NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
        out["cm"] = nvmlDeviceGetComputeMode(h)
        out["bad_cm"] = err(nvmlDeviceSetComputeMode, h, NVML_COMPUTEMODE_EXCLUSIVE_THREAD)
        out["display"] = [nvmlDeviceGetDisplayActive(h), nvmlDeviceGetDisplayActive(nvmlDeviceGetHandleByIndex(0))]
    ''')
    assert out["ecc"] == [1, 0]  # pending until reboot
    assert out["cm"] == 3 and out["bad_cm"] == "NVMLError_InvalidArgument"
    assert out["display"] == [1, 0]
    after = sim.read()
    assert (after["gpu.2.ecc.current"], after["gpu.2.ecc.pending"]) == ("1", "0")
    assert after["gpu.2.compute_mode"] == "Exclusive_Process"


def test_unknown_handles_lookup(sim):
    sim.write(make_state("l40s-4"))
    out = sim.run('''
        pynvml._LoadNvmlLibrary()
        out["before_init"] = err(nvmlDeviceGetCount)
        nvmlInit()
        out["bad_index"] = err(nvmlDeviceGetHandleByIndex, 4)
        out["bad_uuid"] = err(nvmlDeviceGetHandleByUUID, "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff")
        out["bad_bus"] = err(nvmlDeviceGetHandleByPciBusId, "00000000:77:00.0")
        nvmlShutdown()
        out["after_shutdown"] = err(nvmlDeviceGetCount)
        out["shutdown_twice"] = err(nvmlShutdown)
    ''')
    assert out["before_init"] == "NVMLError_Uninitialized"
    assert out["bad_index"] == "NVMLError_InvalidArgument"
    assert out["bad_uuid"] == out["bad_bus"] == "NVMLError_NotFound"
    assert out["after_shutdown"] == out["shutdown_twice"] == "NVMLError_Uninitialized"


@pytest.mark.parametrize(("cuda", "driver", "expected"), [
    ("12.9", DRIVER, 12090),
    ("", DRIVER, 12080),  # empty: the branch map (simgpu.state.CUDA_BY_BRANCH), 570 -> 12.8
    ("", "590.48.01", 13010),
])
def test_cuda_driver_version(sim, cuda, driver, expected):
    state = make_state("a100-40gb-1")
    state["driver.cuda_version"] = cuda
    state["driver.version"] = driver
    sim.write(state)
    sim.version_file.write_text(driver + "\n")
    out = sim.run('nvmlInit(); out["v"] = nvmlSystemGetCudaDriverVersion(); '
                  'out["nvml"] = s(nvmlSystemGetNVMLVersion())')
    assert out["v"] == expected
    assert out["nvml"] == f"{expected // 1000}.{driver}"
    if hasattr(simstate, "cuda_version_for") and not cuda:
        major, minor = simstate.cuda_version_for(driver).split(".")
        assert expected == int(major) * 1000 + int(minor) * 10


def test_bar1_and_pcie_host_max(sim):
    state = make_state("h100-sxm-8")
    state["gpu.0.bar1.total_mib"] = "131072"
    state["gpu.1.bar1.total_mib"] = ""
    state["gpu.0.pcie.gen_hostmax"] = "4"
    sim.write(state)
    out = sim.run('''
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(0)
        b = nvmlDeviceGetBAR1MemoryInfo(h)
        out["bar1"] = [b.bar1Total, b.bar1Used, b.bar1Free]
        out["none"] = err(nvmlDeviceGetBAR1MemoryInfo, nvmlDeviceGetHandleByIndex(1))
        out["gen"] = [nvmlDeviceGetMaxPcieLinkGeneration(h), nvmlDeviceGetGpuMaxPcieLinkGeneration(h)]
    ''')
    mib = 1024 * 1024
    assert out["bar1"] == [131072 * mib, mib, 131071 * mib]
    assert out["none"] == "NVMLError_NotSupported"
    assert out["gen"] == [4, int(state["gpu.0.pcie.gen_max"])]


@pytest.mark.parametrize(("profile", "fabric", "expected"), [
    ("h100-sxm-8", "not_started", [1, 27]),
    ("h100-sxm-8", "in_progress", [2, 27]),
    ("h100-sxm-8", "completed", [3, 0]),
    ("l40s-4", "none", "NVMLError_NotSupported"),
])
def test_gpu_fabric_info(sim, profile, fabric, expected):
    state = make_state(profile)
    state["fabric.state"] = fabric
    sim.write(state)
    out = sim.run('''
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(0)
        info = c_nvmlGpuFabricInfo_t()
        r = err(nvmlDeviceGetGpuFabricInfo, h, byref(info))
        out["v1"] = r if isinstance(r, str) else [info.state, info.status]
        info3 = c_nvmlGpuFabricInfo_v3_t()
        r = err(nvmlDeviceGetGpuFabricInfoV, h, byref(info3))
        out["v3"] = r if isinstance(r, str) else [info3.state, info3.status]
    ''')
    assert out["v1"] == out["v3"] == expected


# --------------------------------------------------------------------------------------------------------------
# Driver states
# --------------------------------------------------------------------------------------------------------------


def test_driver_not_loaded(sim):
    state = make_state("h100-sxm-8")
    state["driver.loaded"] = "0"
    state["driver.version"] = ""
    sim.write(state)
    out = sim.run('out["init"] = err(nvmlInit)')
    assert out["init"] == "NVMLError_DriverNotLoaded"
    assert not any(".client." in k for k in sim.read())


def test_missing_state_file_is_driver_not_loaded(sim):
    out = sim.run('out["init"] = err(nvmlInit)')
    assert out["init"] == "NVMLError_DriverNotLoaded"


def test_version_mismatch(sim):
    state = make_state("a100-40gb-1")
    state["driver.version"] = "550.54.15"  # the loaded module is older than the installed library
    sim.write(state)
    out = sim.run('''
        out["init"] = err(nvmlInit)
        out["str"] = str(NVMLError(NVML_ERROR_LIB_RM_VERSION_MISMATCH))
    ''')
    assert out["init"] == "NVMLError_LibRmVersionMismatch"
    assert out["str"] == "RM has detected an NVML/RM version mismatch."


def test_lost_gpu(sim):
    state = make_state("h100-sxm-8")
    state["gpu.3.lost"] = "1"
    sim.write(state)
    out = sim.run('''
        nvmlInit()
        out["count"] = nvmlDeviceGetCount()
        lost = nvmlDeviceGetHandleByIndex(3)
        out["lost"] = [err(nvmlDeviceGetName, lost), err(nvmlDeviceGetUUID, lost),
                       err(nvmlDeviceGetTemperature, lost, 0), err(nvmlDeviceGetPowerUsage, lost),
                       err(nvmlDeviceGetMemoryInfo, lost)]
        out["by_bus"] = nvmlDeviceGetHandleByPciBusId(os.environ["BUS"]) is not None
        out["others"] = [s(nvmlDeviceGetName(nvmlDeviceGetHandleByIndex(i))) for i in range(8) if i != 3]
    '''.replace('os.environ["BUS"]', repr(state["gpu.3.pci.bus_id"])))
    assert out["count"] == 8
    assert out["lost"] == ["NVMLError_GpuIsLost"] * 5
    assert out["by_bus"] is True
    assert out["others"] == [state["gpu.0.name"]] * 7


# --------------------------------------------------------------------------------------------------------------
# Setters
# --------------------------------------------------------------------------------------------------------------


def test_set_power_limit(sim):
    state = make_state("h100-sxm-8")
    sim.write(state)
    low = int(state["gpu.1.power.min_mw"])
    high = int(state["gpu.1.power.max_mw"])
    out = sim.run(f'''
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(1)
        nvmlDeviceSetPowerManagementLimit(h, {low + 50000})
        out["after"] = nvmlDeviceGetPowerManagementLimit(h)
        out["too_high"] = err(nvmlDeviceSetPowerManagementLimit, h, {high + 1000})
        out["too_low"] = err(nvmlDeviceSetPowerManagementLimit, h, {low - 1000})
        out["still"] = nvmlDeviceGetPowerManagementLimit(h)
        nvmlShutdown()
    ''')
    assert out["after"] == out["still"] == low + 50000
    assert out["too_high"] == out["too_low"] == "NVMLError_InvalidArgument"
    after = sim.read()
    assert after["gpu.1.power.limit_mw"] == str(low + 50000)
    assert after["gpu.0.power.limit_mw"] == state["gpu.0.power.limit_mw"]
    # Rewritten in place in state.render() form: sorted keys, nothing else changed.
    assert sim.text() == simstate.render(after)
    expected = dict(state, **{"gpu.1.power.limit_mw": str(low + 50000)})
    assert after == expected


def test_set_power_limit_v2_and_out_of_range_leaves_file(sim):
    state = make_state("l40s-4")
    sim.write(state)
    before = sim.text()
    high = int(state["gpu.0.power.max_mw"])
    out = sim.run(f'''
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(0)
        out["bad"] = err(nvmlDeviceSetPowerManagementLimit, h, {high + 1})
        fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceSetPowerManagementLimit_v2")
        v = c_nvmlPowerValue_v2_t(); v.version = nvmlPowerValue_v2; v.powerScope = 0; v.powerValueMw = {high + 1}
        out["bad_v2"] = fn(h, byref(v))
        v.powerScope = 1; v.powerValueMw = {high}
        out["module_v2"] = fn(h, byref(v))
        nvmlShutdown()
    ''')
    assert out["bad"] == "NVMLError_InvalidArgument"
    assert out["bad_v2"] == 2 and out["module_v2"] == 3
    assert sim.text() == before


def test_set_persistence_and_locked_clocks(sim):
    state = make_state("a100-80gb-8")
    state["gpu.4.persistence"] = "0"
    sim.write(state)
    out = sim.run('''
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(4)
        nvmlDeviceSetPersistenceMode(h, 1)
        out["p"] = nvmlDeviceGetPersistenceMode(h)
        nvmlDeviceSetGpuLockedClocks(h, 1200, 1350)
        out["bad_lock"] = err(nvmlDeviceSetGpuLockedClocks, h, 1400, 1300)
        nvmlShutdown()
    ''')
    assert out["p"] == 1 and out["bad_lock"] == "NVMLError_InvalidArgument"
    after = sim.read()
    assert after["gpu.4.persistence"] == "1"
    assert (after["gpu.4.clocks.locked.min"], after["gpu.4.clocks.locked.max"]) == ("1200", "1350")
    sim.run('nvmlInit(); nvmlDeviceResetGpuLockedClocks(nvmlDeviceGetHandleByIndex(4))')
    assert sim.read()["gpu.4.clocks.locked.max"] == "0"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to an unprivileged uid")
def test_setters_need_root(sim):
    state = make_state("h100-sxm-8")
    sim.write(state)
    before = sim.text()
    out = sim.run('''
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(0)
        out["read"] = nvmlDeviceGetPowerManagementLimit(h)
        out["pl"] = err(nvmlDeviceSetPowerManagementLimit, h, nvmlDeviceGetPowerManagementDefaultLimit(h))
        out["pm"] = err(nvmlDeviceSetPersistenceMode, h, 0)
        out["mig"] = err(nvmlDeviceSetMigMode, h, 1)
        out["lgc"] = err(nvmlDeviceSetGpuLockedClocks, h, 1000, 1200)
        nvmlShutdown()
    ''', drop_to_nobody=True)
    assert out["read"] == int(state["gpu.0.power.limit_mw"])
    assert out["pl"] == out["pm"] == out["mig"] == out["lgc"] == "NVMLError_NoPermission"
    assert sim.text() == before  # an unprivileged client cannot even register itself


# --------------------------------------------------------------------------------------------------------------
# Clients: nvmlInit holds the GPUs
# --------------------------------------------------------------------------------------------------------------


def test_init_registers_client_and_shutdown_removes_it(sim):
    sim.write(make_state("h200-8"))
    out = sim.run('''
        from gpufleet.sim.gpu import state as st
        pid = os.getpid()
        comm = open("/proc/self/comm").read().strip()
        out["pid"], out["comm"] = pid, comm
        nvmlInit()
        out["after_init"] = {k: v for k, v in st.read_state().items() if k.endswith(f".client.{pid}")}
        nvmlInit()  # ref-counted
        nvmlShutdown()
        out["after_one_shutdown"] = sorted(k for k in st.read_state() if k.endswith(f".client.{pid}"))
        nvmlShutdown()
        out["after_shutdown"] = sorted(k for k in st.read_state() if k.endswith(f".client.{pid}"))
        out["holders"] = st.holders(st.read_state(), 0)
    ''')
    pid, comm = out["pid"], out["comm"]
    assert out["after_init"] == {f"gpu.{i}.client.{pid}": comm for i in range(8)}
    assert len(out["after_one_shutdown"]) == 8
    assert out["after_shutdown"] == [] and out["holders"] == []
    assert sim.text() == simstate.render(sim.read())


def test_exit_without_shutdown_unregisters(sim):
    sim.write(make_state("a100-40gb-1"))
    out = sim.run('''
        nvmlInit()
        out["pid"] = os.getpid()
    ''')
    assert f"gpu.0.client.{out['pid']}" not in sim.read()


def test_processes(sim):
    state = make_state("h100-sxm-8")
    live, xorg = _live_process(), _live_process()
    try:
        state[f"gpu.0.proc.{live.pid}"] = "python3,2048"
        state[f"gpu.0.proc.{xorg.pid}"] = "/usr/lib/xorg/Xorg,100,,,G"
        state[f"gpu.0.proc.{_dead_pid()}"] = "ghost,4096"
        sim.write(state)
        out = sim.run(f'''
            nvmlInit()
            h = nvmlDeviceGetHandleByIndex(0)
            out["procs"] = [(p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId)
                            for p in nvmlDeviceGetComputeRunningProcesses(h)]
            out["gprocs"] = [(p.pid, p.usedGpuMemory) for p in nvmlDeviceGetGraphicsRunningProcesses(h)]
            out["used"] = nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2).used
            out["name"] = s(nvmlSystemGetProcessName({live.pid}))
            out["other"] = nvmlDeviceGetComputeRunningProcesses(nvmlDeviceGetHandleByIndex(1))
        ''')
    finally:
        for proc in (live, xorg):
            proc.kill()
            proc.wait()
    mib = 1024 * 1024
    assert out["procs"] == [[live.pid, 2048 * mib, 0xFFFFFFFF, 0xFFFFFFFF]]
    assert out["gprocs"] == [[xorg.pid, 100 * mib]]
    assert out["used"] == (int(state["gpu.0.memory.used_mib"]) + 2048 + 100) * mib
    assert out["name"] == "python3"
    assert out["other"] == []


# --------------------------------------------------------------------------------------------------------------
# MIG
# --------------------------------------------------------------------------------------------------------------


_STATE_MIG_UUID = "MIG-0e3a1c55-7d1f-5b8a-9a1e-3f4c2b1d0a99"


def _mig_uuid(gpu_uuid: str, gi: int, ci: int) -> str:
    """nvidia-smi's fallback (smi_common.mig_uuid) when a CI has no uuid field."""
    return "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"{gpu_uuid}/{gi}/{ci}"))


def _mig_state(profile: str = "h100-sxm-8") -> dict[str, str]:
    state = make_state(profile)
    state["gpu.0.mig.current"] = state["gpu.0.mig.pending"] = "1"
    # 3g (profile 9) GI 2 at 0:4 with CIs 0 (1c) and 1 (2c); 2g (profile 14) GI 3 at 4:2 with one 2g CI;
    # 1g (profile 19) GI 13 at 6:1 with one 1g CI.
    state["gpu.0.mig.gi.2"] = "9,0,4"
    state["gpu.0.mig.ci.2.0"] = f"0,1,0,{_STATE_MIG_UUID}"
    state["gpu.0.mig.ci.2.1"] = "1,2,1"
    state["gpu.0.mig.gi.3"] = "14,4,2"
    state["gpu.0.mig.ci.3.0"] = "1,2"
    state["gpu.0.mig.gi.13"] = "19,6,1"
    state["gpu.0.mig.ci.13.0"] = "0,1"
    return state


_MIG_SCRIPT = '''
nvmlInit()
h = nvmlDeviceGetHandleByIndex(0)
out["mode"] = nvmlDeviceGetMigMode(h)
out["max"] = nvmlDeviceGetMaxMigDeviceCount(h)
prof = {}
for enum in (NVML_GPU_INSTANCE_PROFILE_1_SLICE, NVML_GPU_INSTANCE_PROFILE_2_SLICE, NVML_GPU_INSTANCE_PROFILE_3_SLICE,
             NVML_GPU_INSTANCE_PROFILE_7_SLICE, NVML_GPU_INSTANCE_PROFILE_6_SLICE):
    info = err(nvmlDeviceGetGpuInstanceProfileInfo, h, enum)
    if isinstance(info, str):
        prof[enum] = info
        continue
    v1 = nvmlDeviceGetGpuInstanceProfileInfo(h, enum, version=1)
    prof[enum] = {"id": info.id, "slices": info.sliceCount, "count": info.instanceCount,
                  "mem": info.memorySizeMB, "sm": info.multiprocessorCount, "name": s(info.name),
                  "v1_id": v1.id, "v1_mem": v1.memorySizeMB,
                  "remaining": nvmlDeviceGetGpuInstanceRemainingCapacity(h, info.id)}
    count = c_uint(0)
    placements = (c_nvmlGpuInstancePlacement_t * 8)()
    count.value = 8
    nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, placements, byref(count))
    prof[enum]["placements"] = [(placements[k].start, placements[k].size) for k in range(count.value)]
    gis = (c_nvmlGpuInstance_t * info.instanceCount)()
    count = c_uint(0)
    nvmlDeviceGetGpuInstances(h, info.id, gis, byref(count))
    prof[enum]["gis"] = []
    for k in range(count.value):
        gi = nvmlGpuInstanceGetInfo(gis[k])
        cis = []
        for ci_enum in range(NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            ci_prof = err(nvmlGpuInstanceGetComputeInstanceProfileInfo, gis[k], ci_enum,
                          NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            if isinstance(ci_prof, str):
                continue
            arr = (c_nvmlComputeInstance_t * ci_prof.instanceCount)()
            n = c_uint(0)
            nvmlGpuInstanceGetComputeInstances(gis[k], ci_prof.id, arr, byref(n))
            for m in range(n.value):
                ci = nvmlComputeInstanceGetInfo(arr[m])
                cis.append({"id": ci.id, "profile": ci.profileId, "start": ci.placement.start,
                            "size": ci.placement.size, "name": s(ci_prof.name),
                            "parent_ok": nvmlDeviceGetIndex(ci.device) == 0})
        prof[enum]["gis"].append({"id": gi.id, "profile": gi.profileId, "start": gi.placement.start,
                                  "size": gi.placement.size, "cis": sorted(cis, key=lambda c: c["id"]),
                                  "by_id": nvmlGpuInstanceGetInfo(nvmlDeviceGetGpuInstanceById(h, gi.id)).id})
out["profiles"] = {str(k): v for k, v in prof.items()}
migs = []
for k in range(out["max"]):
    m = err(nvmlDeviceGetMigDeviceHandleByIndex, h, k)
    if isinstance(m, str):
        migs.append(m)
        continue
    mem = nvmlDeviceGetMemoryInfo(m, version=nvmlMemory_v2)
    uuid = s(nvmlDeviceGetUUID(m))
    migs.append({"is_mig": int(nvmlDeviceIsMigDeviceHandle(m).value), "gi": nvmlDeviceGetGpuInstanceId(m),
                 "ci": nvmlDeviceGetComputeInstanceId(m), "name": s(nvmlDeviceGetName(m)), "uuid": uuid,
                 "mem": mem.total, "used": mem.used, "sm": nvmlDeviceGetAttributes(m).multiprocessorCount,
                 "parent": nvmlDeviceGetIndex(nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)),
                 "by_uuid": nvmlDeviceGetGpuInstanceId(nvmlDeviceGetHandleByUUID(uuid)),
                 "temp": err(nvmlDeviceGetTemperature, m, 0)})
out["migs"] = migs
out["full_used"] = nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2).used
out["full_is_mig"] = int(nvmlDeviceIsMigDeviceHandle(h).value)
out["full_gi"] = err(nvmlDeviceGetGpuInstanceId, h)
out["util"] = err(nvmlDeviceGetUtilizationRates, h)
out["gpu1_instances"] = err(nvmlDeviceGetGpuInstances, nvmlDeviceGetHandleByIndex(1), 19, None, byref(c_uint()))
'''


def _gip(state: dict[str, str], gpu: int, profile_id: int) -> dict:
    row = state[f"gpu.{gpu}.mig.gip.{profile_id}"].split(",")
    return {"name": row[0], "enum": int(row[1]), "count": int(row[2]), "mem": int(row[3]), "slices": int(row[5]),
            "sm": int(row[7]), "placements": [tuple(int(x) for x in p.split(":")) for p in row[14].split(";")]}


def test_mig_instances_and_devices(sim):
    state = _mig_state()
    sim.write(state)
    out = sim.run(_MIG_SCRIPT)
    assert out["mode"] == [1, 1] and out["max"] == int(state["gpu.0.mig.slices.compute"])
    p = out["profiles"]
    g1, g2, g3, g7 = (_gip(state, 0, pid) for pid in (19, 14, 9, 0))
    assert p["6"] == "NVMLError_NotSupported"  # no 6-slice profile on H100
    one, two, three, seven = p["0"], p["1"], p["2"], p["4"]
    assert (one["id"], one["slices"], one["count"], one["mem"], one["sm"], one["name"]) == \
        (19, 1, g1["count"], g1["mem"], g1["sm"], "MIG " + g1["name"])
    assert (one["v1_id"], one["v1_mem"]) == (19, g1["mem"])
    assert one["placements"] == [list(x) for x in g1["placements"]]
    assert (two["id"], three["id"], seven["id"]) == (14, 9, 0)
    # Memory slices 0-6 are taken: neither a 7g nor another 1g fits.
    assert seven["remaining"] == 0 and one["remaining"] == 0
    assert [g["id"] for g in one["gis"]] == [13]
    assert one["gis"][0] == {"id": 13, "profile": 19, "start": 6, "size": 1, "by_id": 13,
                             "cis": [{"id": 0, "profile": 0, "start": 0, "size": 1, "name": "MIG " + g1["name"],
                                      "parent_ok": True}]}
    assert [(g["id"], g["start"], g["size"]) for g in two["gis"]] == [(3, 4, 2)]
    assert three["gis"][0]["cis"] == [
        {"id": 0, "profile": 0, "start": 0, "size": 1, "name": f"MIG 1c.{g3['name']}", "parent_ok": True},
        {"id": 1, "profile": 1, "start": 1, "size": 2, "name": f"MIG 2c.{g3['name']}", "parent_ok": True},
    ]
    migs = [m for m in out["migs"] if isinstance(m, dict)]
    assert out["migs"][len(migs):] == ["NVMLError_NotFound"] * (out["max"] - len(migs))
    expected = [(2, 0, g3, 1), (2, 1, g3, 2), (3, 0, g2, 2), (13, 0, g1, 1)]
    assert [(m["gi"], m["ci"]) for m in migs] == [(gi, ci) for gi, ci, _, _ in expected]
    assert all(m["is_mig"] == 1 and m["parent"] == 0 for m in migs)
    assert [m["name"] for m in migs] == [
        f"{state['gpu.0.name']} MIG " + (g["name"] if n == g["slices"] else f"{n}c.{g['name']}")
        for _, _, g, n in expected]
    gpu_uuid = state["gpu.0.uuid"]
    assert [m["uuid"] for m in migs] == [_STATE_MIG_UUID] + [_mig_uuid(gpu_uuid, gi, ci) for gi, ci, _, _ in
                                                             expected[1:]]
    assert [m["by_uuid"] for m in migs] == [2, 2, 3, 13]
    assert [m["mem"] for m in migs] == [g["mem"] * 1024 * 1024 for _, _, g, _ in expected]
    assert [m["used"] for m in migs] == [round(8.67 * g["slices"]) * 1024 * 1024 for _, _, g, _ in expected]
    one_slice_sm = g1["sm"]
    assert [m["sm"] for m in migs] == [g["sm"] if n == g["slices"] else min(one_slice_sm * n, g["sm"])
                                       for _, _, g, n in expected]
    # the whole GPU's used memory includes every GPU instance's overhead (as nvidia-smi prints it)
    overhead = sum(round(8.67 * g["slices"]) for g in (g3, g2, g1))
    assert out["full_used"] == (int(state["gpu.0.memory.used_mib"]) + overhead) * 1024 * 1024
    assert migs[0]["temp"] == "NVMLError_NotSupported"
    assert out["full_is_mig"] == 0 and out["full_gi"] == "NVMLError_NotSupported"
    assert out["util"] == "NVMLError_NotSupported"
    assert out["gpu1_instances"] == "NVMLError_NotSupported"  # MIG disabled on GPU 1


def test_mig_handles_go_stale_when_instances_are_destroyed(sim):
    sim.write(_mig_state())
    out = sim.run('''
        from gpufleet.sim.gpu import state as st
        nvmlInit()
        m = nvmlDeviceGetMigDeviceHandleByIndex(nvmlDeviceGetHandleByIndex(0), 3)
        out["before"] = nvmlDeviceGetGpuInstanceId(m)
        with st.locked() as cur:
            del cur["gpu.0.mig.ci.13.0"]
            del cur["gpu.0.mig.gi.13"]
        out["after"] = err(nvmlDeviceGetName, m)
        out["remaining_1g"] = nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDeviceGetHandleByIndex(0), 19)
    ''')
    assert out["before"] == 13
    assert out["after"] == "NVMLError_InvalidArgument"
    assert out["remaining_1g"] == 1


def test_set_mig_mode_without_holders_applies(sim):
    sim.write(make_state("a100-80gb-8"))
    out = sim.run('''
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(5)
        out["status"] = nvmlDeviceSetMigMode(h, NVML_DEVICE_MIG_ENABLE)  # our own client entry does not count
        out["mode"] = nvmlDeviceGetMigMode(h)
        out["bad"] = err(nvmlDeviceSetMigMode, h, 2)
    ''')
    assert out["status"] == 0 and out["mode"] == [1, 1]
    assert out["bad"] == "NVMLError_InvalidArgument"
    after = sim.read()
    assert after["gpu.5.mig.current"] == after["gpu.5.mig.pending"] == "1"
    assert after["gpu.4.mig.current"] == "0"


@pytest.mark.parametrize("profile", ["h100-sxm-8", "a100-80gb-8"])
def test_set_mig_mode_while_another_process_holds_the_gpu(sim, profile):
    state = make_state(profile)
    holder = _live_process()
    try:
        state[f"gpu.0.client.{holder.pid}"] = "nv-hostengine"
        state[f"gpu.1.client.{_dead_pid()}"] = "dcgm-exporter"  # dead: does not count
        sim.write(state)
        out = sim.run('''
            nvmlInit()
            out["held"] = err(nvmlDeviceSetMigMode, nvmlDeviceGetHandleByIndex(0), 1)
            out["held_mode"] = nvmlDeviceGetMigMode(nvmlDeviceGetHandleByIndex(0))
            out["free"] = nvmlDeviceSetMigMode(nvmlDeviceGetHandleByIndex(1), 1)
            out["free_mode"] = nvmlDeviceGetMigMode(nvmlDeviceGetHandleByIndex(1))
            out["in_use_str"] = str(NVMLError(NVML_ERROR_IN_USE))
        ''')
    finally:
        holder.kill()
        holder.wait()
    after = sim.read()
    if state["gpu.0.architecture"] == "Ampere":
        # stored as pending; activationStatus NVML_ERROR_IN_USE (nvidia-smi: "MIG mode is in pending enable state")
        assert out["held"] == 19
        assert out["held_mode"] == [0, 1]
        assert (after["gpu.0.mig.current"], after["gpu.0.mig.pending"]) == ("0", "1")
    else:
        assert out["held"] == "NVMLError_InUse"
        assert out["held_mode"] == [0, 0]
        assert (after["gpu.0.mig.current"], after["gpu.0.mig.pending"]) == ("0", "0")
    assert out["free"] == 0 and out["free_mode"] == [1, 1]
    assert out["in_use_str"] == "In use by another client"


def test_disable_mig_with_instances_is_in_use(sim):
    sim.write(_mig_state())
    out = sim.run('out["r"] = err(nvmlInit) or err(nvmlDeviceSetMigMode, nvmlDeviceGetHandleByIndex(0), 0)')
    assert out["r"] == "NVMLError_InUse"
    assert sim.read()["gpu.0.mig.current"] == "1"


def test_mig_not_supported_on_l40s(sim):
    sim.write(make_state("l40s-4"))
    out = sim.run('''
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(0)
        out["set"] = err(nvmlDeviceSetMigMode, h, 1)
        out["info"] = err(nvmlDeviceGetGpuInstanceProfileInfo, h, 0)
        out["mig_dev"] = err(nvmlDeviceGetMigDeviceHandleByIndex, h, 0)
        out["max"] = nvmlDeviceGetMaxMigDeviceCount(h)
    ''')
    assert out["set"] == out["info"] == out["mig_dev"] == "NVMLError_NotSupported"
    assert out["max"] == 0
