"""A synthetic fleet of N hosts built through the real result model (evaluate_host / build_fleet_result) from the
recorded probe documents: mostly healthy 8x H100 nodes, some L40S nodes, A100 nodes with a MIG layout, every 50th
host with the recorded faults (lost GPU, overheating, slow GPU, wrong power limit) and a few unreachable hosts."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from gpufleet.verify import ExpectedState, FleetResult, build_fleet_result, evaluate_host, unreachable_host

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verify"


def _load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def synthetic_fleet(n: int, *, failing_every: int = 50, unreachable_every: int = 500) -> FleetResult:
    h100 = ExpectedState(driver_branch="570", power_limit_w_all=700.0, gpu_count=8, gpu_model="h100-sxm")
    docs = {"ok": _load("probe-h100-sxm-8.json"), "faults": _load("probe-h100-sxm-8-faults.json"),
            "l40s": _load("probe-l40s-4.json"), "mig": _load("probe-a100-40gb-1-mig.json")}
    hosts = []
    for i in range(n):
        name = f"gpu-{i:04d}.rack{i // 40:02d}.example.net"
        if unreachable_every and i % unreachable_every == unreachable_every - 1:
            hosts.append(unreachable_host(name, "Could not connect (timed out)"))
        elif failing_every and i % failing_every == failing_every - 1:
            hosts.append(evaluate_host(name, copy.deepcopy(docs["faults"]), h100))
        elif i % 10 == 3:
            hosts.append(evaluate_host(name, copy.deepcopy(docs["l40s"]), ExpectedState(gpu_count=4)))
        elif i % 10 == 7:
            hosts.append(evaluate_host(name, copy.deepcopy(docs["mig"])))
        else:
            hosts.append(evaluate_host(name, copy.deepcopy(docs["ok"]), h100))
    fleet = build_fleet_result(hosts, bench_profile="quick")
    fleet.generated_at = "2026-05-01T12:05:00.000Z"
    return fleet
