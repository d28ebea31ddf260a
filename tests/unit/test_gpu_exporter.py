"""gpufleet's GPU exporter (gpufleet/exporter) against the simulated NVML, run from its bundle as a node runs it.

Every scenario runs the bundle (``gpufleet-gpu-exporter.pyz``: exporter + pynvml + prometheus-client) with
the system python in a subprocess, the simulated libnvidia-ml on LD_LIBRARY_PATH and a state from the hardware
profiles; values are judged against the simulator's state file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from gpufleet.exporter import bundle, bundle_files, write_bundle
from gpufleet.sim.gpu import state as simstate
from gpufleet.sim.gpu.build_nvml import build
from gpufleet.sim.hardware import build_state

DRIVER = "580.95.05"
DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@pytest.fixture(scope="module")
def env():
    root = Path(tempfile.mkdtemp(prefix="gf-exporter-"))
    build(root / "lib")
    (root / "driver-version").write_text(DRIVER + "\n")
    pyz = write_bundle(root)
    yield root, pyz
    shutil.rmtree(root, ignore_errors=True)


def write_state(root: Path, profile: str, **changes: str) -> Path:
    state = dict(build_state(profile, "node1"))
    state.update({"driver.loaded": "1", "driver.version": DRIVER, "driver.cuda_version": "13.0"})
    for key in [k for k in state if ".client." in k or ".proc." in k]:
        del state[key]
    state.update(changes)
    path = root / "gpus.state"
    simstate.write_state(str(path), state)
    return path


def node_env(root: Path) -> dict[str, str]:
    return dict(os.environ, LD_LIBRARY_PATH=str(root / "lib"), GPUFLEET_SIM_STATE=str(root / "gpus.state"),
                GPUFLEET_SIM_DRIVER_VERSION_FILE=str(root / "driver-version"), PYTHONPATH="")


def parse(text: str) -> tuple[dict[str, list], dict[str, str]]:
    """({metric: [(labels, value)]}, {metric: type}) of a text exposition, names exactly as exposed (prometheus-client's
    parser would rename a counter's samples to NAME_total)."""
    metrics: dict[str, list] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#"):
            match = _SAMPLE.match(line)
            assert match, line
            name, labels, value = match.groups()
            metrics.setdefault(name, []).append((dict(_LABEL.findall(labels or "")), float(value)))
            assert name in types, f"{name}: a sample without its TYPE line"
    return metrics, types


def scrape_text(root: Path, pyz: Path, settings: Path | None = None) -> str:
    """The exposition of one collection, the bundle run by the system python (as on a node)."""
    script = (f"import sys; sys.path.insert(0, {str(pyz)!r})\n"
              "import gpu_exporter\n"
              f"print(gpu_exporter.scrape_text(gpu_exporter.GpuCollector({str(settings or root / 'none')!r}, "
              "'node1')), end='')\n")
    proc = subprocess.run(["/usr/bin/python3", "-c", script], env=node_env(root), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def scrape(root: Path, pyz: Path, settings: Path | None = None) -> dict[str, list]:
    """{metric: [(labels, value)]} of one collection."""
    return parse(scrape_text(root, pyz, settings))[0]


def by_gpu(samples: list) -> dict[str, float]:
    return {labels["gpu"]: value for labels, value in samples}


def test_bundle_is_reproducible_and_self_contained():
    assert bundle() == bundle()
    names = [name for name, _ in bundle_files()]
    assert {"__main__.py", "gpu_exporter.py", "pynvml.py", "prometheus_client/__init__.py"} <= set(names)


def test_one_series_per_gpu_with_dcgm_names_and_labels(env):
    root, pyz = env
    path = write_state(root, "h100-sxm-8")
    state = simstate.read_state(str(path))
    metrics = scrape(root, pyz)
    for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_POWER_MGMT_LIMIT",
                 "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_SM_CLOCK",
                 "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_PERSISTENCE_MODE", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                 "DCGM_FI_DEV_ROW_REMAP_PENDING"):
        assert sorted(by_gpu(metrics[name])) == [str(i) for i in range(8)], name
    labels = metrics["DCGM_FI_DEV_GPU_TEMP"][0][0]
    assert set(labels) == DCGM_LABELS
    g0 = simstate.gpu(state, 0)
    assert labels == {"gpu": "0", "UUID": g0["uuid"], "pci_bus_id": g0["pci.bus_id"], "device": f"nvidia{g0['minor']}",
                      "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "node1", "DCGM_FI_DRIVER_VERSION": DRIVER}
    for i in range(8):
        g = simstate.gpu(state, i)
        assert by_gpu(metrics["DCGM_FI_DEV_GPU_TEMP"])[str(i)] == float(g["temp.gpu"])
        assert by_gpu(metrics["DCGM_FI_DEV_POWER_USAGE"])[str(i)] == int(g["power.draw_mw"]) / 1000
        assert by_gpu(metrics["DCGM_FI_DEV_POWER_MGMT_LIMIT"])[str(i)] == int(g["power.limit_mw"]) / 1000
        assert by_gpu(metrics["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"])[str(i)] == int(g["clocks.event_reasons"], 16)
    assert metrics["gpufleet_gpu_exporter_errors"] == [({"hostname": "node1"}, 0.0)]
    assert "gpufleet_gpu_power_limit_desired_watts" not in metrics  # no power stage settings on this node


def test_faults_show_as_the_alerts_expect(env):
    root, pyz = env
    write_state(root, "h100-sxm-8", **{"gpu.3.lost": "1", "gpu.1.temp.gpu": "92",
                                       "gpu.1.clocks.event_reasons": "0x0000000000000048",
                                       "gpu.2.ecc.volatile.uncorrected": "2", "gpu.2.remap.pending": "1"})
    metrics = scrape(root, pyz)
    temps = by_gpu(metrics["DCGM_FI_DEV_GPU_TEMP"])
    assert sorted(temps) == ["0", "1", "2", "4", "5", "6", "7"]  # the lost GPU exports nothing
    assert temps["1"] == 92
    assert by_gpu(metrics["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"])["1"] == 0x48
    assert by_gpu(metrics["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"])["2"] == 2
    assert by_gpu(metrics["DCGM_FI_DEV_ROW_REMAP_PENDING"])["2"] == 1
    assert metrics["gpufleet_gpu_exporter_errors"] == [({"hostname": "node1"}, 1.0)]


def test_types_and_label_order_are_dcgm_exporters(env):
    """Counters stay counters under their own names (energy, ECC, remapped rows, PCIe replays, NVLink errors: the
    types of the counters file gpufleet gives dcgm-exporter, which are those of dcgm-exporter's default file), and
    the labels come in dcgm-exporter's order."""
    from gpufleet.operations.exporters import HEALTH_COUNTERS

    root, pyz = env
    write_state(root, "h100-sxm-8")
    text = scrape_text(root, pyz)
    metrics, types = parse(text)
    counter_file = {field: kind for field, kind, _ in HEALTH_COUNTERS if kind != "label"}
    for name in [n for n in metrics if n.startswith("DCGM_FI_")]:
        assert types[name] == counter_file[name], name
    assert {n for n, t in types.items() if t == "counter" and n.startswith("DCGM_")} == {
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"} & set(metrics)
    assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL_total" not in text
    line = next(x for x in text.splitlines() if x.startswith("DCGM_FI_DEV_GPU_TEMP{"))
    assert re.findall(r'(\w+)="', line) == ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
                                            "DCGM_FI_DRIVER_VERSION"]
    assert re.search(r"^DCGM_FI_DEV_POWER_USAGE\{.*\} \d+\.\d{6}$", text, re.M)  # a double, as DCGM prints it


def test_thresholds_memory_temperature_recovery_action_nvlink_errors_and_fb_as_dcgm_reads_them(env):
    root, pyz = env
    path = write_state(root, "h100-sxm-8", **{"gpu.2.recovery_action": "1", "gpu.3.nvlink.errors.crc_flit": "0,2,5",
                                              "gpu.3.nvlink.errors.replay": "7", "gpu.3.nvlink.errors.crc_data": "1,1",
                                              "gpu.3.nvlink.errors.recovery": "0,0,0,4"})
    state = simstate.read_state(str(path))
    metrics = scrape(root, pyz)
    for i in range(8):
        g = simstate.gpu(state, i)
        assert by_gpu(metrics["DCGM_FI_DEV_SLOWDOWN_TEMP"])[str(i)] == float(g["temp.slowdown"])
        assert by_gpu(metrics["DCGM_FI_DEV_SHUTDOWN_TEMP"])[str(i)] == float(g["temp.shutdown"])
        assert by_gpu(metrics["DCGM_FI_DEV_MEMORY_TEMP"])[str(i)] == float(g["temp.memory"])
        # DCGM's FB_USED: NVML v2 used, without the driver's reserved memory
        assert by_gpu(metrics["DCGM_FI_DEV_FB_USED"])[str(i)] == float(g["memory.used_mib"])
        assert by_gpu(metrics["DCGM_FI_DEV_FB_RESERVED"])[str(i)] == float(g["memory.reserved_mib"])
    assert by_gpu(metrics["DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"]) == {str(i): 1.0 if i == 2 else 0.0 for i in range(8)}
    assert by_gpu(metrics["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"])["3"] == 7
    assert by_gpu(metrics["DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"])["3"] == 2
    assert by_gpu(metrics["DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"])["3"] == 7
    assert by_gpu(metrics["DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"]) == {
        str(i): 4.0 if i == 3 else 0.0 for i in range(8)}


def test_no_nvlink_no_nvlink_series(env):
    root, pyz = env
    write_state(root, "rtx4090-1")
    metrics = scrape(root, pyz)
    assert not [name for name in metrics if "NVLINK" in name]
    assert "DCGM_FI_DEV_MEMORY_TEMP" not in metrics  # GDDR: NVML has no memory temperature


def test_geforce_leaves_out_what_it_does_not_support(env):
    root, pyz = env
    write_state(root, "rtx4090-1")
    metrics = scrape(root, pyz)
    assert list(by_gpu(metrics["DCGM_FI_DEV_GPU_TEMP"])) == ["0"]
    assert metrics["DCGM_FI_DEV_GPU_TEMP"][0][0]["modelName"] == "NVIDIA GeForce RTX 4090"
    assert "DCGM_FI_DEV_ROW_REMAP_PENDING" not in metrics


def test_mig_layout_match_extra_and_no_desired_values(env, tmp_path):
    """The desired values come from the node plan's textfile (node_exporter), not from the exporter: it exports
    only the MIG layout match it computes from the MIG stage's file, and the current values (DCGM names)."""
    root, pyz = env
    path = write_state(root, "h100-sxm-8", **{"gpu.0.mig.current": "1", "gpu.0.mig.pending": "1"})
    state = simstate.read_state(str(path))
    g0, g1 = simstate.gpu(state, 0), simstate.gpu(state, 1)
    (tmp_path / "power-limits.conf").write_text(f"# managed\n{g0['uuid']}=500\n{g1['uuid']}=700\n")
    (tmp_path / "mig-layout.json").write_text(json.dumps({"version": 1, "gpus": [
        {"pci_bus_id": g0["pci.bus_id"], "mig_enabled": True, "create": [19]},
        {"pci_bus_id": g1["pci.bus_id"].lower(), "mig_enabled": False, "create": []}]}))
    metrics = scrape(root, pyz, tmp_path)
    assert not [name for name in metrics if name.endswith("_desired") or "_desired_" in name]
    assert by_gpu(metrics["DCGM_FI_DEV_MIG_MODE"])["0"] == 1.0 and by_gpu(metrics["DCGM_FI_DEV_MIG_MODE"])["1"] == 0
    assert by_gpu(metrics["DCGM_FI_DEV_PERSISTENCE_MODE"]) == {
        str(i): float(simstate.gpu(state, i)["persistence"]) for i in range(8)}
    assert by_gpu(metrics["DCGM_FI_DEV_POWER_MGMT_LIMIT"])["1"] == int(g1["power.limit_mw"]) / 1000
    # GPU 0: MIG on but no GPU instance where the layout wants one 1g profile (id 19): drift; GPU 1: matches
    assert by_gpu(metrics["gpufleet_gpu_mig_layout_match"]) == {"0": 0.0, "1": 1.0}


def test_serves_http_on_the_listen_address(env):
    root, pyz = env
    write_state(root, "h100-sxm-8")
    proc, url = _serve(root, pyz)
    try:
        assert "listening on 127.0.0.1:" in proc.stdout.readline()
        deadline = time.monotonic() + 30
        while True:
            try:
                body = urllib.request.urlopen(url, timeout=10).read().decode()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert body.count("DCGM_FI_DEV_GPU_TEMP{") == 8
        assert "process_cpu_seconds_total" in body
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))


