"""Rollout overhead on the simulated fleet.

    .venv/bin/python benchmarks/rollout.py [--hosts 32] [--runs 1] [--fake-hosts 1000]

On N simulated RTX 4090 workstations (``--driver preinstalled``), the same deploy (deploys/gpu_node.py, stages
driver/power/nccl) applies a new power limit each time, so every run has the same one change to make on every host:

* plain: ``pyinfra -y INVENTORY deploys/gpu_node.py`` (one run over every host);
* rollout, one wave: ``gpufleet rollout --canary 0 --waves 100% --verify none --drain none`` (the controller's
  own cost: the state file, the reports; the wave's own run is the whole-fleet validation);
* rollout, canary + waves: ``--canary 1 --waves 25%`` (pyinfra in the rollout's process: the whole-fleet pass, then
  five waves, each planned again and executed over the connections the pass made);
* the same, 2 workers: ``--jobs 2`` (the whole-fleet pass and each wave spread over 2 pyinfra worker processes,
  :mod:`gpufleet.rollout.workers`); the multi-worker line compares it with the one-process run above;
* the same, subprocess: ``GPUFLEET_ROLLOUT_INPROCESS=off`` (the fallback: ``pyinfra debug-inventory``, the
  whole-fleet ``--dry`` pass, then a ``pyinfra`` process per wave, each connecting to its hosts), for comparison.

Each rollout's breakdown (its whole-fleet pass, each wave's converge) is printed from its own progress and report.

At scale (``--fake-hosts N``, 0: none): the same canary + 25 % waves rollout over N ``@fake`` hosts (answering as
the hosts benchmarks/scale.py recorded, every host's power limit changed so that every wave runs), ``--jobs 1`` and
``--jobs 2``: the multi-worker line where the controller's CPU, not 32 simulated hosts, is the cost.

Verify and drain waits are excluded (``--verify none --drain none``). Wall time and controller CPU (user + system of
the command and its children: pyinfra runs on the controller) per host are measured; the time for 1000 hosts is
projected from the measured per-host costs (CPU on this machine's cores as a lower bound, wall time scaled linearly
as an upper bound), stated as a projection.
Needs root (systemd-nspawn).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("GPUFLEET_SIM_DIR", "/tmp/gpufleet-bench-rollout-sim")
os.environ.setdefault("GPUFLEET_SIM_NET", "10.77.27")

from gpufleet.sim import hosts  # noqa: E402
from gpufleet.sim.gpu import state as gpu_state  # noqa: E402

BIN = Path(sys.executable).parent
INVENTORY = """from gpufleet.sim.inventory import sim_groups

gpu_nodes = [(name, dict(data, gpufleet_power_limit={watts}, gpufleet_stages=["driver", "power", "nccl"]))
             for name, data in sim_groups({{}})["gpu_nodes"]]
