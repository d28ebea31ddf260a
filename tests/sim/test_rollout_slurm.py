"""`gpufleet rollout --drain slurm` against a real Slurm (Debian 12's slurmctld/slurmd 22.05 and munge) on the
simulated fleet: node01 runs slurmctld, node02-node04 run slurmd (recipe: /work/shared/reference/slurm-on-sim.md,
without GRES, which drain/resume does not need). The rollout reaches Slurm through ``--drain slurm:ssh ... node01``.
Judged by Slurm's own state (``sinfo``, slurmctld's log): a node drained by an admin is converged but stays drained
with the admin's reason; nodes the rollout drained are resumed; a node failing the gate stays drained with a reason
naming the rollout and the failure; a running job keeps a node draining and the timeout policy applies.

The Slurm packages are fetched once with ``apt-get download`` into /var/cache/gpufleet-test-slurm-debs and
installed into the hosts with dpkg (the hosts have no route to a Debian mirror).
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import signal
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import BIN, REPO, bring_up, gpufleet, ssh
from slurm_sim import SLURM_CONF_COMMON, fetch_debs, stage_setup_files, wait_for

from gpufleet.sim import faults, hosts
from gpufleet.sim.gpu import state as gpu_state

COMPUTE = ("node02", "node03", "node04")
JOB_RELEASE = "/tmp/gpufleet-test-release-job"
SLURM_CONF = SLURM_CONF_COMMON + """NodeName=node0[2-4] CPUs=1 RealMemory=256 State=UNKNOWN
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
INVENTORY = """from gpufleet.sim.inventory import sim_groups

gpu_nodes = [(name, dict(data, gpufleet_power_limit={watts}, gpufleet_stages=["driver", "power", "nccl"]))
             for name, data in sim_groups({{}})["gpu_nodes"] if name != "node01"]
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    debs = fetch_debs()
    fleet = bring_up(tmp_path_factory, ["rtx4090-1"] * 4, driver="preinstalled")
    key = secrets.token_bytes(1024)
    etc_hosts = "".join(f"{h.address} {h.name}\n" for h in fleet.hosts)
    for h in fleet.hosts:
        stage_setup_files(h, debs, key, SLURM_CONF, etc_hosts)
        role = ("systemctl enable --now slurmctld && systemctl disable --now slurmd" if h.name == "node01" else
                "systemctl disable --now slurmctld; systemctl enable slurmd && systemctl restart slurmd")
        ssh(fleet, h.name, "set -e; cd /var/tmp/slurm-setup; DEBIAN_FRONTEND=noninteractive dpkg -i *.deb >/dev/null; "
            "sed -i '/^127.0.1.1/d' /etc/hosts; cat hosts >> /etc/hosts; "
            "install -o munge -g munge -m 0400 munge.key /etc/munge/munge.key; systemctl restart munge; "
            "install -m 0644 slurm.conf cgroup.conf /etc/slurm/; " + role, timeout=180)

    def all_idle() -> bool:
        return sinfo(fleet) and all(sinfo(fleet)[n][0] == "idle" for n in COMPUTE)

    wait_for("slurmd on node02-node04 to be idle in sinfo", all_idle)
    yield fleet
    hosts.down(log=lambda *_: None)


def sinfo(fleet) -> dict[str, tuple[str, str]]:
    """Slurm's own view: {node: (state, reason)}. The state without sinfo's trailing '*' (slurmd missed a ping):
    whether a node answers pings is not what these tests judge, its drain state is."""
    out = ssh(fleet, "node01", "sinfo -h -N -o '%N|%T|%E'", check=False).stdout
    rows = [line.split("|", 2) for line in out.splitlines() if line.count("|") >= 2]
    return {n: (state.rstrip("*"), "" if reason == "none" else reason) for n, state, reason in rows}


def slurm_logs(fleet) -> str:
    """The end of slurmctld's log and each slurmd's: what an assertion on Slurm's state shows when it fails."""
    logs = [ssh(fleet, "node01", "tail -n 40 /var/log/slurm/slurmctld.log", check=False).stdout]
    logs += [ssh(fleet, n, "tail -n 15 /var/log/slurm/slurmd.log", check=False).stdout for n in COMPUTE]
    return "\n".join(logs)


