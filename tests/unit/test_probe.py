"""The node probe (gpufleet/probe/probe.py): parsers, failure recording, shipping as a directory, and the real
probe against the simulated NVML for every hardware profile (with faults injected into the state)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpufleet.catalog import load_catalog
from gpufleet.probe import PROBE_DIR, PROBE_FILES, probe, probe_nvml
from tests import upstream

REPO = Path(__file__).resolve().parents[2]
PROFILES = ["h100-sxm-8", "h200-8", "a100-80gb-8", "a100-40gb-1", "l40s-4", "rtx4090-1"]
DRIVER = "570.172.08"


# --------------------------------------------------------------------------------------------------------------
# Pure helpers
# --------------------------------------------------------------------------------------------------------------


def test_clock_event_reasons_decoded_with_hardware_problems_flagged():
    names, hardware = probe_nvml.decode_clock_event_reasons(0x1)
    assert names == ["gpu_idle"] and hardware == []
    names, hardware = probe_nvml.decode_clock_event_reasons(0x8 | 0x40 | 0x80 | 0x4)
    assert names == ["sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"]
    assert hardware == ["hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"]
    names, hardware = probe_nvml.decode_clock_event_reasons(0x20 | 0x10 | 0x2 | 0x100)
    assert names == ["applications_clocks_setting", "sync_boost", "sw_thermal_slowdown", "display_clock_setting"]
    assert hardware == []
    names, _ = probe_nvml.decode_clock_event_reasons(0x1000)
    assert names == ["unknown_0x1000"]
    assert probe_nvml.hex_mask(0x1FF) == "0x00000000000001FF"


class _NvmlError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value


@pytest.mark.parametrize("code,status", [(3, "not_supported"), (4, "no_permission"), (15, "gpu_lost"),
                                         (1, "uninitialized"), (9, "driver_not_loaded"),
                                         (18, "lib_rm_version_mismatch"), (13, "function_not_found"),
                                         (999, "unknown:999"), (2, "unknown:2")])
def test_nvml_status_strings(code, status):
    assert probe_nvml.nvml_status(_NvmlError(code)) == status


def test_nvml_status_of_other_exceptions():
    assert probe_nvml.nvml_status(AttributeError("x")) == "function_not_found"
    assert probe_nvml.nvml_status(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad")) == "error:UnicodeDecodeError"


def test_nccl_conf_parsed_as_nccl_reads_it():
    text = ("# comment\nNCCL_DEBUG=WARN\nNCCL_SOCKET_IFNAME==ens1f0\r\n no_equals_line\nNCCL_DEBUG=INFO\n"
            "NCCL_IB_HCA = mlx5\nEMPTY=\n")
    values = probe.parse_nccl_conf(text)
    # first occurrence wins (setenv without overwrite), no trimming, CR stripped, '=' inside the value kept
    assert values == {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "=ens1f0", "NCCL_IB_HCA ": " mlx5", "EMPTY": ""}


def test_nccl_conf_missing_and_present(tmp_path):
    missing = probe.collect_nccl_conf(str(tmp_path / "nope.conf"))
    assert missing == {"path": str(tmp_path / "nope.conf"), "exists": False, "content": None, "values": {},
                       "error": None}
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_P2P_LEVEL=NVL\n")
    got = probe.collect_nccl_conf(str(conf))
    assert got["exists"] and got["content"] == "NCCL_P2P_LEVEL=NVL\n" and got["values"] == {"NCCL_P2P_LEVEL": "NVL"}
    unreadable = probe.collect_nccl_conf(str(tmp_path))  # a directory: IsADirectoryError
    assert unreadable["error"] and unreadable["exists"]


SYSTEMCTL_SHOW = """Id=nvidia-persistenced.service
LoadState=loaded
ActiveState=active
SubState=running
UnitFileState=enabled

Id=nvidia-fabricmanager.service
LoadState=not-found
ActiveState=inactive
SubState=dead
UnitFileState=

