"""Bring-up time and memory of the simulated fleet, from the cached base image.

    .venv/bin/python benchmarks/sim_bringup.py [COUNTS...]      (default: 1 4 8 16; needs root)

Prints, per fleet size: seconds from `up` to every host accepting SSH with systemd `running`, the PSS of
all processes of each idle host (from its cgroup), and the growth of the machine's used memory per host.
Targets on a 2-core machine: 8 hosts <= 15 s, 16 hosts <= 30 s, <= 40 MB per idle host.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("GPUFLEET_SIM_DIR", "/tmp/gpufleet-bench-sim")
os.environ.setdefault("GPUFLEET_SIM_NET", "10.77.8")

from gpufleet.sim import cgroups, hosts, image, network, repo

TARGET_S = {8: 15.0, 16: 30.0}
TARGET_MB_PER_HOST = 40.0


def used_mb() -> float:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    kb = lambda key: int(info[key].split()[0])  # noqa: E731
    return (kb("MemTotal") - kb("MemAvailable")) / 1024


def pss_mb(cgroup: Path) -> float:
    total_kb = 0
    for procs in cgroup.rglob("cgroup.procs"):
        for pid in procs.read_text().split():
            try:
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            except OSError:
                continue
            total_kb += next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:"))
    return total_kb / 1024


def main(counts: list[int]) -> int:
    image.build()
    repo.build()
    hosts.down(log=lambda *_: None)
    print(f"{'hosts':>5} {'up s':>7} {'target':>7} {'PSS MB/host':>12} {'used MB/host':>13}")
    ok = True
    for count in counts:
        before = used_mb()
        start = time.monotonic()
        fleet = hosts.up(count, ["h100-sxm-8"], log=lambda *_: None)
        elapsed = time.monotonic() - start
        time.sleep(2)  # let the boot settle before measuring idle memory
        tag = network.net_tag(fleet.net)
        pss = [pss_mb(cg) for h in fleet.hosts for cg in cgroups.host_cgroups(tag, h.name)
               if "unified" in str(cg) or cg.parent.parent == Path("/sys/fs/cgroup")]
        per_host_pss = sum(pss) / count
        per_host_used = (used_mb() - before) / count
        hosts.down(log=lambda *_: None)
        target = TARGET_S.get(count)
        ok &= (target is None or elapsed <= target) and per_host_pss <= TARGET_MB_PER_HOST
        print(f"{count:>5} {elapsed:>7.2f} {target or '-':>7} {per_host_pss:>12.1f} {per_host_used:>13.1f}")
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main([int(a) for a in sys.argv[1:]] or [1, 4, 8, 16]))
