"""`make demo`'s monitoring part: wait for every scrape target, inject a fault, show the alert Alertmanager receives,
clear the fault, show it resolve. Every wait is bounded; exit 1 when one runs out.

    python scripts/demo_alert.py MONITORING_HOST_ADDRESS GPU_HOST GPU
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.request

from gpufleet import web_auth

ALERT = "GpuOverheating"


def get(url: str, account: str):
    """GET with the account's basic auth (Prometheus and Alertmanager ask for it: gpufleet.web_auth)."""
    token = base64.b64encode(f"{web_auth.USER}:{web_auth.password(account)}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def wait(what: str, predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.5)
    sys.exit(f"gave up after {timeout:.0f} s waiting for {what}")


def main(address: str, host: str, gpu: str) -> int:
    prometheus, alertmanager = f"http://{address}:9090", f"http://{address}:9093"
    targets = wait("every scrape target up",
                   lambda: (t := get(f"{prometheus}/api/v1/targets", "prometheus")["data"]["activeTargets"])
                   and all(x["health"] == "up" for x in t) and t, 120)
    print(f"Prometheus scrapes {len(targets)} targets, all up: "
          + ", ".join(sorted(f"{t['labels'].get('host', 'self')}/{t['labels']['job']}" for t in targets)))
    gpufleet = os.path.join(os.path.dirname(sys.executable), "gpufleet")

    def firing():
        return [a for a in get(f"{alertmanager}/api/v2/alerts?active=true", "alertmanager")
                if a["labels"].get("alertname") == ALERT and a["labels"].get("host") == host]

    subprocess.run([gpufleet, "sim", "fault", host, "overheat", "--gpu", gpu], check=True)
    started = time.monotonic()
    try:
        alert = wait(f"{ALERT} in Alertmanager", firing, 120)[0]
        print(f"Alertmanager has {ALERT} {time.monotonic() - started:.1f} s after the fault: "
              f"[{alert['labels']['severity']}] {alert['annotations']['summary']}")
        print(f"  runbook: {alert['annotations']['runbook']}")
    finally:
        subprocess.run([gpufleet, "sim", "fault", host, "clear"], check=True)
    cleared = time.monotonic()
    wait(f"{ALERT} resolved", lambda: not firing(), 120)
    print(f"{ALERT} resolved {time.monotonic() - cleared:.1f} s after the fault was cleared")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