"""


def timed(argv: list[str], env: dict | None = None) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall s, CPU s of the command and its children, result)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=3600, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc


def breakdown(out: Path, progress: str) -> str:
    """Where a rollout's time went: its preflight pass and each wave's converge (from its own report/progress)."""
    passes = [ln.strip() for ln in progress.splitlines() if ln.startswith("preflight")]
    data = json.loads((out / "rollout.json").read_text())
    waves = ", ".join(f"{w['kind']} {len(w['hosts'])}: {w['phases'].get('converge', 0):.1f} s" for w in data["waves"])
    return f"{'; '.join(passes)}; converge {waves}"


def power_limits(fleet) -> set[float]:
    return {int(gpu_state.read_state(str(h.dir / "hw/gpus.state"))["gpu.0.power.limit_mw"]) / 1000
            for h in fleet.hosts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--runs", type=int, default=1, help="runs of each kind (median reported)")
    parser.add_argument("--fake-hosts", type=int, default=1000, help="@fake hosts of the rollout at scale (0: none)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (systemd-nspawn)")
        return 2
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-rollout-"))
    t0 = time.perf_counter()
    fleet = hosts.up(args.hosts, ["rtx4090-1"], driver="preinstalled", inventory=work / "sim.py", force=True,
                     log=lambda *_: None)
    print(f"{args.hosts} simulated hosts up in {time.perf_counter() - t0:.1f} s; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} (the machine may be shared: runs are interleaved)")
    results: dict[str, list[tuple[float, float]]] = {"plain": [], "rollout-1-wave": [], "rollout-canary-waves": [],
                                                     "rollout-canary-waves-jobs2": [],
                                                     "rollout-canary-waves-subprocess": []}
    watts = 300
    try:
        # first converge (persistence/nccl files etc.) so that every measured run changes only the power limit
        inv = work / "inventory-warm.py"
        inv.write_text(INVENTORY.format(watts=watts))
        wall, _, proc = timed([str(BIN / "pyinfra"), "-y", str(inv), "deploys/gpu_node.py"])
        assert proc.returncode == 0, proc.stderr[-2000:]
        print(f"warm-up converge: {wall:.1f} s")
        for run in range(args.runs):
            for kind in results:
                watts += 5
                inv = work / f"inventory-{kind}-{run}.py"
                inv.write_text(INVENTORY.format(watts=watts))
                if kind == "plain":
                    argv = [str(BIN / "pyinfra"), "-y", str(inv), "deploys/gpu_node.py"]
                else:
                    shape = ["--canary", "0", "--waves", "100%"] if kind == "rollout-1-wave" else \
                        ["--canary", "1", "--waves", "25%"]
                    argv = [str(BIN / "gpufleet"), "rollout", "-y", str(inv), "deploys/gpu_node.py", *shape, "--verify",
                            "none", "--drain", "none", "--out", str(work / f"out-{kind}-{run}"),
                            *(["--jobs", "2"] if kind.endswith("-jobs2") else [])]
                env = dict(os.environ, GPUFLEET_ROLLOUT_INPROCESS="off") if kind.endswith("-subprocess") else None
                wall, cpu, proc = timed(argv, env)
                assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
                assert power_limits(fleet) == {watts}, power_limits(fleet)  # the change really landed everywhere
                results[kind].append((wall, cpu))
                print(f"{kind:22s} run {run + 1}: {wall:6.1f} s wall, {cpu:6.1f} s CPU "
                      f"({cpu / args.hosts * 1000:.0f} ms CPU/host)")
                if kind != "plain":
                    print("    " + breakdown(work / f"out-{kind}-{run}", proc.stderr))
    finally:
        hosts.down(log=lambda *_: None)
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in results.items()}
    plain_wall = med["plain"][0]
    cores = os.cpu_count() or 1
    summary = {"hosts": args.hosts, "cores": cores, "runs": args.runs,
               "wall_s": {k: round(v[0], 2) for k, v in med.items()},
               "cpu_s": {k: round(v[1], 2) for k, v in med.items()},
               "overhead_x": {k: round(v[0] / plain_wall, 2) for k, v in med.items()},
               "cpu_ms_per_host": {k: round(v[1] / args.hosts * 1000) for k, v in med.items()}}
    projected = {k: round(v[1] / args.hosts * 1000 / cores / 60, 1) for k, v in med.items()}
    linear = {k: round(v[0] / args.hosts * 1000 / 60, 1) for k, v in med.items()}
    summary["projected_1000_hosts_min_cpu_bound"] = projected
    summary["projected_1000_hosts_min_linear_wall"] = linear
    one, two = med["rollout-canary-waves"], med["rollout-canary-waves-jobs2"]
    summary["jobs2_speedup_x"] = round(one[0] / two[0], 2)
    print(json.dumps(summary, indent=1))
    print(f"overhead over plain pyinfra: one wave {summary['overhead_x']['rollout-1-wave']}x, canary + 25% waves "
          f"{summary['overhead_x']['rollout-canary-waves']}x (target <= 1.3x); the same with pyinfra subprocesses "
          f"(the fallback) {summary['overhead_x']['rollout-canary-waves-subprocess']}x")
    print(f"multi-worker: canary + 25% waves with --jobs 2 {two[0]:.1f} s wall, {two[1]:.1f} s CPU vs --jobs 1 "
          f"{one[0]:.1f} s wall, {one[1]:.1f} s CPU: {one[0] / two[0]:.2f}x faster (wall), {two[1] / one[1]:.2f}x "
          f"the CPU, on {cores} core(s) (a shared machine's figures are noisy; the simulated hosts run here too)")
    print(f"PROJECTION (not measured) for 1000 hosts, from the measured per-host cost: controller CPU on {cores} "
          f"core(s) (a lower bound): plain {projected['plain']} min, rollout one wave {projected['rollout-1-wave']} "
          f"min, canary + 25% waves {projected['rollout-canary-waves']} min; wall time scaled linearly (an upper "
          f"bound while pyinfra's parallelism holds): plain {linear['plain']} min, one wave "
          f"{linear['rollout-1-wave']} min, canary + 25% waves {linear['rollout-canary-waves']} min")
    if args.fake_hosts:
        at_scale(args.fake_hosts, args.runs, work)
    return 0


def at_scale(count: int, runs: int, work: Path) -> None:
    """The multi-worker line at scale: the canary + waves rollout over ``count`` @fake hosts, --jobs 1 and 2."""
    import scale  # benchmarks/scale.py: the recorded hosts and the fleet-command runner

    if scale.stale(scale.RECORDING):
        scale.record(scale.RECORDING)
    recorded = json.loads(scale.RECORDING.read_text())["hosts"]
    env = {"GPUFLEET_CACHE_DIR": str(work / "fake-cache")}
    found = scale.measure_jobs("rollout", work, [count], 2, runs, env, recorded)
    scale.report_jobs("rollout", found, 2)


if __name__ == "__main__":
    sys.exit(main())
