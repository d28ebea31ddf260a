"""Converge figures on 4 simulated hosts (bare servers, no driver):

    .venv/bin/python benchmarks/converge.py            (needs root)

Prints the wall time of the first `pyinfra inventories/sim.py deploys/gpu_node.py -y` run, of the no-op
second run, and of a pyinfra run reading one trivial fact on the same hosts (the floor: starting pyinfra,
connecting and one command); the ratio no-op/floor (target <= 1.5) and the controller's CPU seconds per host for
the no-op run, measured as the pyinfra process's user+system time: in all, and beyond the floor run's (what the
converge adds to starting pyinfra and connecting; target <= 0.1 s per host). The no-op and floor runs are repeated
(``RUNS``, interleaved) and their medians reported, so that one hiccup of a shared machine does not decide.

The pyinfra processes run with bytecode caching on (``PYTHONDONTWRITEBYTECODE`` removed), as an installed package
runs, and with a fresh gpufleet cache directory (``GPUFLEET_CACHE_DIR``): the first run remembers which facts each
host's run reads, the no-op runs read them ahead (gpufleet/_pyinfra/_memo.py).

The simulated hosts run on this machine: their commands compete with the controller for its CPUs. The
"machine CPU" line says how busy the whole machine was during the median no-op run (all processes, from
/proc/stat): near 100% the run was bound by CPU, and other work on the machine shows there too. The same pair is
also measured on the first host alone (``--limit``): there the host's reads do not wait for three other hosts'
reads on the same two CPUs, as real hosts' reads, which run on their own CPUs, do not. The target is judged on
all hosts; the one-host figure says how much of the rest is this machine's CPUs.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GPUFLEET_SIM_DIR", "/tmp/gpufleet-bench-sim")
os.environ.setdefault("GPUFLEET_SIM_NET", "10.77.8")

from gpufleet.sim import hosts

REPO = Path(__file__).resolve().parents[1]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
PROFILES = ["h100-sxm-8", "a100-40gb-1", "rtx4090-1", "h100-sxm-8"]
RUNS = 3
RATIO_TARGET = 1.5
CPU_TARGET_S = 0.1  # per host, beyond the floor run's
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def machine_busy() -> float:
    """CPU seconds all processes of this machine have used since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def timed(*args: str) -> tuple[float, float, str]:
    """(wall seconds, child CPU seconds, output) of one pyinfra run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    result = subprocess.run([PYINFRA, "-y", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=ENV)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"pyinfra {' '.join(args)} failed:\n{result.stdout[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, result.stdout


def noop_run(inventory: str, deploy: str, *options: str) -> tuple[float, float, float]:
    """(wall, controller CPU, machine CPU) of a run that must change nothing."""
    busy = machine_busy()
    wall, cpu, out = timed(inventory, deploy, *options)
    machine = machine_busy() - busy
    if "Grand total" not in out or out.split("Grand total")[1].split()[1] != "-":
        raise SystemExit(f"the second run changed something:\n{out[-2000:]}")
    return wall, cpu, machine


def main() -> int:
    ENV["GPUFLEET_CACHE_DIR"] = tempfile.mkdtemp(prefix="gpufleet-bench-cache-")
    fleet = hosts.up(len(PROFILES), PROFILES, force=True, log=lambda *_: None)
    try:
        inventory, deploy = "inventories/sim.py", "deploys/gpu_node.py"
        first, _, _ = timed(inventory, deploy)
        noops, floors, alone = [], [], []
        one = ("--limit", fleet.hosts[0].name)
        for _ in range(RUNS):
            noops.append(noop_run(inventory, deploy))
            floors.append(timed(inventory, "fact", "server.Hostname")[:2])
            alone.append((noop_run(inventory, deploy, *one)[0], timed(inventory, "fact", "server.Hostname", *one)[0]))
    finally:
        hosts.down(log=lambda *_: None)
    count = len(fleet.hosts)
    noop, noop_cpu, busy = sorted(noops)[len(noops) // 2]  # the median run
    floor, floor_cpu = sorted(floors)[len(floors) // 2]
    ratio = noop / floor
    cpu_per_host = noop_cpu / count
    beyond_floor = (noop_cpu - floor_cpu) / count
    print(f"hosts: {count} ({', '.join(PROFILES)})")
    print(f"first run (bare servers -> converged): {first:6.2f} s")
    print(f"second run (no change):                {noop:6.2f} s  (median; runs: "
          f"{', '.join(f'{wall:.2f}' for wall, _, _ in noops)})")
    print(f"floor (one trivial fact):              {floor:6.2f} s  (median; runs: "
          f"{', '.join(f'{wall:.2f}' for wall, _ in floors)})")
    print(f"no-op / floor:                         {ratio:6.2f}   (target <= {RATIO_TARGET}; per run: "
          f"{', '.join(f'{n[0] / f[0]:.2f}' for n, f in zip(noops, floors, strict=True))})")
    alone_noop, alone_floor = (sorted(column)[len(column) // 2] for column in zip(*alone, strict=True))
    print(f"the same, {fleet.hosts[0].name} alone:            {alone_noop / alone_floor:6.2f}   "
          f"(no-op {alone_noop:.2f} s, floor {alone_floor:.2f} s, medians; per run: "
          f"{', '.join(f'{n / f:.2f}' for n, f in alone)})")
    print(f"controller CPU per host, no-op run:    {beyond_floor:6.2f} s beyond the floor run's (target <= "
          f"{CPU_TARGET_S} s); in all {cpu_per_host:.2f} s (floor run {floor_cpu / count:.2f} s)")
    print(f"machine CPU, median no-op run:         {busy:6.2f} s busy of {noop * (os.cpu_count() or 1):.2f} s "
          f"({os.cpu_count()} CPUs, shared with the simulated hosts)")
    ok = ratio <= RATIO_TARGET and beyond_floor <= CPU_TARGET_S
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