def test_mig_layout_match_with_the_instances_of_the_layout(env, tmp_path):
    root, pyz = env
    instances = {"gpu.0.mig.current": "1", "gpu.0.mig.pending": "1",
                 "gpu.0.mig.gi.13": "19,6,1", "gpu.0.mig.gi.11": "19,4,1"}
    path = write_state(root, "h100-sxm-8", **instances)
    g0 = simstate.gpu(simstate.read_state(str(path)), 0)
    layout = {"version": 1, "gpus": [{"pci_bus_id": g0["pci.bus_id"], "mig_enabled": True, "create": [19, 19]}]}
    (tmp_path / "mig-layout.json").write_text(json.dumps(layout))
    # GPU instances without their compute instance: not the layout (the MIG stage would complete them)
    assert by_gpu(scrape(root, pyz, tmp_path)["gpufleet_gpu_mig_layout_match"]) == {"0": 0.0}
    write_state(root, "h100-sxm-8", **instances, **{"gpu.0.mig.ci.13.0": "0,1,0", "gpu.0.mig.ci.11.0": "0,1,0"})
    assert by_gpu(scrape(root, pyz, tmp_path)["gpufleet_gpu_mig_layout_match"]) == {"0": 1.0}
    layout["gpus"][0]["create"] = [19, 19, 19]
    (tmp_path / "mig-layout.json").write_text(json.dumps(layout))
    assert by_gpu(scrape(root, pyz, tmp_path)["gpufleet_gpu_mig_layout_match"]) == {"0": 0.0}


