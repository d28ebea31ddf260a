"""Node benchmarks (gpufleet/probe/bench.py): nccl-tests and dcgmi parsers against real output formats, the
orchestration with a fake CUDA backend (tests only), and the no-backend path that must never invent a number."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from gpufleet.probe import bench

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verify"
_spec = importlib.util.spec_from_file_location("verify_fakes", FIXTURES / "fakes.py")
fakes = importlib.util.module_from_spec(_spec)
sys.modules["verify_fakes"] = fakes
_spec.loader.exec_module(fakes)


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


# --------------------------------------------------------------------------------------------------------------
# nccl-tests all_reduce_perf
# --------------------------------------------------------------------------------------------------------------


def test_all_reduce_perf_h100_real_output():
    r = bench.parse_all_reduce_perf(text("nccl_all_reduce_perf_h100x8.txt"))
    assert r["n_gpus"] == 8 and r["n_threads"] == 1 and r["version"] is None
    assert len(r["rows"]) == 4
    first = r["rows"][0]
    assert first["size_bytes"] == 268435456 and first["count"] == 67108864 and first["type"] == "float"
    assert first["redop"] == "sum" and first["root"] == -1
    assert first["out_of_place"] == {"time_us": 1119.8, "algbw_gbs": 239.71, "busbw_gbs": 419.49, "wrong": 0}
    assert first["in_place"]["busbw_gbs"] == 420.42
    assert r["avg_busbw_gbs"] == 448.212 and r["out_of_bounds"] == 0 and r["wrong_total"] == 0
    assert r["max_busbw_gbs"] == 470.73
    assert [d["device"] for d in r["devices"]] == list(range(8))
    assert r["devices"][0]["name"] == "NVIDIA H100 80GB HBM3"


def test_all_reduce_perf_2_18_format_with_version_and_unalign():
    r = bench.parse_all_reduce_perf(text("nccl_all_reduce_perf_2.18.2_rtx5090x8.txt"))
    assert r["version"] == "2.18.2" and r["n_gpus"] == 8
    assert r["devices"] == [{"rank": 0, "host": "crazy", "device": 0, "bus": "0000:01:00",
                             "name": "NVIDIA GeForce RTX 5090"}]
    assert [row["size_bytes"] for row in r["rows"]] == [8, 16, 67108864]
    assert r["rows"][-1]["out_of_place"]["busbw_gbs"] == 45.42 and r["max_busbw_gbs"] == 45.47
    assert r["avg_busbw_gbs"] is None  # this capture has no footer


def test_all_reduce_perf_mpi_prefixed_footer_with_trailing_space():
    r = bench.parse_all_reduce_perf(text("nccl_all_reduce_perf_mpi_footer.txt"))
    assert r["avg_busbw_gbs"] == 1.15327 and r["out_of_bounds"] == 0 and len(r["rows"]) == 1


def test_all_reduce_perf_wrong_values_and_failed_check():
    out = text("nccl_all_reduce_perf_h100x8.txt").replace(
        "470.73      0   7985.2", "470.73      3   7985.2").replace(
        "# Out of bounds values : 0 OK", "# Out of bounds values : 2 FAILED").replace(
        "# Avg bus bandwidth    : 448.212", "# Avg bus bandwidth    : 448.212 FAILED")
    r = bench.parse_all_reduce_perf(out)
    assert r["wrong_total"] == 3 and r["out_of_bounds"] == 2 and r["avg_busbw_check"] == "FAILED"


def test_run_nccl_all_reduce_paths():
    prof = bench.PROFILES["quick"]
    assert bench.run_nccl_all_reduce(1, prof)["status"] == "skipped"
    missing = bench.run_nccl_all_reduce(8, prof, which=lambda name: None)
    if bench.find_all_reduce_perf(lambda name: None) is None:
        assert missing["status"] == "skipped" and "all_reduce_perf not found" in missing["reason"]
    runner = fakes.tool_runner({"all_reduce_perf": (0, text("nccl_all_reduce_perf_h100x8.txt"), "")})
    ok = bench.run_nccl_all_reduce(8, prof, exe="/x/all_reduce_perf", runner=runner)
    assert ok["status"] == "ok" and ok["max_busbw_gbs"] == 470.73
    assert runner.calls[0][0] == "/x/all_reduce_perf" and runner.calls[0][-2:] == ["-g", "8"]
    broken = bench.run_nccl_all_reduce(8, prof, exe="/x/all_reduce_perf", runner=fakes.tool_runner(
        {"all_reduce_perf": (1, "", "NCCL WARN Cuda failure 'out of memory'")}))
    assert broken["status"] == "error" and "out of memory" in broken["reason"]


# --------------------------------------------------------------------------------------------------------------
# dcgmi diag -j
# --------------------------------------------------------------------------------------------------------------


def test_dcgmi_3x_document_with_banner_and_nulls():
    r = bench.parse_dcgmi_diag(text("dcgmi_diag_r1_3x_h100x8.txt"))
    assert r["version"] == "3.1.0" and r["result"] == "pass"
    assert [t["name"] for t in r["tests"]] == ["Denylist", "NVML Library", "Persistence Mode",
                                               "Page Retirement/Row Remap", "software"]
    assert r["tests"][0]["results"][0]["gpus"] == list(range(8))
    assert r["tests"][-1]["results"][1]["gpus"] == [1]


def test_dcgmi_4x_document_failure_with_warning():
    r = bench.parse_dcgmi_diag(text("dcgmi_diag_r1_4x_fail.txt"))
    assert r["version"] == "4.2.3" and r["driver_version"] == "580.82.09"
    assert r["result"] == "fail"
    test = r["tests"][0]
    assert test["name"] == "software" and test["category"] == "Deployment" and test["status"] == "fail"
    assert test["results"][0]["gpus"] == [0] and "Persistence mode for GPU 0" in test["results"][0]["warnings"][0]


def test_dcgmi_hoisted_tests_and_unknown_status_is_not_a_pass():
    doc = {"version": "4.2.3", "tests": [{"name": "memory", "results": [
        {"entity_id": 0, "status": "pass"}, {"entity_id": 1, "status": "Not Run"}]},
        {"name": "pcie", "results": [{"entity_id": 0, "status": "Inconclusive"}]}]}
    r = bench.parse_dcgmi_diag(json.dumps(doc))
    assert [t["status"] for t in r["tests"]] == ["not_run", "not_run"] and r["result"] == "not_run"
    with pytest.raises(ValueError):
        bench.parse_dcgmi_diag("Error: unable to connect to host engine")


def test_run_dcgm_diag_paths():
    prof = bench.PROFILES["quick"]
    assert bench.run_dcgm_diag(prof, which=lambda name: None)["status"] == "skipped"
    runner = fakes.tool_runner({"dcgmi": (0, text("dcgmi_diag_r1_3x_h100x8.txt"), "")})
    ok = bench.run_dcgm_diag(prof, runner=runner, which=lambda name: "/usr/bin/dcgmi")
    assert ok["status"] == "ok" and ok["result"] == "pass" and ok["level"] == 1
    assert runner.calls[0] == ["/usr/bin/dcgmi", "diag", "-r", "1", "-j"]
    bad = bench.run_dcgm_diag(prof, runner=fakes.tool_runner({"dcgmi": (255, "Error: Unable to connect", "")}),
                              which=lambda name: "/usr/bin/dcgmi")
    assert bad["status"] == "error" and "Unable to connect" in bad["reason"]


# --------------------------------------------------------------------------------------------------------------
# Statistics and sampling
# --------------------------------------------------------------------------------------------------------------


def test_timing_stats_per_operation():
    stats = bench.timing_stats([10.0, 12.0, 11.0, 30.0], reps=10)
    assert stats["samples"] == 4 and stats["reps"] == 10
    assert stats["median_ms"] == 1.15 and stats["min_ms"] == 1.0 and stats["max_ms"] == 3.0
    assert stats["spread_pct"] == pytest.approx((3.0 - 1.0) / 1.15 * 100, rel=1e-3)


def test_summarize_samples_ors_reasons_and_flags_hardware():
    samples = [{"reasons": 0x4, "sm_mhz": 1980, "power_mw": 700000, "temperature_c": 70},
               {"reasons": 0x40, "sm_mhz": 1500, "power_mw": 650000, "temperature_c": 88},
               {"reasons": 0x0, "sm_mhz": None, "power_mw": 600000, "temperature_c": 80}]
    s = bench.summarize_samples(samples)
    assert s["clock_event_reasons_mask"] == "0x0000000000000044"
    assert s["clock_event_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert s["hardware_problems"] == ["hw_thermal_slowdown"]
    assert s["sm_clock_mhz"] == {"min": 1500, "median": 1740.0, "max": 1980}
    assert s["power_w"] == {"median": 650.0, "max": 700.0} and s["temperature_c"] == {"max": 88}
    empty = bench.summarize_samples([], "gpu_lost")
    assert empty["clock_event_reasons"] is None and empty["error"] == "gpu_lost" and empty["sm_clock_mhz"] is None


# --------------------------------------------------------------------------------------------------------------
# Orchestration with a fake backend
# --------------------------------------------------------------------------------------------------------------

PROBE_GPUS = [{"index": 0, "status": "ok", "uuid": "GPU-aaaa", "name": "NVIDIA H100 80GB HBM3",
               "pci_bus_id": "00000000:18:00.0"},
              {"index": 1, "status": "ok", "uuid": "GPU-bbbb", "name": "NVIDIA H100 80GB HBM3",
               "pci_bus_id": "00000000:2A:00.0"}]


def _backend(**kwargs):
    devices = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-bbbb", "pci_bus_id": None,
                "compute_capability": (9, 0), "memory_bytes": 1},
               {"index": 1, "name": "NVIDIA H100 80GB HBM3", "uuid": None, "pci_bus_id": "00000000:18:00.0",
                "compute_capability": (9, 0), "memory_bytes": 1}]
    tflops = {0: {"bf16": 750.0, "fp16": 760.0, "tf32": 380.0, "fp32": 50.0, "fp8": 1300.0},
              1: {"bf16": 700.0, "fp16": 710.0, "tf32": 350.0, "fp32": 48.0, "fp8": 1250.0}}
    gbs = {0: {"d2d": 2900.0, "h2d": 53.0, "d2h": 52.0}, 1: {"d2d": 2800.0, "h2d": 50.0, "d2h": 49.0}}
    return fakes.FakeBackend(devices, tflops, gbs, **kwargs)


def _no_tools():
    return {"nccl": lambda n, p: bench.skipped("nccl-tests all_reduce_perf not found"),
            "dcgm": lambda p: bench.skipped("dcgmi not found (DCGM not installed)")}


def test_run_bench_with_fake_backend_computes_figures_from_timings():
    backend = _backend()
    samplers = []

    def sampler(index, interval):
        samplers.append(index)
        return fakes.FakeSampler(fakes.idle_samples())

    doc = bench.run_bench("quick", gpus=PROBE_GPUS, backend=backend, sampler_factory=sampler, **_no_tools())
    assert doc["status"] == "ok" and doc["backend"] == {"name": "fake", "version": "0.0-test", "cuda_version": "12.8"}
    # CUDA device 0 is GPU-bbbb = NVML index 1 (by UUID); CUDA device 1 matches NVML index 0 by PCI bus id.
    assert [(g["cuda_device"], g["index"], g["uuid"]) for g in doc["gpus"]] == [(0, 1, "GPU-bbbb"), (1, 0, "GPU-aaaa")]
    assert samplers == [1, 0]
    g0 = doc["gpus"][0]
    bf16 = g0["matmul"]["bf16"]
    assert bf16["status"] == "ok" and bf16["n"] == 8192 and bf16["samples"] == 7
    assert bf16["tflops"] == pytest.approx(750.0, rel=0.01)  # median of the jittered samples
    assert bf16["tflops_best"] > bf16["tflops"]
    assert bf16["reps"] * bf16["median_ms"] >= bench.PROFILES["quick"]["target_sample_ms"] * 0.9
    assert g0["matmul"]["fp32"]["n"] == 4096 and g0["matmul"]["fp32"]["tflops"] == pytest.approx(50.0, rel=0.01)
    assert g0["memory_bandwidth"]["gbs"] == pytest.approx(2900.0, rel=0.01)
    assert g0["memory_bandwidth"]["bytes_moved_per_op"] == 2 * bench.PROFILES["quick"]["memory_bytes"]
    assert g0["host_to_device"]["gbs"] == pytest.approx(53.0, rel=0.01)
    assert g0["device_to_host"]["gbs"] == pytest.approx(52.0, rel=0.01)
    assert g0["during_run"]["clock_event_reasons"] == ["sw_power_cap"] and g0["during_run"]["samples"] == 5
    assert doc["nccl_all_reduce"]["status"] == "skipped" and doc["dcgm_diag"]["status"] == "skipped"
    # warm-up first (reps=1, one sample), then the timed samples with warmup 1
    first = backend.calls[0]
    assert first[:5] == ("matmul", 0, "bf16", 8192, 1) and first[6] == bench.PROFILES["quick"]["warmup"]
    json.dumps(doc)


def test_run_bench_unsupported_precision_and_errors_are_reported():
    backend = _backend(unsupported={(0, "fp8"): "fp8 needs compute capability >= 8.9 (this GPU: 8.0)"},
                       errors={(1, "tf32"): "CUDA error: an illegal memory access was encountered"})
    doc = bench.run_bench("quick", gpus=PROBE_GPUS, backend=backend,
                          sampler_factory=lambda i, s: fakes.FakeSampler([]), **_no_tools())
    assert doc["gpus"][0]["matmul"]["fp8"] == {"status": "skipped",
                                               "reason": "fp8 needs compute capability >= 8.9 (this GPU: 8.0)"}
    assert "tflops" not in doc["gpus"][0]["matmul"]["fp8"]
    err = doc["gpus"][1]["matmul"]["tf32"]
    assert err["status"] == "error" and "illegal memory access" in err["reason"] and "tflops" not in err
    assert doc["status"] == "partial"


def test_run_bench_without_backend_never_makes_up_a_number():
    doc = bench.run_bench("quick", gpus=PROBE_GPUS, backend=None,
                          backend_reason="no CUDA backend: PyTorch not installed; CuPy not installed", **_no_tools())
    assert doc["status"] == "skipped" and "PyTorch not installed" in doc["reason"]
    assert doc["gpus"] == [] and doc["backend"] is None
    flat = json.dumps(doc)
    assert "tflops" not in flat and "gbs" not in flat


def test_run_bench_without_backend_still_runs_nccl_tests():
    runner = fakes.tool_runner({"all_reduce_perf": (0, text("nccl_all_reduce_perf_h100x8.txt"), "")})
    seen = []

    def nccl(n, prof):
        seen.append(n)
        return bench.run_nccl_all_reduce(n, prof, exe="/x/all_reduce_perf", runner=runner)

    doc = bench.run_bench("quick", gpus=PROBE_GPUS, backend=None, backend_reason="no CUDA backend", nccl=nccl,
                          dcgm=lambda p: bench.skipped("dcgmi not found"))
    assert seen == [2] and doc["nccl_all_reduce"]["status"] == "ok" and doc["status"] == "ok"
    assert doc["reason"] == "no CUDA backend"


def test_run_bench_profiles():
    assert bench.run_bench("none")["status"] == "skipped"
    assert bench.run_bench("none")["reason"] == "bench profile none"
    with pytest.raises(ValueError):
        bench.run_bench("huge")
    full = bench.run_bench("full", gpus=PROBE_GPUS, backend=_backend(),
                           sampler_factory=lambda i, s: fakes.FakeSampler([]), precisions=("bf16",), **_no_tools())
    assert list(full["gpus"][0]["matmul"]) == ["bf16"] and full["gpus"][0]["matmul"]["bf16"]["n"] == 16384
    assert full["gpus"][0]["matmul"]["bf16"]["samples"] == 30


def test_detect_backend_here_reports_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    monkeypatch.setitem(sys.modules, "cupy", None)
    backend, reason = bench.detect_backend()
    assert backend is None and "PyTorch not installed" in reason and "CuPy not installed" in reason