def power_w(fleet, name: str) -> float:
    gpus = gpu_state.read_state(str(fleet.host(name).dir / "hw/gpus.state"))
    return int(gpus["gpu.0.power.limit_mw"]) / 1000


def rollout(fleet, tmp_path: Path, watts: int, *extra: str) -> subprocess.CompletedProcess:
    inventory = tmp_path / "inventory.py"
    inventory.write_text(INVENTORY.format(watts=watts))
    drain = "slurm:" + shlex.join(hosts.ssh_command(fleet.host("node01")))
    return subprocess.run([str(BIN / "gpufleet"), "rollout", "-y", str(inventory), "deploys/gpu_node.py", "--out",
                           str(tmp_path / "out"), "--drain", drain, *extra], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


def test_admin_drained_node_is_changed_but_stays_drained_and_ours_are_resumed(fleet, tmp_path):
    ssh(fleet, "node01", "scontrol update nodename=node04 state=drain reason='admin: bad DIMM, ticket 42'")
    try:
        result = rollout(fleet, tmp_path, 300, "--canary", "1", "--waves", "100%")
        assert result.returncode == 0, result.stdout + result.stderr
        assert [power_w(fleet, n) for n in COMPUTE] == [300, 300, 300]
        state = sinfo(fleet)
        assert state["node02"] == ("idle", "") and state["node03"] == ("idle", ""), (state, slurm_logs(fleet))
        assert state["node04"] == ("drained", "admin: bad DIMM, ticket 42")  # never resumed by the rollout
        rid = json.loads((tmp_path / "out" / "rollout.json").read_text())["rollout_id"]
        log = ssh(fleet, "node01", "cat /var/log/slurm/slurmctld.log").stdout
        for node in ("node02", "node03"):  # Slurm's own record of the drain with the rollout's reason
            assert f"node {node} reason set to: gpufleet rollout {rid}" in log, log[-3000:]
    finally:
        ssh(fleet, "node01", "scontrol update nodename=node04 state=resume")


def test_a_node_failing_the_gate_stays_drained_with_the_reason(fleet, tmp_path):
    gpufleet("sim", "fault", "node03", "overheat")
    try:
        result = rollout(fleet, tmp_path, 310, "--canary", "1", "--waves", "100%", "--max-failures", "0")
    finally:
        gpufleet("sim", "fault", "node03", "clear")
    assert result.returncode == 1, result.stdout + result.stderr
    rid = json.loads((tmp_path / "out" / "rollout.json").read_text())["rollout_id"]
    state = sinfo(fleet)
    assert state["node02"][0] == "idle" and state["node04"][0] == "idle"
    assert state["node03"][0] == "drained"
    assert state["node03"][1].startswith(f"gpufleet rollout {rid}: verify: FAIL (")
    assert "health.temperature" in state["node03"][1]
    assert "STILL DRAINED by this rollout (1): node03" in result.stdout
    ssh(fleet, "node01", "scontrol update nodename=node03 state=resume")


def test_running_job_keeps_the_node_draining_until_the_timeout_policy(fleet, tmp_path):
    ssh(fleet, "node01", "sbatch -w node02 -o /dev/null --wrap 'sleep 600'")
    wait_for("the job to run on node02", lambda: sinfo(fleet)["node02"][0] == "allocated")
    try:
        result = rollout(fleet, tmp_path, 320, "--canary", "1", "--waves", "100%", "--wait-for-jobs", "4",
                         "--on-timeout", "fail", "--verify", "none")
        assert result.returncode == 1, result.stdout + result.stderr
        assert "node02: drain: jobs still running after --wait-for-jobs 4 s" in result.stdout
        assert "waiting for jobs on 1 node(s): node02" in result.stderr
        assert power_w(fleet, "node02") != 320  # not changed under a running job
        state, reason = sinfo(fleet)["node02"]
        # given back to Slurm, the job still running ("allocated*" for a moment after a resume: not responding yet)
        assert (state.rstrip("*"), reason) == ("allocated", "")
        assert "untouched (2): node03, node04" in result.stdout  # the canary failed: nothing else
    finally:
        ssh(fleet, "node01", "scancel -u root")


def test_rollout_waits_for_a_job_to_finish_then_changes_the_node(fleet, tmp_path):
    # the job ends only once the rollout has drained its node (however long the rollout's checks before the drain
    # take on a loaded machine): it waits for a file the test writes when Slurm shows node02 draining
    ssh(fleet, "node01", f"sbatch -w node02 -o /dev/null --wrap 'while [ ! -e {JOB_RELEASE} ]; do sleep 0.2; done'")
    wait_for("the job to run on node02", lambda: sinfo(fleet)["node02"][0] == "allocated")

    rollout_ended = threading.Event()

    def release_the_job_once_draining() -> None:
        wait_for("node02 to be draining",
                 lambda: rollout_ended.is_set() or sinfo(fleet)["node02"][0] == "draining", timeout=300)
        ssh(fleet, "node02", f"touch {JOB_RELEASE}")

    with ThreadPoolExecutor(1) as pool:
        released = pool.submit(release_the_job_once_draining)
        try:
            result = rollout(fleet, tmp_path, 330, "--canary", "1", "--waves", "100%", "--wait-for-jobs", "300",
                             "--verify", "none")
        finally:
            rollout_ended.set()  # never leave the job (and the thread) waiting
        released.result(timeout=300)
    ssh(fleet, "node02", f"rm -f {JOB_RELEASE}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "waiting for jobs on 1 node(s): node02" in result.stderr  # it was draining, not drained, at first
    assert [power_w(fleet, n) for n in COMPUTE] == [330, 330, 330]
    states = sinfo(fleet)
    assert all(states[n][0] == "idle" for n in COMPUTE), (states, slurm_logs(fleet))
    assert ssh(fleet, "node01", "squeue -h -w node02").stdout.strip() == ""  # the job ran to its end


# ------------------------------------------------------------------------- interruption from a terminal (issue 20)
# A terminal sends SIGINT to the whole foreground process group: the rollout and its ssh/sinfo/scontrol children at
# once. Each timing runs a rollout in its own process group (start_new_session), waits for an event (a gate that
# stops a Slurm command on the controller, Slurm's own state, or the state file), signals the group, then judges by
# the exit status, the state file, Slurm and the GPUs, and finishes the rollout with --resume. Waves: the canary
# node02, then node03, then node04; --max-failures 5, so a child's death wrongly taken for a node's failure would
# let the rollout go on (as it did).


def _state(out: Path) -> dict:
    try:
        return json.loads((out / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def _node_state(out: Path, node: str) -> str | None:
    return (_state(out).get("nodes") or {}).get(node, {}).get("state")


TIMINGS = [
    # (name, signal, moment): a gate (host, program, match) that stops a command until the signal is sent, the
    # state file showing a node in a state ("state", node, state), or Slurm showing the rollout's drain ("slurm", node)
    ("drain status query of the canary (sinfo)", signal.SIGINT, ("node01", "sinfo", "-n node02")),
    ("converge of the canary (power limit)", signal.SIGINT, ("node02", "nvidia-smi", "-pl")),
    ("right after the canary", signal.SIGINT, ("state", "node02", "done")),
    ("drain status query of wave 2 (sinfo)", signal.SIGINT, ("node01", "sinfo", "-n node03")),
    ("drain of wave 2 applied by Slurm", signal.SIGINT, ("slurm", "node03")),
    ("converge of wave 2 (power limit)", signal.SIGTERM, ("node03", "nvidia-smi", "-pl")),
    ("verify gate of wave 2 (probe)", signal.SIGINT, ("node03", "python3", "probe")),
    ("resume of wave 2 (scontrol)", signal.SIGINT, ("node01", "scontrol", "nodename=node03 state=resume")),
    ("drain command of wave 3 (scontrol)", signal.SIGHUP, ("node01", "scontrol", "nodename=node04 state=drain")),
]


@pytest.mark.parametrize("name, signum, moment", TIMINGS, ids=[t[0] for t in TIMINGS])
def test_a_terminal_signal_to_the_process_group_stops_the_rollout_and_resume_finishes_it(
        fleet, tmp_path, name, signum, moment):
    watts = 250 + 5 * TIMINGS.index((name, signum, moment))
    inventory, out = tmp_path / "inventory.py", tmp_path / "out"
    inventory.write_text(INVENTORY.format(watts=watts))
    drain = "slurm:" + shlex.join(hosts.ssh_command(fleet.host("node01")))
    gate = moment if moment[0] not in ("state", "slurm") else None
    argv = [str(BIN / "gpufleet"), "rollout", "-y", str(inventory), "deploys/gpu_node.py", "--out", str(out), "--drain",
            drain, "--canary", "1", "--waves", "1", "--max-failures", "5",
            "--verify", "quick" if gate and gate[1] == "python3" else "none"]
    before = {n: power_w(fleet, n) for n in COMPUTE}
    gated = fleet.host(gate[0]) if gate else None
    if gate:
        faults.close_gate(gated, gate[1], gate[2])
    run = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        if gate:
            reached = lambda: faults.gate_reached(gated, gate[1])  # noqa: E731
        elif moment[0] == "slurm":
            reached = lambda: sinfo(fleet).get(moment[1], ("", ""))[1].startswith("gpufleet rollout")  # noqa: E731
        else:
            reached = lambda: _node_state(out, moment[1]) == moment[2]  # noqa: E731
        wait_for(name, lambda: reached() or run.poll() is not None, timeout=300)
        assert run.poll() is None, run.communicate()
        os.killpg(run.pid, signum)  # as a terminal does: the rollout and its children
        if gate:
            faults.open_gate(gated, gate[1])  # the cut-off command's remote side goes on (as on a real controller)
        stdout, stderr = run.communicate(timeout=120)
    finally:
        if gate:
            faults.open_gate(gated, gate[1])
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(30)
    print(f"{name}: {signal.Signals(signum).name} -> exit {run.returncode}")
    assert run.returncode == 128 + signum, stdout + stderr
    state = _state(out)
    rid = state["rollout_id"]
    assert state["status"] == "interrupted" and state["interruption"]["signal"] == signal.Signals(signum).name
    nodes = state["nodes"]
    assert not [n for n in COMPUTE if nodes[n]["state"] == "failed"], (stdout, stderr)  # a child's death: no failure
    assert "No such process" not in stdout + stderr
    later = ["node03", "node04"] if name in ("drain status query of the canary (sinfo)",
                                             "converge of the canary (power limit)") \
        else [] if name.endswith("wave 3 (scontrol)") else ["node04"]
    for node in later:  # nothing started after the signal: the later waves' nodes untouched
        assert nodes[node]["state"] == "pending", (node, nodes[node])
        assert power_w(fleet, node) == before[node]
    # every node Slurm has drained for this rollout is named (state file and summary), none left unnamed
    slurm = sinfo(fleet)
    ours = sorted(n for n in COMPUTE if slurm[n][1].startswith(f"gpufleet rollout {rid}"))
    recorded = sorted(n for n in COMPUTE if nodes[n]["drained_by_rollout"] or nodes[n]["drain_uncertain"])
    assert set(ours) <= set(recorded), (ours, recorded, slurm)
    if ours:
        assert f"STILL DRAINED by this rollout ({len(ours)}): {', '.join(ours)}" in stdout, stdout
    # --resume finishes it: every node changed, every node back in service
    resumed = subprocess.run([*argv, "--resume"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [power_w(fleet, n) for n in COMPUTE] == [watts] * 3
    slurm = sinfo(fleet)
    assert all(slurm[n] == ("idle", "") for n in COMPUTE), (slurm, slurm_logs(fleet))