def test_driver_not_loaded_serves_nvml_down_instead_of_exiting(env):
    root, pyz = env
    write_state(root, "h100-sxm-8", **{"driver.loaded": "0", "driver.version": ""})
    metrics = scrape(root, pyz)
    assert metrics["gpufleet_gpu_exporter_nvml_up"] == [({"hostname": "node1"}, 0.0)]
    assert "DCGM_FI_DEV_GPU_TEMP" not in metrics


def _serve(root: Path, pyz: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["/usr/bin/python3", str(pyz), "--listen", f"127.0.0.1:{port}",
                             "--settings-dir", str(root / "none")], env=node_env(root),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, f"http://127.0.0.1:{port}/metrics"


def _wait_metrics(url: str, predicate, timeout: float = 30.0) -> dict[str, list]:
    """Scrape until ``predicate(metrics)`` holds (the event waited on), or fail."""
    deadline = time.monotonic() + timeout
    metrics: dict[str, list] = {}
    while time.monotonic() < deadline:
        try:
            text = urllib.request.urlopen(url, timeout=10).read().decode()
        except OSError:
            time.sleep(0.1)
            continue
        metrics = parse(text)[0]
        if predicate(metrics):
            return metrics
        time.sleep(0.1)
    raise AssertionError(f"timed out; last scrape: { {k: v for k, v in metrics.items() if 'xid' in k.lower()} }")


def test_xid_events_become_the_last_xid_and_a_counter(env):
    root, pyz = env
    path = write_state(root, "rtx4090-1")
    proc, url = _serve(root, pyz)
    try:
        _wait_metrics(url, lambda m: by_gpu(m.get("gpufleet_gpu_exporter_xid_events_supported", [])) == {"0": 1.0})
        assert by_gpu(scrape_once(url)["DCGM_FI_DEV_XID_ERRORS"]) == {"0": 0.0}
        for code in (13, 79):
            with simstate.locked(str(path)) as gpus:
                gpus["gpu.0.xid.log"] = ",".join(filter(None, [gpus.get("gpu.0.xid.log", ""), str(code)]))
        metrics = _wait_metrics(url, lambda m: by_gpu(m.get("DCGM_FI_DEV_XID_ERRORS", [])) == {"0": 79.0})
        counts = {s[0]["xid"]: s[1] for s in metrics["gpufleet_gpu_xid_errors_total"]}
        assert counts == {"13": 1.0, "79": 1.0}
        # dcgm-exporter's shape: the Xid's code and text as labels (one series per Xid code); the text is NVIDIA's
        # name of the Xid in its Xid catalog
        [(labels, _)] = metrics["DCGM_FI_DEV_XID_ERRORS"]
        assert set(labels) == DCGM_LABELS | {"err_code", "err_msg"}
        assert (labels["err_code"], labels["err_msg"]) == ("79", "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS")
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0


def test_no_xid_events_exports_no_xid_says_so_and_keeps_serving(env):
    root, pyz = env
    write_state(root, "rtx4090-1", **{"gpu.0.events.supported": "0"})
    proc, url = _serve(root, pyz)
    try:
        metrics = _wait_metrics(
            url, lambda m: by_gpu(m.get("gpufleet_gpu_exporter_xid_events_supported", [])) == {"0": 0.0})
        assert "DCGM_FI_DEV_XID_ERRORS" not in metrics and "DCGM_FI_DEV_GPU_TEMP" in metrics
    finally:
        proc.terminate()
        output = proc.communicate(timeout=20)[0]
    assert proc.returncode == 0
    assert "NVML has no Xid events here (NOT_SUPPORTED): DCGM_FI_DEV_XID_ERRORS is not exported" in output


def scrape_once(url: str) -> dict[str, list]:
    return _wait_metrics(url, lambda m: True)
