"""Verify's exporter checks (gpufleet/verify/exporter_checks.py) and the probe's scrape parser."""

from __future__ import annotations

from gpufleet.config import load_node_config
from gpufleet.probe.exporters import gpu_series
from gpufleet.verify.exporter_checks import check_exporters, expected_exporters

TEXT = """# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="X"} 33
DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-b",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="X"} 34
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a"} 70.5
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-a"} 345
"""


def run(probe, data=None):
    found = []
    check_exporters(lambda check, verdict, message, remediation="", **kw: found.append((check, verdict, message)),
                    probe, expected_exporters(load_node_config("n1", data or {})))
    return found


def probe_doc(gpu_entry, node_status="ok", gpus=2):
    return {"gpus": [{"index": i, "status": "ok"} for i in range(gpus)],
            "exporters": {"gpu": {"url": "http://127.0.0.1:9400/metrics", **gpu_entry},
                          "node": {"url": "http://127.0.0.1:9100/metrics", "status": node_status,
                                   "error": None if node_status == "ok" else "URLError: refused", "gpus": {}}}}


def test_gpu_series_counts_gpu_labels_of_core_metrics():
    assert gpu_series(TEXT) == {"DCGM_FI_DEV_GPU_TEMP": ["0", "1"], "DCGM_FI_DEV_POWER_USAGE": ["0"],
                                "DCGM_FI_DEV_GPU_UTIL": [], "DCGM_FI_DEV_FB_USED": []}


def test_one_series_per_gpu_passes():
    both = {"status": "ok", "error": None, "gpus": {"DCGM_FI_DEV_GPU_TEMP": ["0", "1"],
                                                    "DCGM_FI_DEV_POWER_USAGE": ["0", "1"],
                                                    "DCGM_FI_DEV_GPU_UTIL": []}}  # MIG GPUs: no utilisation
    assert run(probe_doc(both)) == [
        ("config.exporter.gpu", "pass", "GPU exporter exports one series per GPU (2) for DCGM_FI_DEV_GPU_TEMP, "
                                        "DCGM_FI_DEV_POWER_USAGE"),
        ("config.exporter.node", "pass", "node_exporter answers at http://127.0.0.1:9100/metrics")]


def test_missing_series_and_a_silent_node_exporter_fail():
    found = run(probe_doc({"status": "ok", "error": None, "gpus": gpu_series(TEXT)}, node_status="error"))
    assert found == [
        ("config.exporter.gpu", "fail", "GPU exporter exports DCGM_FI_DEV_POWER_USAGE for GPU(s) ['0'], expected "
                                        "one series for each of GPU(s) ['0', '1']"),
        ("config.exporter.node", "fail", "node exporter does not answer at http://127.0.0.1:9100/metrics: "
                                         "URLError: refused")]


def test_stage_off_or_exporter_none_is_not_checked():
    both = {"status": "ok", "error": None, "gpus": {"DCGM_FI_DEV_GPU_TEMP": ["0", "1"]}}
    assert run(probe_doc(both), {"gpufleet_stages": ["driver"]}) == []
    assert [c for c, *_ in run(probe_doc(both), {"gpufleet_exporters_gpu": "none"})] == ["config.exporter.node"]
    assert run(probe_doc(both), {"gpufleet_exporters_gpu_listen": "10.0.0.1:9400"})[0][1] == "skip"


def test_a_lost_gpu_still_in_the_exporters_last_collection_is_neither_required_nor_wrong():
    # dcgm-exporter serves the collection it made up to -c milliseconds ago: GPU 1 lost since still has its series
    doc = probe_doc({"status": "ok", "error": None, "gpus": {"DCGM_FI_DEV_GPU_TEMP": ["0", "1"],
                                                             "DCGM_FI_DEV_POWER_USAGE": ["0"]}})
    doc["gpus"][1]["status"] = "gpu_lost"
    assert run(doc)[0] == ("config.exporter.gpu", "pass", "GPU exporter exports one series per GPU (1) for "
                                                          "DCGM_FI_DEV_GPU_TEMP, DCGM_FI_DEV_POWER_USAGE")
    doc["exporters"]["gpu"]["gpus"]["DCGM_FI_DEV_POWER_USAGE"] = []  # a usable GPU without its series still fails
    assert run(doc)[0][1] == "fail"
