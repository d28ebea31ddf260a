"""gpufleet-healthcheck as Slurm's HealthCheckProgram on a real Slurm (Debian 12's slurmctld/slurmd 22.05, the
recipe of /work/shared/reference/slurm-on-sim.md) on the simulated fleet: node01 runs slurmctld, node02 (8 x H100)
and node03 (1 x RTX 4090) run slurmd. The slurm stage installs the check; slurm.conf holds the lines the stage
prints (as an admin adds them), with a short HealthCheckInterval so that the module stays fast. Judged by Slurm's
own state and reason (``sinfo``) and by the stage's report. One module fleet, shared by its tests, in this order.
"""

from __future__ import annotations

import time

import pytest
from conftest import bring_up, grand_total, ssh
from slurm_sim import SLURM_CONF_COMMON, install_cluster, wait_for
from test_verify_slurm import deploy, scontrol_node, sinfo

from gpufleet.operations.slurm import slurm_conf_lines
from gpufleet.sim import faults, hosts

INTERVAL = 5  # seconds: gpufleet_health_interval and slurm.conf's HealthCheckInterval
COMPUTE = ("node02", "node03")
GPUS = {"node02": 8, "node03": 1}
HEALTH_LINES = slurm_conf_lines(INTERVAL, ["ANY"])
SLURM_CONF = SLURM_CONF_COMMON + "\n".join(HEALTH_LINES) + """
GresTypes=gpu
NodeName=node02 CPUs=1 RealMemory=256 Gres=gpu:h100_80gb_hbm3:8 State=UNKNOWN
NodeName=node03 CPUs=1 RealMemory=256 Gres=gpu:geforce_rtx_4090:1 State=UNKNOWN
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
INVENTORY = f"""from gpufleet.sim.inventory import sim_groups

gpu_nodes = [(name, dict(data, gpufleet_stages=["slurm"], gpufleet_health_interval={INTERVAL}))
             for name, data in sim_groups({{}})["gpu_nodes"] if name != "node01"]
