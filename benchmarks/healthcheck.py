"""gpufleet-healthcheck's own time on an 8-GPU simulated host (HGX H100): Slurm kills a HealthCheckProgram after
60 s (slurm.conf.5); the target is under 2 s.

    .venv/bin/python benchmarks/healthcheck.py [RUNS]      (default 10; needs root, like `gpufleet sim`)

Brings up one simulated ``h100-sxm-8`` host with the driver preinstalled, converges its ``slurm`` stage (which
installs the check), and runs ``gpufleet-healthcheck --dry`` RUNS times on the host, timing each run there (Python's
start, the bundle's imports, the NVML probe of 8 GPUs, the kernel log, verify's checks). The host has no Slurm: the
check ends at ``sinfo`` (not installed), which a real node answers from slurmctld in milliseconds. The simulated
NVML reads a state file where the real one asks the driver: on real GPUs NVML's own time differs (not measured: no
GPU here).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("GPUFLEET_SIM_DIR", "/tmp/gpufleet-bench-healthcheck")
os.environ.setdefault("GPUFLEET_SIM_NET", "10.77.31")

from gpufleet.sim import hosts

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TARGET_S = 2.0
TIMED = 's=$(date +%s%N); gpufleet-healthcheck --dry >/dev/null 2>/tmp/hc.err; e=$(date +%s%N); ' \
        'echo $(( (e - s) / 1000000 )); cat /tmp/hc.err'


def main(argv: list[str]) -> int:
    runs = int(argv[0]) if argv else 10
    inventory = Path(tempfile.mkdtemp(prefix="gf-bench-healthcheck-")) / "inventory.py"
    fleet = hosts.up(1, ["h100-sxm-8"], driver="preinstalled", inventory=inventory, force=True,
                     log=lambda *_: None)
    times = []
    try:
        host = fleet.hosts[0]
        slurm_only = inventory.with_name("slurm.py")
        slurm_only.write_text("from gpufleet.sim.inventory import sim_groups\n\ngpu_nodes = [(name, dict(data, "
                              "gpufleet_stages=['slurm'])) for name, data in sim_groups({})['gpu_nodes']]\n")
        subprocess.run([str(BIN / "pyinfra"), "-y", str(slurm_only), "deploys/gpu_node.py"], cwd=REPO, check=True,
                       capture_output=True, timeout=900)
        for _ in range(runs):
            out = hosts.run_on(host, ["sh", "-c", TIMED], timeout=120).stdout.splitlines()
            if "cannot check" in "\n".join(out[1:]):  # the probe or the plan failed: no check was timed
                raise SystemExit("gpufleet-healthcheck could not check the host: " + " ".join(out[1:]))
            times.append(int(out[0]) / 1000)
    finally:
        hosts.down(log=lambda *_: None)
    times.sort()
    print(f"gpufleet-healthcheck --dry on an 8-GPU simulated host (h100-sxm-8), {runs} runs: "
          f"p50 {statistics.median(times):.2f} s, max {times[-1]:.2f} s (target < {TARGET_S:g} s: "
          + ("met)" if times[-1] < TARGET_S else "NOT met)"))
    return 0 if times[-1] < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
