"""Verify's exporter checks (gpufleet/verify/exporter_checks.py) and the probe's scrape parser."""

from __future__ import annotations

import base64
import json

from gpufleet import web_auth
from gpufleet.config import load_node_config
from gpufleet.probe.exporters import gpu_series
from gpufleet.verify.exporter_checks import check_exporters, expected_exporters, exporter_endpoints

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
    # a probe not given the endpoints (an older probe) scraped nothing: skipped, saying why
    found = run({"gpus": [], "exporters": None})
    assert [(c, v) for c, v, _ in found] == [("config.exporter.gpu", "skip"), ("config.exporter.node", "skip")]
    assert "credentials" in found[0][2]


def test_the_probe_scrapes_each_exporter_at_its_listen_address_with_the_exporters_account(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_CREDENTIALS_DIR", str(tmp_path / "credentials"))
    config = load_node_config("n1", {"ssh_hostname": "10.0.0.7", "gpufleet_exporters_node_listen": "0.0.0.0:9101"})
    endpoints = exporter_endpoints(config)
    secret = web_auth.password("exporters")
    assert endpoints == {
        "gpu": {"url": "http://10.0.0.7:9400/metrics", "user": "gpufleet", "password": secret},
        "node": {"url": "http://127.0.0.1:9101/metrics", "user": "gpufleet", "password": secret}}
    assert exporter_endpoints(load_node_config("n1", {"gpufleet_stages": ["driver"]})) is None


def test_the_probe_scrapes_an_exporter_serving_tls_over_https(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_CREDENTIALS_DIR", str(tmp_path / "credentials"))
    own = {"cert_file": "/etc/ssl/node.pem", "key_file": "/etc/ssl/node.key"}
    urls = {name: e["url"] for name, e in exporter_endpoints(load_node_config(
        "n1", {"ssh_hostname": "10.0.0.7", "gpufleet_exporters_node_tls_server_config": own})).items()}
    assert urls == {"gpu": "http://10.0.0.7:9400/metrics", "node": "https://10.0.0.7:9100/metrics"}
    urls = {name: e["url"] for name, e in exporter_endpoints(load_node_config(
        "n1", {"ssh_hostname": "10.0.0.7", "gpufleet_exporters_tls_fleet_ca": True})).items()}
    assert urls == {"gpu": "https://10.0.0.7:9400/metrics", "node": "https://10.0.0.7:9100/metrics"}


def test_the_probe_sends_basic_auth_and_reads_its_endpoints_from_stdin(tmp_path):
    import http.server
    import io
    import threading

    from gpufleet.probe import exporters as probe_exporters

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            body = TEXT.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        line = json.dumps({"gpu": {"url": url, "user": "gpufleet", "password": "pw:1"}}) + "\n"
        endpoints = probe_exporters.read_endpoints(io.StringIO(line))
        found = probe_exporters.collect_exporters(endpoints)
    finally:
        server.shutdown()
    assert seen == ["Basic " + base64.b64encode(b"gpufleet:pw:1").decode()]
    assert found["gpu"]["status"] == "ok" and found["gpu"]["url"] == url  # the password is not in the document
    assert "pw:1" not in json.dumps(found)


def test_a_lost_gpu_still_in_the_exporters_last_collection_is_neither_required_nor_wrong():
    # dcgm-exporter serves the collection it made up to -c milliseconds ago: GPU 1 lost since still has its series
    doc = probe_doc({"status": "ok", "error": None, "gpus": {"DCGM_FI_DEV_GPU_TEMP": ["0", "1"],
                                                             "DCGM_FI_DEV_POWER_USAGE": ["0"]}})
    doc["gpus"][1]["status"] = "gpu_lost"
    assert run(doc)[0] == ("config.exporter.gpu", "pass", "GPU exporter exports one series per GPU (1) for "
                                                          "DCGM_FI_DEV_GPU_TEMP, DCGM_FI_DEV_POWER_USAGE")
    doc["exporters"]["gpu"]["gpus"]["DCGM_FI_DEV_POWER_USAGE"] = []  # a usable GPU without its series still fails
    assert run(doc)[0][1] == "fail"


def test_dcgm_exporter_answers_with_the_counters_of_gpufleets_file(tmp_path):
    """config.exporter.gpu_counters: where nvidia-dcgm-exporter runs, what it answers with against the counters file
    the probe read on the node; a field it does not answer with is blank on these GPUs, one outside the file means
    it runs another file."""
    from gpufleet.probe.exporters import configured_counters, metric_names

    counters = tmp_path / "gpufleet-counters.csv"
    counters.write_text("# Managed by gpufleet\nDCGM_FI_DEV_GPU_TEMP, gauge, t.\nDCGM_FI_DEV_POWER_USAGE, gauge, p.\n"
                        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, counter, r.\nDCGM_FI_DRIVER_VERSION, label, d.\n")
    assert configured_counters(str(counters)) == ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
                                                  "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"]
    assert configured_counters(str(tmp_path / "none.csv")) is None
    assert metric_names(TEXT) == ["DCGM_FI_DEV_GPU_TEMP"]
    series = {"DCGM_FI_DEV_GPU_TEMP": ["0", "1"], "DCGM_FI_DEV_POWER_USAGE": ["0", "1"]}
    running = {"services": {"units": {"nvidia-dcgm-exporter": {"active": "active"}}}}
    entry = {"status": "ok", "error": None, "gpus": series, "configured": configured_counters(str(counters))}
    own = {**probe_doc({**entry, "metrics": ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"]}), **running}
    assert run(own)[1] == ("config.exporter.gpu_counters", "pass", "dcgm-exporter answers with 2 of the 3 configured "
                           "counters (blank on these GPUs: DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL)")
    default = {**probe_doc({**entry, "metrics": ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
                                                 "DCGM_FI_DEV_ENC_UTIL"]}), **running}
    assert run(default)[1] == ("config.exporter.gpu_counters", "fail", "dcgm-exporter answers with "
                               "DCGM_FI_DEV_ENC_UTIL, not the counters of its file (3)")
    # the NVML exporter (nvidia-dcgm-exporter not running): not checked
    assert [c for c, *_ in run(probe_doc({**entry, "metrics": ["DCGM_FI_DEV_ENC_UTIL"]}))] == [
        "config.exporter.gpu", "config.exporter.node"]