Id=dcgm-exporter.service
LoadState=loaded
ActiveState=failed
SubState=failed
UnitFileState=disabled
"""


def test_parse_systemctl_show_blocks_in_order():
    units = ["nvidia-persistenced.service", "nvidia-fabricmanager.service", "dcgm-exporter.service"]
    got = probe.parse_systemctl_show(SYSTEMCTL_SHOW, units)
    assert got["nvidia-persistenced.service"] == {"load": "loaded", "active": "active", "sub": "running",
                                                  "enabled": "enabled"}
    assert got["nvidia-fabricmanager.service"]["enabled"] == "not-found"
    assert got["dcgm-exporter.service"]["active"] == "failed"


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_collect_services_with_systemctl(tmp_path):
    out = tmp_path / "show.txt"
    out.write_text(SYSTEMCTL_SHOW)
    args = tmp_path / "args.txt"
    exe = _script(tmp_path / "systemctl", f'echo "$@" > {args}\ncat {out}\n')
    got = probe.collect_services(("nvidia-persistenced", "nvidia-fabricmanager", "dcgm-exporter"), systemctl=exe)
    assert got["status"] == "ok"
    assert got["units"]["nvidia-persistenced"]["active"] == "active"
    assert got["units"]["dcgm-exporter"]["enabled"] == "disabled"
    assert "nvidia-persistenced.service" in args.read_text() and args.read_text().startswith("show")


def test_collect_services_tolerates_no_systemd(tmp_path):
    exe = _script(tmp_path / "systemctl", 'echo "System has not been booted with systemd as init system (PID 1). '
                  "Can't operate.\" >&2\nexit 1\n")
    got = probe.collect_services(("nvidia-persistenced",), systemctl=exe)
    assert got["status"] == "no_systemd" and got["units"] == {} and "not been booted" in got["error"]
    got = probe.collect_services(("x",), systemctl=str(tmp_path / "does-not-exist"))
    assert got["status"] == "error"
    assert probe.collect_services((), systemctl=exe) == {"status": "ok", "error": None, "units": {}}


def test_kernel_log_from_file_keeps_only_xid_lines(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text((REPO / "tests/fixtures/verify/kernel_log_xid.txt").read_text())
    got = probe.collect_kernel_log(path=str(log))
    assert got["status"] == "ok" and got["source"] == "file"
    assert len(got["xid_lines"]) == 5 and all("NVRM: Xid" in line for line in got["xid_lines"])


def test_kernel_log_falls_back_to_dmesg(tmp_path):
    journal = _script(tmp_path / "journalctl", "echo 'No journal files were found.' >&2\nexit 1\n")
    dmesg = _script(tmp_path / "dmesg", "echo '[ 1.0] hello'\necho '[ 2.0] NVRM: Xid (PCI:0000:18:00): 79, pid=0'\n")
    got = probe.collect_kernel_log(journalctl=journal, dmesg=dmesg)
    assert got["status"] == "ok" and got["source"] == "dmesg" and len(got["xid_lines"]) == 1
    failing = _script(tmp_path / "dmesg2", "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2\n"
                      "exit 1\n")
    got = probe.collect_kernel_log(journalctl=journal, dmesg=failing)
    assert got["status"] == "unavailable" and "Operation not permitted" in got["error"]


# --------------------------------------------------------------------------------------------------------------
# Failure recording with an in-process fake NVML module
# --------------------------------------------------------------------------------------------------------------


class FakeNvml:
    """Minimal pynvml stand-in: one GPU; selected functions fail with given NVML codes."""

    def __init__(self, fail: dict[str, int] | None = None, init_error: int | None = None, missing=()):
        self.fail = fail or {}
        self.init_error = init_error
        for name in missing:
            setattr(self, name, None)

    def __getattribute__(self, name):
        value = object.__getattribute__(self, name)
        if name.startswith("nvml") and value is not None:
            fail = object.__getattribute__(self, "fail")
            if name in fail:
                code = fail[name]

                def failing(*args, _code=code):
                    raise _NvmlError(_code)
                return failing
        return value

    def nvmlInit(self):
        if self.init_error is not None:
            raise _NvmlError(self.init_error)

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return "570.172.08"

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return 12080

    def nvmlSystemGetNVMLVersion(self):
        return b"12.570.172.08"

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return object()

    def nvmlDeviceGetUUID(self, h):
        return "GPU-12345678-1234-1234-1234-123456789abc"

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetPowerManagementLimit(self, h):
        return 700000

    def nvmlDeviceGetPowerUsage(self, h):
        return 69850

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x41

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=b"00000000:18:00.0", pciDeviceId=0x233010DE)

    recovery_action = 0

    def nvmlDeviceGetFieldValues(self, h, ids):
        # NVML_FI_DEV_MEMORY_TEMP and NVML_FI_DEV_GET_GPU_RECOVERY_ACTION answered as NVML_VALUE_TYPE_UNSIGNED_INT
        value = {82: 48, 230: self.recovery_action}[ids[0]]
        return [SimpleNamespace(fieldId=ids[0], nvmlReturn=0, valueType=1, value=SimpleNamespace(uiVal=value))]


def test_failures_are_recorded_per_field_and_never_abort():
    nvml = FakeNvml(fail={"nvmlDeviceGetPowerUsage": 4, "nvmlDeviceGetName": 999})
    doc = probe.collect_nvml(nvml)
    assert doc["nvml_error"] is None and doc["driver_version"] == "570.172.08"
    assert doc["cuda_driver_version"] == "12.8" and doc["nvml_version"] == "12.570.172.08"
    gpu = doc["gpus"][0]
    assert gpu["status"] == "ok"
    assert gpu["power"]["limit_w"] == 700.0 and gpu["power"]["draw_w"] is None
    assert gpu["errors"]["power.draw_w"] == "no_permission"
    assert gpu["name"] is None and gpu["errors"]["name"] == "unknown:999"
    assert gpu["pci_bus_id"] == "00000000:18:00.0" and gpu["pci_device_id"] == "0x233010DE"
    # functions the fake does not have at all are recorded, the rest of the document is still there
    assert gpu["errors"]["ecc.mode_current"] == "function_not_found"
    assert gpu["clock_event_reasons"]["active"] == ["gpu_idle", "hw_thermal_slowdown"]
    assert gpu["clock_event_reasons"]["hardware_problems"] == ["hw_thermal_slowdown"]
    assert set(gpu) >= {"power", "temperature", "clocks", "ecc", "row_remap", "pcie", "nvlink", "mig", "processes"}
    assert gpu["temperature"]["memory_c"] == 48


def test_field_value_with_its_own_error_code():
    nvml = FakeNvml()
    nvml.nvmlDeviceGetFieldValues = lambda h, ids: [SimpleNamespace(nvmlReturn=3, valueType=1,
                                                                    value=SimpleNamespace(uiVal=0))]
    gpu = probe.collect_nvml(nvml)["gpus"][0]
    assert gpu["temperature"]["memory_c"] is None and gpu["errors"]["temperature.memory_c"] == "not_supported"


def test_recovery_action_from_nvml_where_the_driver_has_it():
    nvml = FakeNvml()
    nvml.recovery_action = 1
    assert probe.collect_nvml(nvml)["gpus"][0]["recovery_action"] == 1
    old_driver = FakeNvml()
    old_driver.nvmlDeviceGetFieldValues = lambda h, ids: [SimpleNamespace(
        nvmlReturn=0 if ids[0] == 82 else 3, valueType=1, value=SimpleNamespace(uiVal=45))]
    gpu = probe.collect_nvml(old_driver)["gpus"][0]
    assert gpu["recovery_action"] is None and gpu["errors"]["recovery_action"] == "not_supported"
    assert gpu["temperature"]["memory_c"] == 45


def test_nvml_ids_the_probe_uses_are_nvml_s():
    nvml = upstream.nvml_facts()
    field_ids = nvml["field_ids"]
    assert probe_nvml._FI_DEV_GET_GPU_RECOVERY_ACTION == field_ids["NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"]["value"]
    assert probe_nvml._FI_DEV_MEMORY_TEMP == nvml["field_ids"]["NVML_FI_DEV_MEMORY_TEMP"]["value"]
    thresholds = nvml["temperature_thresholds"]
    assert (probe_nvml._THRESHOLD_SHUTDOWN, probe_nvml._THRESHOLD_SLOWDOWN, probe_nvml._THRESHOLD_MEM_MAX,
            probe_nvml._THRESHOLD_GPU_MAX) == tuple(thresholds[f"NVML_TEMPERATURE_THRESHOLD_{k}"]["value"]
                                               for k in ("SHUTDOWN", "SLOWDOWN", "MEM_MAX", "GPU_MAX"))


def test_old_pynvml_without_event_reason_api_uses_throttle_name():
    nvml = FakeNvml(missing=("nvmlDeviceGetCurrentClocksEventReasons",))
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x4
    gpu = probe.collect_nvml(nvml)["gpus"][0]
    assert gpu["clock_event_reasons"]["active"] == ["sw_power_cap"]


@pytest.mark.parametrize("code,status", [(9, "driver_not_loaded"), (18, "lib_rm_version_mismatch"),
                                         (12, "library_not_found")])
def test_nvml_init_failure_gives_top_level_error(code, status):
    doc = probe.collect_nvml(FakeNvml(init_error=code))
    assert doc["nvml_error"] == status and doc["gpus"] == [] and doc["gpu_count"] is None


def test_handle_failure_gives_skeleton_gpu():
    doc = probe.collect_nvml(FakeNvml(fail={"nvmlDeviceGetHandleByIndex": 15}))
    gpu = doc["gpus"][0]
    assert gpu["status"] == "gpu_lost" and gpu["uuid"] is None and gpu["power"]["limit_w"] is None
    assert set(gpu) == set(probe_nvml.empty_gpu(0))


def test_collect_document_shape(tmp_path):
    doc = probe.collect(FakeNvml(), services=(), nccl_conf=str(tmp_path / "none"), kernel_log=False,
                        hostname="n1")
    assert doc["schema"] == "gpufleet.probe" and doc["schema_version"] == probe.SCHEMA_VERSION
    assert doc["host"] == "n1" and doc["timestamp"].endswith("Z") and doc["bench"] is None
    assert doc["kernel_log"]["status"] == "skipped"
    json.dumps(doc)  # serialisable
    ran = []
    doc = probe.collect(FakeNvml(), services=(), nccl_conf=str(tmp_path / "none"), kernel_log=False,
                        bench="quick", bench_runner=lambda profile, gpus: ran.append((profile, gpus)) or {"x": 1})
    assert doc["bench"] == {"x": 1} and ran[0][0] == "quick" and ran[0][1][0]["uuid"].startswith("GPU-")


# --------------------------------------------------------------------------------------------------------------
# Shipping: stdlib + pynvml only, Python 3.9, runs as a script from a copied directory
# --------------------------------------------------------------------------------------------------------------

_STDLIB_OK = {"__future__", "argparse", "ctypes", "json", "math", "os", "platform", "re", "shutil", "socket",
              "statistics", "subprocess", "sys", "tempfile", "threading", "time", "typing", "collections",
              "collections.abc", "urllib.request", "base64", "ssl"}
_OPTIONAL = {"pynvml", "torch", "cupy", "probe", "probe_nvml", "bench", "exporters"}


@pytest.mark.parametrize("name", PROBE_FILES)
def test_probe_files_import_only_stdlib_and_nvml(name):
    tree = ast.parse((Path(PROBE_DIR) / name).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: inside the probe directory
                continue
            modules = [node.module or ""]
        else:
            continue
        for module in modules:
            assert module in _STDLIB_OK | _OPTIONAL, f"{name} imports {module}: the probe must ship alone"


@pytest.mark.parametrize("name", PROBE_FILES)
def test_probe_files_are_python39_syntax(name):
    ast.parse((Path(PROBE_DIR) / name).read_text(), feature_version=(3, 9))


def _python39() -> str | None:
    candidates = sorted(Path.home().glob(".pyenv/versions/3.9*/bin/python3.9"))
    candidates += [Path(p) for p in (shutil.which("python3.9"),) if p]
    for candidate in candidates:
        proc = subprocess.run([str(candidate), "--version"], capture_output=True, text=True, check=False)
        if proc.returncode == 0 and proc.stdout.startswith("Python 3.9"):
            return str(candidate)
    return None


def _copy_probe(dest: Path) -> Path:
    target = dest / "probe"
    target.mkdir()
    for name in PROBE_FILES:
        shutil.copy(Path(PROBE_DIR) / name, target / name)
    return target


@pytest.mark.parametrize("interpreter", ["current", "python3.9"])
def test_shipped_directory_runs_as_script_and_module(tmp_path, interpreter):
    python = sys.executable if interpreter == "current" else _python39()
    if python is None:
        pytest.skip("no Python 3.9 interpreter here")
    target = _copy_probe(tmp_path)
    env = {"PATH": os.environ.get("PATH", ""), "LD_LIBRARY_PATH": str(tmp_path / "no-nvml-here")}
    for argv, cwd in (([python, "probe.py", "--kernel-log", "none"], target),
                      ([python, "-m", "probe", "--kernel-log", "none"], tmp_path)):
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["schema"] == "gpufleet.probe"
        # No NVML library (or no pynvml in that interpreter): recorded, not raised.
        assert doc["nvml_error"] in ("library_not_found", "pynvml_not_installed")


# --------------------------------------------------------------------------------------------------------------
# Against the simulated NVML (gpufleet/sim/gpu/libnvidia-ml.c) seen through the real nvidia-ml-py
# --------------------------------------------------------------------------------------------------------------

needs_sim = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build the simulated NVML")


@pytest.fixture(scope="module")
def simlib():
    from gpufleet.sim.gpu.build_nvml import build

    path = Path(tempfile.mkdtemp(prefix="probe-simnvml-"))
    build(path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def booted_state(profile: str, hostname: str = "node1") -> dict[str, str]:
    from gpufleet.sim.hardware import build_state

    state = dict(build_state(profile, hostname))
    state.update({"driver.loaded": "1", "driver.version": DRIVER, "driver.cuda_version": "12.8"})
    return state


def run_probe(simlib: Path, tmp_path: Path, state: dict[str, str], *args: str, version: str = DRIVER) -> dict:
    from gpufleet.sim.gpu import state as simstate

    state_file = tmp_path / "gpus.state"
    simstate.write_state(str(state_file), state)
    version_file = tmp_path / "driver-version"
    version_file.write_text(version + "\n")
    env = dict(os.environ, LD_LIBRARY_PATH=str(simlib), GPUFLEET_SIM_STATE=str(state_file),
               GPUFLEET_SIM_DRIVER_VERSION_FILE=str(version_file), PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "gpufleet.probe", "--kernel-log", "none", "--hostname", "node1",
                           *args], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@needs_sim
@pytest.mark.parametrize("profile", PROFILES)
def test_probe_reads_every_profile(simlib, tmp_path, profile):
    state = booted_state(profile)
    doc = run_probe(simlib, tmp_path, state)
    n = int(state["gpu.count"])
    assert doc["nvml_error"] is None and doc["driver_version"] == DRIVER and doc["cuda_driver_version"] == "12.8"
    assert doc["gpu_count"] == n and len(doc["gpus"]) == n
    catalog = load_catalog()
    for i, gpu in enumerate(doc["gpus"]):
        g = {k.split(".", 2)[2]: v for k, v in state.items() if k.startswith(f"gpu.{i}.")}
        assert gpu["status"] == "ok", gpu["errors"]
        assert gpu["index"] == i and gpu["uuid"] == g["uuid"] and gpu["name"] == g["name"]
        assert catalog.by_name(gpu["name"]).key == g["model"]
        assert gpu["serial"] == (g["serial"] or None)
        assert gpu["pci_bus_id"] == g["pci.bus_id"] and gpu["pci_device_id"] == g["pci.device_id"]
        assert gpu["power"]["limit_w"] == int(g["power.limit_mw"]) / 1000
        assert gpu["power"]["min_limit_w"] == int(g["power.min_mw"]) / 1000
        assert gpu["power"]["max_limit_w"] == int(g["power.max_mw"]) / 1000
        assert gpu["power"]["default_limit_w"] == int(g["power.default_mw"]) / 1000
        assert gpu["persistence_mode"] is (g["persistence"] == "1")
        assert gpu["temperature"]["gpu_c"] == int(g["temp.gpu"])
        assert gpu["clocks"]["max_sm_mhz"] == int(g["clocks.max.sm"])
        assert gpu["clock_event_reasons"]["active_mask"] == f"0x{int(g['clocks.event_reasons'], 16):016X}"
        assert gpu["pcie"]["width_max"] == int(g["pcie.width_max"]) and gpu["pcie"]["gen_max"] == int(
            g["pcie.gen_max"])
        if g["ecc.supported"] == "1":
            assert gpu["ecc"]["mode_current"] is (g["ecc.current"] == "1")
            assert gpu["ecc"]["volatile_uncorrected"] == 0
        else:
            assert gpu["ecc"]["mode_current"] is None and gpu["errors"]["ecc.mode_current"] == "not_supported"
        links = int(g["nvlink.count"] or 0)
        assert gpu["nvlink"]["supported"] is (True if links else False)
        assert len(gpu["nvlink"]["links"]) == links and gpu["nvlink"]["down"] == []
        if g["mig.supported"] == "1":
            assert gpu["mig"] == {"mode_current": False, "mode_pending": False, "gpu_instances": []}
        else:
            assert gpu["mig"]["mode_current"] is None
        assert gpu["processes"] == []


@needs_sim
def test_probe_records_injected_faults(simlib, tmp_path):
    state = booted_state("h100-sxm-8")
    state["gpu.1.lost"] = "1"
    state["gpu.2.ecc.volatile.uncorrected"] = "3"
    state["gpu.2.ecc.aggregate.uncorrected"] = "5"
    state["gpu.2.remap.pending"] = "1"
    state["gpu.2.remap.uncorrectable"] = "2"
    state["gpu.3.clocks.event_reasons"] = "0x0000000000000088"
    state["gpu.3.temp.gpu"] = "93"
    state["gpu.4.nvlink.down"] = "0,17"
    state["gpu.5.pcie.width_current"] = "8"
    state["gpu.6.power.limit_mw"] = "450000"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state[f"gpu.7.proc.{holder.pid}"] = "python3,2048"
        doc = run_probe(simlib, tmp_path, state)
    finally:
        holder.kill()
        holder.wait()
    gpus = doc["gpus"]
    assert gpus[1]["status"] == "gpu_lost" and gpus[1]["errors"]["uuid"] == "gpu_lost"
    assert [g["status"] for i, g in enumerate(gpus) if i != 1] == ["ok"] * 7
    assert gpus[2]["ecc"]["volatile_uncorrected"] == 3 and gpus[2]["ecc"]["aggregate_uncorrected"] == 5
    assert gpus[2]["row_remap"] == {"correctable": 0, "uncorrectable": 2, "pending": True, "failure": False}
    assert gpus[3]["clock_event_reasons"]["hardware_problems"] == ["hw_slowdown", "hw_power_brake_slowdown"]
    assert gpus[3]["temperature"]["gpu_c"] == 93
    assert gpus[4]["nvlink"]["down"] == [0, 17] and gpus[4]["nvlink"]["up"] == 16
    assert gpus[5]["pcie"]["width_current"] == 8
    assert gpus[6]["power"]["limit_w"] == 450.0
    assert gpus[7]["processes"] == [{"pid": holder.pid, "name": "python3", "used_mib": 2048,
                                     "gpu_instance_id": None, "compute_instance_id": None}]


@needs_sim
def test_probe_reads_mig_instances(simlib, tmp_path):
    state = booted_state("a100-40gb-1")
    state["gpu.0.mig.current"] = state["gpu.0.mig.pending"] = "1"
    state["gpu.0.mig.gi.1"] = "9,0,4"
    state["gpu.0.mig.ci.1.0"] = "2,3,0,MIG-aaaaaaaa-1111-5222-8333-944455556666"
    state["gpu.0.mig.gi.11"] = "19,4,1"
    doc = run_probe(simlib, tmp_path, state)
    mig = doc["gpus"][0]["mig"]
    assert mig["mode_current"] is True
    assert [(gi["id"], gi["profile_name"], gi["placement"]) for gi in mig["gpu_instances"]] == [
        (1, "3g.20gb", {"start": 0, "size": 4}), (11, "1g.5gb", {"start": 4, "size": 1})]
    cis = mig["gpu_instances"][0]["compute_instances"]
    assert len(cis) == 1 and cis[0]["uuid"] == "MIG-aaaaaaaa-1111-5222-8333-944455556666"
    assert mig["gpu_instances"][1]["compute_instances"] == []


@needs_sim
@pytest.mark.parametrize("case,status", [("not_loaded", "driver_not_loaded"), ("mismatch", "lib_rm_version_mismatch")])
def test_probe_nvml_init_errors(simlib, tmp_path, case, status):
    state = booted_state("l40s-4")
    version = DRIVER
    if case == "not_loaded":
        state["driver.loaded"], state["driver.version"] = "0", ""
    else:
        version = "580.65.06"
    doc = run_probe(simlib, tmp_path, state, version=version)
    assert doc["nvml_error"] == status and doc["gpus"] == []
    assert doc["nccl_conf"]["path"] == "/etc/nccl.conf"  # the rest of the document is still there


@needs_sim
def test_probe_takes_under_a_second_for_eight_gpus(simlib, tmp_path):
    from gpufleet.sim.gpu import state as simstate

    state_file = tmp_path / "gpus.state"
    simstate.write_state(str(state_file), booted_state("h100-sxm-8"))
    (tmp_path / "v").write_text(DRIVER + "\n")
    code = ("import time, json; from gpufleet.probe import probe\n"
            "t = time.perf_counter(); doc = probe.collect_nvml(); print(json.dumps([time.perf_counter() - t, "
            "len(doc['gpus'])]))\n")
    env = dict(os.environ, LD_LIBRARY_PATH=str(simlib), GPUFLEET_SIM_STATE=str(state_file),
               GPUFLEET_SIM_DRIVER_VERSION_FILE=str(tmp_path / "v"), PYTHONPATH=str(REPO))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    elapsed, count = json.loads(proc.stdout)
    assert count == 8
    assert elapsed < 1.0, f"NVML part of the probe took {elapsed:.3f} s for 8 GPUs"
    assert time.perf_counter() - start < 5.0


@needs_sim
def test_probe_runs_on_python39_with_nvidia_ml_py(simlib, tmp_path):
    python = _python39()
    if python is None:
        pytest.skip("no Python 3.9 interpreter here")
    import pynvml

    from gpufleet.sim.gpu import state as simstate

    libs = tmp_path / "site"
    libs.mkdir()
    shutil.copy(pynvml.__file__, libs / "pynvml.py")  # nvidia-ml-py is this one pure-Python module
    target = _copy_probe(tmp_path)
    simstate.write_state(str(tmp_path / "gpus.state"), booted_state("h100-sxm-8"))
    (tmp_path / "v").write_text(DRIVER + "\n")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(libs), "LD_LIBRARY_PATH": str(simlib),
           "GPUFLEET_SIM_STATE": str(tmp_path / "gpus.state"), "GPUFLEET_SIM_DRIVER_VERSION_FILE": str(tmp_path / "v")}
    proc = subprocess.run([python, str(target / "probe.py"), "--kernel-log", "none"], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["python_version"].startswith("3.9") and doc["nvml_error"] is None
    assert [g["status"] for g in doc["gpus"]] == ["ok"] * 8
