"""The simulated DCGM (gpufleet/sim/gpu/dcgm.py): dcgm-exporter's exposition from a hardware profile's state, its
flags and counters file as the real one reads them, and the two programs run as processes: nv-hostengine listening,
dcgm-exporter reading through it (-r) or embedding its own engine, collecting every -c milliseconds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpufleet.operations.exporters import counters_csv
from gpufleet.sim import dcgm_files
from gpufleet.sim.gpu import dcgm
from gpufleet.sim.gpu import state as simstate
from gpufleet.sim.gpu.build_nvml import build
from gpufleet.sim.hardware import build_state

REPO = Path(__file__).resolve().parents[2]


def exposition(profile: str, tmp_path, profiling: bool = True, hostname: str | None = "localhost",
               **changes: str) -> dict[str, dict[str, float]]:
    gpus = {**build_state(profile, "node1"), "driver.loaded": "1", "driver.version": "580.95.05", **changes}
    path = tmp_path / "counters.csv"
    path.write_text(counters_csv(profiling)[0])
    out: dict[str, dict[str, float]] = {}
    for line in dcgm.render(dcgm.read_counters(str(path)), gpus, hostname).splitlines():
        if line.startswith("#"):
            continue
        name, _, rest = line.partition("{")
        labels, _, value = rest.rpartition("} ")
        gpu = labels.split('gpu="', 1)[1].split('"', 1)[0]
        out.setdefault(name, {})[gpu] = float(value)
        assert 'DCGM_FI_DRIVER_VERSION="580.95.05"' in labels
        assert (f'Hostname="{hostname}"' in labels) == bool(hostname) and 'hostname="' not in labels
    return out


def test_one_series_per_gpu_from_the_state(tmp_path):
    metrics = exposition("h100-sxm-8", tmp_path, **{"gpu.2.temp.gpu": "92", "gpu.5.lost": "1"})
    assert sorted(metrics["DCGM_FI_DEV_GPU_TEMP"]) == ["0", "1", "2", "3", "4", "6", "7"]
    assert metrics["DCGM_FI_DEV_GPU_TEMP"]["2"] == 92
    state = build_state("h100-sxm-8", "node1")
    assert metrics["DCGM_FI_DEV_POWER_MGMT_LIMIT"]["0"] == int(simstate.gpu(state, 0)["power.limit_mw"]) / 1000
    assert metrics["DCGM_FI_DEV_SLOWDOWN_TEMP"]["0"] == float(simstate.gpu(state, 0)["temp.slowdown"])
    assert metrics["DCGM_FI_DEV_SHUTDOWN_TEMP"]["0"] == float(simstate.gpu(state, 0)["temp.shutdown"])
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in metrics


def test_values_print_as_dcgm_exporter_prints_them(tmp_path):
    gpus = {**build_state("h100-sxm-8", "node1"), "driver.loaded": "1", "driver.version": "580.95.05"}
    text = dcgm.render([("DCGM_FI_DEV_POWER_USAGE", "gauge", "p"), ("DCGM_FI_DEV_GPU_TEMP", "gauge", "t")], gpus,
                       "localhost")
    power = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_POWER_USAGE{")]
    temp = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{")]
    assert all(line.rsplit(" ", 1)[1].count(".") == 1 and len(line.rsplit(".", 1)[1]) == 6 for line in power)
    assert all(line.rsplit(" ", 1)[1].isdigit() for line in temp)
    assert text.startswith('# HELP DCGM_FI_DEV_POWER_USAGE p\n# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n'
                           'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="')


def test_geforce_has_no_profiling_and_no_driver_no_gpus(tmp_path):
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" not in exposition("rtx4090-1", tmp_path)
    assert exposition("h100-sxm-8", tmp_path, **{"driver.loaded": "0"}) == {}


def test_profiling_on_ampere_needs_the_proprietary_module(tmp_path, monkeypatch):
    monkeypatch.setattr(dcgm, "PROFILING_MODULE", str(tmp_path / "absent"))
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" not in exposition("a100-80gb-8", tmp_path)
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in exposition("h100-sxm-8", tmp_path)
    (tmp_path / "module").write_text("")
    monkeypatch.setattr(dcgm, "PROFILING_MODULE", str(tmp_path / "module"))
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in exposition("a100-80gb-8", tmp_path)


def test_only_the_counters_file_fields_are_exported(tmp_path):
    metrics = exposition("h100-sxm-8", tmp_path, profiling=False)
    assert not any(name.startswith("DCGM_FI_PROF_") for name in metrics)


def test_xid_series_carry_err_code_and_err_msg_of_the_last_xid(tmp_path):
    gpus = {**build_state("h100-sxm-8", "node1"), "driver.loaded": "1", "driver.version": "580.95.05",
            "gpu.3.xid.log": "13,79", "gpu.4.xid.log": "13"}
    text = dcgm.render([("DCGM_FI_DEV_XID_ERRORS", "gauge", "x")], gpus, "localhost")
    lines = {line.split('gpu="')[1].split('"')[0]: line for line in text.splitlines() if not line.startswith("#")}
    assert lines["3"].endswith(
        ',Hostname="localhost",err_code="79",err_msg="ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"} 79')
    assert lines["4"].endswith(
        ',err_code="13",err_msg="ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY"} 13')
    assert lines["0"].endswith(',err_code="0",err_msg="no Xid"} 0')


def test_recovery_action_and_nvlink_error_totals(tmp_path):
    metrics = exposition("h100-sxm-8", tmp_path, **{"gpu.1.recovery_action": "2",
                                                    "gpu.6.nvlink.errors.crc_data": "1,0,4"})
    assert metrics["DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"] == {str(i): 2.0 if i == 1 else 0.0 for i in range(8)}
    assert metrics["DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"]["6"] == 5
    assert "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL" not in exposition("rtx4090-1", tmp_path)


# ------------------------------------------------------------------------------------------------ flags, counters


def test_flags_parse_as_gos_flag_package():
    values, given = dcgm.parse_flags(["-f", "/x.csv", "--address=:9401", "-c=1000", "-n", "-r", "localhost:5555"],
                                     dcgm.EXPORTER_FLAGS)
    assert (values["collectors"], values["address"], values["collect-interval"], values["no-hostname"],
            values["remote-hostengine-info"]) == ("/x.csv", ":9401", "1000", "true", "localhost:5555")
    assert given == {"collectors", "address", "collect-interval", "no-hostname", "remote-hostengine-info"}
    assert dcgm.parse_flags([], dcgm.EXPORTER_FLAGS)[1] == set()


@pytest.mark.parametrize(("argv", "message"), [
    (["--hostengine", "x"], "flag provided but not defined: -hostengine"),
    (["-c", "15s"], 'invalid value "15s" for flag -c: parse error'),
    (["-f"], "flag needs an argument: -f"),
])
def test_unknown_flags_and_bad_values_are_refused(argv, message):
    with pytest.raises(dcgm.Refused, match=message):
        dcgm.parse_flags(argv, dcgm.EXPORTER_FLAGS)


@pytest.mark.parametrize(("text", "message"), [
    ("DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature, in C.\n", "expected 3 fields"),
    ("DCGM_FI_DEV_NO_SUCH_FIELD, gauge, x\n", "could not find DCGM field"),
    ("DCGM_FI_DEV_GPU_TEMP, gage, x\n", "could not find Prometheus metric type 'gage'"),
])
def test_a_bad_counters_file_is_refused_whole(tmp_path, text, message):
    path = tmp_path / "c.csv"
    path.write_text("# comment\n" + text)
    with pytest.raises(dcgm.Refused, match=message):
        dcgm.read_counters(str(path))


def test_the_packaged_default_counters_file_is_read(tmp_path):
    path = tmp_path / "default-counters.csv"
    path.write_text(dcgm_files.default_counters_text())
    assert dcgm.read_counters(str(path)) == list(dcgm_files.DEFAULT_COUNTERS)


# ------------------------------------------------------------------------------------------------ processes


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("dcgm")
    build(root / "lib")
    (root / "driver-version").write_text("580.95.05\n")
    state = {**build_state("h100-sxm-8", "node1"), "driver.loaded": "1", "driver.version": "580.95.05",
             "driver.cuda_version": "13.0"}
    simstate.write_state(str(root / "gpus.state"), state)
    (root / "counters.csv").write_text(counters_csv(False)[0])
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(node: Path, program: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, LD_LIBRARY_PATH=str(node / "lib"), GPUFLEET_SIM_STATE=str(node / "gpus.state"),
               GPUFLEET_SIM_DRIVER_VERSION_FILE=str(node / "driver-version"), PYTHONPATH=str(REPO))
    code = f"import sys; from gpufleet.sim.gpu.dcgm import main; sys.exit(main({[program, *args]!r}))"
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def holders(node: Path) -> set[int]:
    """Live processes holding GPU 0 open (the simulated NVML's clients), by pid."""
    state = simstate.read_state(str(node / "gpus.state"))
    pids = {int(key.rsplit(".", 1)[1]) for key in state if key.startswith("gpu.0.client.")}
    return {pid for pid in pids if os.path.exists(f"/proc/{pid}")}


def wait(what: str, predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
    return value


def metrics_text(port: int) -> str:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return ""


def stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=20)


def test_with_r_the_exporter_reads_through_the_one_host_engine(node):
    engine_port, port = free_port(), free_port()
    engine = start(node, "nv-hostengine", "-n", "--service-account", "nvidia-dcgm", "-p", str(engine_port))
    try:
        assert "using port number" in engine.stdout.readline()
        exporter = start(node, "dcgm-exporter", "-f", str(node / "counters.csv"), "-a", f"127.0.0.1:{port}",
                         "-c", "500", "-r", f"localhost:{engine_port}")
        try:
            text = wait("the exporter's first collection", lambda: metrics_text(port))
            assert text.count("DCGM_FI_DEV_GPU_TEMP{") == 8 and 'Hostname="localhost"' in text
            assert holders(node) == {engine.pid}  # the one engine holds the GPUs, the exporter does not
            # -c: a changed temperature shows within a collect interval
            with simstate.locked(str(node / "gpus.state")) as gpus:
                gpus["gpu.0.temp.gpu"] = "77"
            wait("the new temperature", lambda: 'gpu="0",' in metrics_text(port)
                 and any(line.startswith('DCGM_FI_DEV_GPU_TEMP{gpu="0",') and line.endswith(" 77")
                         for line in metrics_text(port).splitlines()), timeout=10)
        finally:
            stop(exporter)
    finally:
        stop(engine)


def test_with_r_and_no_host_engine_the_exporter_fails_so_systemd_restarts_it(node):
    exporter = start(node, "dcgm-exporter", "-f", str(node / "counters.csv"), "-a", f"127.0.0.1:{free_port()}",
                     "-r", f"localhost:{free_port()}")
    output = exporter.communicate(timeout=30)[0]
    assert exporter.returncode == 1
    assert "Failed to connect to remote hostengine" in output


def test_without_r_the_exporter_embeds_a_second_engine(node):
    port = free_port()
    exporter = start(node, "dcgm-exporter", "-f", str(node / "counters.csv"), "-a", f"127.0.0.1:{port}")
    try:
        wait("the exporter's first collection", lambda: metrics_text(port))
        wait("the embedded engine holding the GPUs", lambda: holders(node) == {exporter.pid})
    finally:
        stop(exporter)


def test_an_unknown_flag_is_refused_with_exit_1(node):
    exporter = start(node, "dcgm-exporter", "--hostengine-address", "localhost:5555")
    output = exporter.communicate(timeout=30)[0]
    assert exporter.returncode == 1 and "flag provided but not defined: -hostengine-address" in output


