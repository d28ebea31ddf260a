"""The simulated dcgm-exporter's exposition (gpufleet/sim/gpu/dcgm.py) from a hardware profile's state."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gpufleet.operations.exporters import counters_csv
from gpufleet.sim.gpu import dcgm
from gpufleet.sim.gpu import state as simstate
from gpufleet.sim.hardware import build_state


def exposition(profile: str, tmp_path, profiling: bool = True, **changes: str) -> dict[str, dict[str, float]]:
    gpus = {**build_state(profile, "node1"), "driver.loaded": "1", "driver.version": "580.95.05", **changes}
    path = tmp_path / "counters.csv"
    path.write_text(counters_csv(profiling))
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(dcgm.render(dcgm.read_counters(str(path)), gpus, "node1")):
        for sample in family.samples:
            out.setdefault(sample.name, {})[sample.labels["gpu"]] = sample.value
            assert sample.labels["DCGM_FI_DRIVER_VERSION"] == "580.95.05"
            assert sample.labels["hostname"] == "node1"
    return out


def test_one_series_per_gpu_from_the_state(tmp_path):
    metrics = exposition("h100-sxm-8", tmp_path, **{"gpu.2.temp.gpu": "92", "gpu.5.lost": "1"})
    assert sorted(metrics["DCGM_FI_DEV_GPU_TEMP"]) == ["0", "1", "2", "3", "4", "6", "7"]
    assert metrics["DCGM_FI_DEV_GPU_TEMP"]["2"] == 92
    state = build_state("h100-sxm-8", "node1")
    assert metrics["DCGM_FI_DEV_POWER_MGMT_LIMIT"]["0"] == int(simstate.gpu(state, 0)["power.limit_mw"]) / 1000
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in metrics


def test_geforce_has_no_profiling_and_no_driver_no_gpus(tmp_path):
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" not in exposition("rtx4090-1", tmp_path)
    assert exposition("h100-sxm-8", tmp_path, **{"driver.loaded": "0"}) == {}


def test_only_the_counters_file_fields_are_exported(tmp_path):
    metrics = exposition("h100-sxm-8", tmp_path, profiling=False)
    assert not any(name.startswith("DCGM_FI_PROF_") for name in metrics)


def test_xid_errors_is_the_last_xid_of_each_gpu(tmp_path):
    metrics = exposition("h100-sxm-8", tmp_path, **{"gpu.3.xid.log": "13,79"})
    assert metrics["DCGM_FI_DEV_XID_ERRORS"] == {str(i): (79.0 if i == 3 else 0.0) for i in range(8)}