"""
PREFIX = "gpufleet health: "
# the longest a change may take to show in Slurm: one interval, one check, slurmctld's own cycle and this machine's
# load (2 cores shared by many test runs)
WITHIN_S = INTERVAL + 15


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = bring_up(tmp_path_factory, ["rtx4090-1", "h100-sxm-8", "rtx4090-1"], driver="preinstalled")
    install_cluster(fleet, SLURM_CONF, GPUS)
    inventory = tmp_path_factory.mktemp("health") / "inventory.py"
    inventory.write_text(INVENTORY)
    wait_for("slurmd on node02, node03 to register", lambda: all(n in sinfo(fleet) for n in COMPUTE))
    fleet.runs = [deploy(inventory), deploy(inventory)]
    # slurmd restarted with gres.conf: Slurm's own drain (GRES count) is an admin's business, not the check's
    wait_for("node02, node03 to register their GPUs", lambda: all(
        scontrol_node(fleet, n).get("Gres", "").startswith("gpu:") and "INVAL" not in scontrol_node(fleet, n)["State"]
        for n in COMPUTE), timeout=60)
    ssh(fleet, "node01", "scontrol update nodename=node0[2-3] state=resume", check=False)
    wait_for("node02, node03 to be idle", lambda: all(sinfo(fleet)[n][0] == "idle" for n in COMPUTE), timeout=60)
    yield fleet
    hosts.down(log=lambda *_: None)


def wait_state(fleet, node: str, want, what: str, timeout: float = WITHIN_S) -> float:
    """Seconds until ``want(state, reason)`` holds for ``node``."""
    start = time.monotonic()
    wait_for(f"{node} {what} (last: {sinfo(fleet).get(node)})", lambda: want(*sinfo(fleet)[node]), timeout=timeout,
             every=0.5)
    return time.monotonic() - start


def steady(fleet, node: str, seconds: float) -> set[tuple[str, str]]:
    """Every (state, reason) of ``node`` seen over ``seconds`` (several health checks)."""
    seen = set()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        seen.add(sinfo(fleet)[node])
        time.sleep(1)
    return seen


def test_the_stage_installs_the_check_prints_the_slurm_conf_lines_and_a_second_run_changes_nothing(fleet):
    first, second = fleet.runs
    assert first.returncode == 0, first.stdout
    assert second.returncode == 0, second.stdout
    total = grand_total(second.stdout)
    assert (total["success"], total["error"]) == ("-", "-"), second.stdout  # idempotent
    assert "; ".join(HEALTH_LINES) in first.stdout, first.stdout
    by_hand = ssh(fleet, "node02", "gpufleet-healthcheck --dry", check=False)
    assert by_hand.returncode == 0, by_hand.stdout + by_hand.stderr
    assert "node02: healthy; Slurm: idle; would run" not in by_hand.stdout
    assert by_hand.stdout.startswith("node02: healthy; Slurm: idle; nothing to change;"), by_hand.stdout
    seconds = float(by_hand.stdout.rsplit(";", 1)[1].split()[0])
    print(f"\ngpufleet-healthcheck on an 8-GPU simulated host (by hand, --dry): {seconds:.2f} s")


def test_an_xid_79_drains_the_node_naming_gpu_and_xid_and_it_returns_when_well(fleet):
    faults.inject(fleet, "node02", "xid", gpu=3, code=79)
    took = wait_state(fleet, "node02", lambda s, r: s.startswith("drain") and r.startswith(PREFIX), "drained by it")
    state, reason = sinfo(fleet)["node02"]
    assert reason.startswith(PREFIX + "health.xid: GPU 3 GPU-") and "Xid 79" in reason, reason
    assert "reboot the node" in reason, reason  # NVIDIA's recovery action for Xid 79 (RESTART_BM)
    print(f"\nXid 79 -> {state} in {took:.1f} s (HealthCheckInterval={INTERVAL})")
    faults.inject(fleet, "node02", "clear")  # the recovery the action names: the fault and this boot's log gone
    took = wait_state(fleet, "node02", lambda s, r: s == "idle" and not r, "back to idle")
    print(f"cleared -> idle in {took:.1f} s")


def test_an_admins_drain_stays_with_the_admins_reason_through_a_fault(fleet):
    admin = "admin: fan replaced, ticket 7"
    ssh(fleet, "node01", f"scontrol update nodename=node03 state=drain reason='{admin}'")
    try:
        faults.inject(fleet, "node03", "xid", gpu=0, code=79)
        assert steady(fleet, "node03", 2 * INTERVAL + 2) == {("drained", admin)}
        faults.inject(fleet, "node03", "clear")
        assert steady(fleet, "node03", 2 * INTERVAL + 2) == {("drained", admin)}
    finally:
        faults.inject(fleet, "node03", "clear")
        ssh(fleet, "node01", "scontrol update nodename=node03 state=resume", check=False)


def test_a_node_whose_probe_cannot_run_is_reported_and_not_resumed(fleet):
    faults.inject(fleet, "node02", "xid", gpu=5, code=79)
    wait_state(fleet, "node02", lambda s, r: s == "drained" and r.startswith(PREFIX), "drained by it")
    reason = sinfo(fleet)["node02"][1]
    try:
        faults.inject(fleet, "node02", "driver-unloaded")  # NVML cannot start: nothing can be judged
        assert steady(fleet, "node02", 2 * INTERVAL + 2) == {("drained", reason)}
        by_hand = ssh(fleet, "node02", "gpufleet-healthcheck", check=False)
        assert by_hand.returncode == 2, by_hand.stdout + by_hand.stderr
        assert "node02: cannot check: host.probe: " in by_hand.stderr and "left as it is" in by_hand.stderr
        assert sinfo(fleet)["node02"] == ("drained", reason)
    finally:
        faults.inject(fleet, "node02", "clear")
    wait_state(fleet, "node02", lambda s, r: s == "idle" and not r, "back to idle")
