"""`gpufleet rollout` end to end on four simulated RTX 4090 workstations (driver preinstalled, to save time).

Each test rolls out a new power limit (its own value, so every rollout has a change to make) and judges the result
by the simulator's own state: the power limit in each host's simulated GPU state, and sshd's journal on a host
(whether the rollout connected to it at all). Drain is the generic ``command:`` hook, a script here that logs its
calls and lets a test hold a drain (to interrupt the rollout in the middle of a wave) or take a host down as its
wave starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import BIN, REPO, bring_up, check_path, gpufleet, ssh

from gpufleet.sim import hosts
from gpufleet.sim.gpu import state as gpu_state

NODES = ("node01", "node02", "node03", "node04")

INVENTORY = """from gpufleet.sim.inventory import sim_groups

gpu_nodes = [(name, dict(data, gpufleet_power_limit={watts}, gpufleet_stages=["driver", "power", "nccl"]))
             for name, data in sim_groups({{}})["gpu_nodes"]]
"""

HOOK = """#!/bin/sh
# gpufleet rollout --drain command: hook: $1 = drain | drained | resume | failed, $2 = node
echo "$1 $2" >> {dir}/hook.log
if [ "$1" = drain ] && [ -e {dir}/hold-$2 ]; then
    touch {dir}/holding-$2
    n=0
    while [ -e {dir}/hold-$2 ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n + 1)); done
fi
if [ "$1" = drain ] && [ -e {dir}/down-$2 ]; then
    {bin}/gpufleet sim fault "$2" host-down >/dev/null
fi
exit 0
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = bring_up(tmp_path_factory, ["rtx4090-1"] * len(NODES), driver="preinstalled")
    yield fleet
    hosts.down(log=lambda *_: None)


def power_w(fleet, name: str) -> float:
    """The power limit the simulated GPU holds (the simulator's state file, not our facts)."""
    gpus = gpu_state.read_state(str(fleet.host(name).dir / "hw/gpus.state"))
    return int(gpus["gpu.0.power.limit_mw"]) / 1000


def ssh_logins(fleet, name: str) -> int:
    """sshd's count of accepted logins on the host (this very query included)."""
    out = ssh(fleet, name, "journalctl -u ssh --no-pager -o cat | grep -c '^Accepted'").stdout
    return int(out.strip())


class Rollout:
    def __init__(self, tmp_path: Path, watts: int):
        self.dir = tmp_path
        self.inventory = tmp_path / "inventory.py"
        self.inventory.write_text(INVENTORY.format(watts=watts))
        self.hook = tmp_path / "hook.sh"
        self.hook.write_text(HOOK.format(dir=tmp_path, bin=BIN))
        self.hook.chmod(0o755)
        self.out = tmp_path / "out"

    def argv(self, *extra: str, drain: str | None = None) -> list[str]:
        return [str(BIN / "gpufleet"), "rollout", "-y", str(self.inventory), "deploys/gpu_node.py", "--out",
                str(self.out), "--drain", drain or f"command:{self.hook}", *extra]

    def run(self, *extra: str, drain: str | None = None) -> subprocess.CompletedProcess:
        result = subprocess.run(self.argv(*extra, drain=drain), cwd=REPO, capture_output=True, text=True, timeout=600)
        check_path(result.stderr, "GPUFLEET_ROLLOUT_INPROCESS")
        return result

    def report(self) -> dict:
        return json.loads((self.out / "rollout.json").read_text())

    def hook_calls(self) -> list[str]:
        log = self.dir / "hook.log"
        return log.read_text().splitlines() if log.exists() else []


def test_fault_on_the_canary_stops_with_no_other_host_changed(fleet, tmp_path):
    before = {n: power_w(fleet, n) for n in NODES}
    gpufleet("sim", "fault", "node01", "overheat")
    try:
        ro = Rollout(tmp_path, 300)
        result = ro.run("--canary", "1", "--waves", "100%", "--max-failures", "50%")
    finally:
        gpufleet("sim", "fault", "node01", "clear")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "failed (1): node01" in result.stdout and "health.temperature" in result.stdout
    assert "untouched (3): node02, node03, node04" in result.stdout
    assert "STILL DRAINED by this rollout (1): node01" in result.stdout  # a failed node stays out of service
    assert power_w(fleet, "node01") == 300  # the canary was changed, then failed its gate
    assert {n: power_w(fleet, n) for n in NODES[1:]} == {n: before[n] for n in NODES[1:]}
    assert [c for c in ro.hook_calls() if not c.endswith("node01")] == []  # no other host drained


