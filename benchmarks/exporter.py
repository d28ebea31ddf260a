"""Scrape latency and CPU per scrape of both GPU exporters on an 8-GPU simulated host (HGX H100).

    .venv/bin/python benchmarks/exporter.py [SCRAPES]      (default 200; needs root, like `gpufleet sim`)

Brings up one simulated ``h100-sxm-8`` host with the driver preinstalled, converges it with
``deploys/gpu_node.py`` once per exporter (``gpufleet_exporters_gpu=nvml``, then ``dcgm``), and scrapes
``http://HOST:9400/metrics`` SCRAPES times from the control machine, one after the other. Prints per exporter:
p50 / p95 scrape latency, the exporter process's CPU time per scrape (utime + stime of its main process from
/proc, before and after), its CPU while idle between scrapes (IDLE_S seconds without a scrape: gpufleet's
exporter waits on NVML's Xid events in a background thread), and what both make as a share of one core at a 15 s
scrape interval. On a real GPU the event wait blocks in the driver; the simulated NVML polls its state file (a
stat every 50 ms), so the idle figure here is the simulator's cost, an upper bound.

Targets for gpufleet's exporter (issue 9): p50 < 50 ms per scrape of 8 GPUs, < 1 % of one core at 15 s.
The simulated dcgm-exporter is the simulator's stand-in (Python, reads the state file): its figures say nothing
about NVIDIA's real dcgm-exporter.
"""

from __future__ import annotations

import base64
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("GPUFLEET_SIM_DIR", "/tmp/gpufleet-bench-exporter")
os.environ.setdefault("GPUFLEET_SIM_NET", "10.77.7")

from gpufleet import web_auth
from gpufleet.sim import hosts

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
UNITS = {"nvml": "gpufleet-exporter.service", "dcgm": "nvidia-dcgm-exporter.service"}
TARGET_P50_MS = 50.0
TARGET_CORE_PCT = 1.0
INTERVAL_S = 15.0
IDLE_S = 10.0


def cpu_seconds(host, unit: str) -> float:
    """utime + stime of the unit's main process, in seconds."""
    script = (f"pid=$(systemctl show -p MainPID --value {unit}); "
              "cut -d' ' -f14,15 /proc/$pid/stat; getconf CLK_TCK")
    out = hosts.run_on(host, ["sh", "-c", script], timeout=30).stdout.split()
    return (int(out[0]) + int(out[1])) / int(out[2])


def measure(host, kind: str, scrapes: int) -> dict[str, float]:
    # the exporters ask for basic auth (gpufleet.web_auth): the exporters account, as Prometheus scrapes
    token = base64.b64encode(f"{web_auth.USER}:{web_auth.password('exporters')}".encode()).decode()
    url = urllib.request.Request(f"http://{host.address}:9400/metrics", headers={"Authorization": f"Basic {token}"})
    deadline = time.monotonic() + 60
    while True:  # the exporter was (re)started by the deploy: wait until it answers
        try:
            body = urllib.request.urlopen(url, timeout=5).read().decode()
            if body.count("DCGM_FI_DEV_GPU_TEMP{") == 8:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{kind}: the exporter on {host.name} did not answer with 8 GPUs")
        time.sleep(0.2)
    for _ in range(5):  # warm up
        urllib.request.urlopen(url, timeout=5).read()
    before = cpu_seconds(host, UNITS[kind])
    latencies = []
    for _ in range(scrapes):
        start = time.perf_counter()
        urllib.request.urlopen(url, timeout=10).read()
        latencies.append((time.perf_counter() - start) * 1000)
    after = cpu_seconds(host, UNITS[kind])
    cpu_per_scrape = (after - before) / scrapes
    time.sleep(IDLE_S)  # measuring idle CPU: nothing to wait on, the window is the measurement
    idle_share = (cpu_seconds(host, UNITS[kind]) - after) / IDLE_S
    latencies.sort()
    return {"p50_ms": statistics.median(latencies), "p95_ms": latencies[int(0.95 * (len(latencies) - 1))],
            "cpu_ms_per_scrape": cpu_per_scrape * 1000, "idle_core_pct": 100 * idle_share,
            "core_pct_at_15s": 100 * (cpu_per_scrape / INTERVAL_S + idle_share)}


def main(argv: list[str]) -> int:
    scrapes = int(argv[0]) if argv else 200
    inventory = Path(tempfile.mkdtemp(prefix="gf-bench-exporter-")) / "inventory.py"
    fleet = hosts.up(1, ["h100-sxm-8"], driver="preinstalled", inventory=inventory, force=True,
                     log=lambda *_: None)
    results = {}
    try:
        host = fleet.hosts[0]
        for kind in ("nvml", "dcgm"):
            subprocess.run([str(BIN / "pyinfra"), "-y", "--data", f"gpufleet_exporters_gpu={kind}", str(inventory),
                            "deploys/gpu_node.py"], cwd=REPO, check=True, capture_output=True, timeout=900)
            results[kind] = measure(host, kind, scrapes)
    finally:
        hosts.down(log=lambda *_: None)
    print(f"{scrapes} scrapes of an 8-GPU simulated host (h100-sxm-8), from the control machine")
    print(f"{'exporter':<10} {'p50 ms':>8} {'p95 ms':>8} {'CPU ms/scrape':>14} {'% core idle':>12} "
          f"{'% core @15s':>12}")
    for kind, r in results.items():
        print(f"{kind:<10} {r['p50_ms']:>8.1f} {r['p95_ms']:>8.1f} {r['cpu_ms_per_scrape']:>14.2f} "
              f"{r['idle_core_pct']:>12.3f} {r['core_pct_at_15s']:>12.3f}")
    nvml = results["nvml"]
    ok = nvml["p50_ms"] < TARGET_P50_MS and nvml["core_pct_at_15s"] < TARGET_CORE_PCT
    print(f"gpufleet exporter targets (p50 < {TARGET_P50_MS:g} ms, < {TARGET_CORE_PCT:g} % of a core at 15 s): "
          + ("met" if ok else "NOT met"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