def test_failure_in_wave_2_with_max_failures_0_stops_there(fleet, tmp_path):
    gpufleet("sim", "fault", "node03", "overheat")
    try:
        ro = Rollout(tmp_path, 310)
        result = ro.run("--canary", "1", "--waves", "2", "--max-failures", "0")
    finally:
        gpufleet("sim", "fault", "node03", "clear")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "changed (2): node01, node02" in result.stdout
    assert "failed (1): node03" in result.stdout and "untouched (1): node04" in result.stdout
    assert [power_w(fleet, n) for n in NODES[:3]] == [310, 310, 310] and power_w(fleet, "node04") != 310
    report = ro.report()
    assert [w["hosts"] for w in report["waves"]] == [["node01"], ["node02", "node03"]]
    assert report["nodes"]["node03"]["state"] == "failed" and report["nodes"]["node04"]["state"] == "pending"
    assert ro.hook_calls() == ["drain node01", "drained node01", "resume node01", "drain node02", "drain node03",
                               "drained node02", "drained node03", "failed node03", "resume node02"]


def test_sigint_mid_wave_then_resume_completes_without_touching_done_hosts(fleet, tmp_path):
    ro = Rollout(tmp_path, 320)
    (tmp_path / "hold-node03").touch()
    # --max-failures 5: a hook's death taken for node03's failure would let the rollout go on (issue 20)
    proc = subprocess.Popen(ro.argv("--canary", "1", "--waves", "100%", "--max-failures", "5"), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while not (tmp_path / "holding-node03").exists():  # the wave has started: node03's drain is in progress
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C as a terminal sends it: the rollout and node03's drain hook
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout + stderr
    assert "INTERRUPTED by SIGINT" in stdout and "STILL DRAINED by this rollout (1): node02" in stdout
    # the hook was cut off mid-drain and cannot say whose drain it is: named as maybe drained, not failed
    assert "MAY BE DRAINED by this rollout (1: " in stdout and stdout.split("MAY BE DRAINED")[1].split("\n")[0] \
        .endswith(": node03"), stdout
    assert "failed (0)" in stdout and "No such process" not in stdout + stderr
    state = json.loads((ro.out / "state.json").read_text())
    assert state["nodes"]["node01"]["state"] == "done" and state["nodes"]["node03"]["drain_uncertain"]
    assert "drain node04" not in ro.hook_calls() and not state["nodes"]["node04"]["drain_uncertain"]  # not started
    assert [power_w(fleet, n) for n in NODES] == [320] + [power_w(fleet, n) for n in NODES[1:]]
    assert power_w(fleet, "node02") != 320  # interrupted before the wave's converge
    os.unlink(tmp_path / "hold-node03")
    logins = ssh_logins(fleet, "node01")
    result = subprocess.run(ro.argv("--canary", "1", "--waves", "100%", "--resume"), cwd=REPO, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert ssh_logins(fleet, "node01") == logins + 1  # only this query: the rollout never connected to node01
    assert [power_w(fleet, n) for n in NODES] == [320] * 4
    assert "changed (3): node02, node03, node04" in result.stdout or "changed (4)" in result.stdout
    assert "STILL DRAINED" not in result.stdout
    calls = ro.hook_calls()
    assert calls.count("resume node02") == 1 and not [c for c in calls[calls.index("drain node03") + 1:]
                                                      if c.endswith("node01")]
    assert calls.count("drain node03") == 2 and calls.count("resume node03") == 1  # drained again, then resumed


def test_host_down_in_a_wave_counts_as_a_failure(fleet, tmp_path):
    ro = Rollout(tmp_path, 330)
    (tmp_path / "down-node04").touch()  # node04 goes down as its wave starts (after the preflight)
    try:
        result = ro.run("--canary", "1", "--waves", "100%", "--max-failures", "0")
    finally:
        gpufleet("sim", "fault", "node04", "clear")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "failed (1): node04" in result.stdout and "changed (3): node01, node02, node03" in result.stdout
    assert "node04: converge:" in result.stdout
    assert [power_w(fleet, n) for n in NODES[:3]] == [330] * 3 and power_w(fleet, "node04") != 330


def test_bad_input_stops_before_any_drain_or_change(fleet, tmp_path):
    ro = Rollout(tmp_path, 900)  # above every RTX 4090 board's maximum (450 W, or 600 W by VBIOS)
    before = {n: power_w(fleet, n) for n in NODES}
    result = ro.run()
    assert result.returncode == 2, result.stdout + result.stderr
    assert "gpufleet_power_limit" in result.stderr and "nothing was drained or changed" in result.stderr
    assert ro.hook_calls() == [] and {n: power_w(fleet, n) for n in NODES} == before
    # without drain: with a canary (the pass first), and one wave over every host (no separate pass: its own
    # pyinfra -y validates first): the same error, nothing changed, no state file left to --resume
    for shape in (("--canary", "1", "--waves", "2"), ("--canary", "0", "--waves", "100%")):
        result = ro.run(*shape, drain="none")
        assert result.returncode == 2, shape + (result.stdout, result.stderr)
        assert "outside this GPU's power limit range" in result.stderr, shape
        assert "nothing was drained or changed" in result.stderr, shape
        assert {n: power_w(fleet, n) for n in NODES} == before and not (ro.out / "state.json").exists(), shape


def test_without_drain_one_wave_converges_every_host_and_reports(fleet, tmp_path):
    ro = Rollout(tmp_path, 340)
    result = ro.run("--canary", "0", "--waves", "100%", "--verify", "none", drain="none")
    assert result.returncode == 0, result.stdout + result.stderr
    assert [power_w(fleet, n) for n in NODES] == [340] * 4
    assert "changed (4): node01, node02, node03, node04" in result.stdout
    report = ro.report()
    assert report["preflight"] == [] and [w["hosts"] for w in report["waves"]] == [list(NODES)]
    assert "node04" in (ro.out / "rollout.html").read_text()


def test_without_drain_the_waves_execute_the_pass_plan_over_one_connection_per_host(fleet, tmp_path):
    ro = Rollout(tmp_path, 350)
    before = {n: ssh_logins(fleet, n) for n in NODES}
    result = ro.run("--canary", "1", "--waves", "2", "--verify", "none", drain="none")
    assert result.returncode == 0, result.stdout + result.stderr
    assert [power_w(fleet, n) for n in NODES] == [350] * 4
    assert "changed (4): node01, node02, node03, node04" in result.stdout
    assert [w["hosts"] for w in ro.report()["waves"]] == [["node01"], ["node02", "node03"], ["node04"]]
    # one SSH login per host for the whole rollout (the pass's connection, used by the host's wave), plus the query
    assert {n: ssh_logins(fleet, n) for n in NODES} == {n: before[n] + 2 for n in NODES}


def test_without_drain_after_a_gate_each_wave_reads_its_hosts_again_and_converges(fleet, tmp_path):
    ro = Rollout(tmp_path, 360)
    before = {n: ssh_logins(fleet, n) for n in NODES}
    result = ro.run("--canary", "1", "--waves", "100%", "--verify", "quick", drain="none")
    assert result.returncode == 0, result.stdout + result.stderr
    assert [power_w(fleet, n) for n in NODES] == [360] * 4
    assert "changed (4): node01, node02, node03, node04" in result.stdout
    # the rollout's one connection per host, the verify gate's own, and the query
    assert {n: ssh_logins(fleet, n) for n in NODES} == {n: before[n] + 3 for n in NODES}



def test_over_two_workers_each_drained_wave_converges_over_one_connection_per_host(fleet, tmp_path):
    """``--jobs 2``: the whole-fleet pass and each wave (planned again after its drain, behind the workers'
    barrier) over 2 pyinfra workers: every host changed, each over the one SSH connection its worker made in the
    pass, the hook called per host as with one process."""
    ro = Rollout(tmp_path, 370)
    before = {n: ssh_logins(fleet, n) for n in NODES}
    result = ro.run("--canary", "1", "--waves", "100%", "--verify", "none", "--jobs", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert [power_w(fleet, n) for n in NODES] == [370] * 4
    assert "changed (4): node01, node02, node03, node04" in result.stdout
    assert [w["hosts"] for w in ro.report()["waves"]] == [["node01"], ["node02", "node03", "node04"]]
    assert sorted(ro.hook_calls()) == sorted(f"{action} {n}" for n in NODES for action in ("drain", "drained",
                                                                                          "resume"))
    assert {n: ssh_logins(fleet, n) for n in NODES} == {n: before[n] + 2 for n in NODES}
