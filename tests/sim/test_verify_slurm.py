"""`gpufleet verify --via slurm` and the `slurm` node stage (gres.conf) against a real Slurm (Debian 12's
slurmctld/slurmd 22.05 and munge) on the simulated fleet: node01 runs slurmctld, node02 (8 x H100), node03
(1 x A100) and node04 (1 x RTX 4090) run slurmd. Recipe and pitfalls: /work/shared/reference/slurm-on-sim.md; the
packages are the cached .debs of tests/sim/test_rollout_slurm.py.

Judged by Slurm's own state and output (``scontrol show node``, ``sinfo``, the sim hosts' files) and by the SSH
engine's report of the same fleet: verify through one srun gives every host the same check results as verify over
SSH, the exporter checks passing (the probe is given the exporters' credentials on srun's stdin, and the password
shows in no command line, environment, Slurm job record or file on the node while the job runs); a drained node
and a node whose slurmd is down are reported unreachable with Slurm's reason, without waiting; the gres stage
writes a gres.conf that slurmd accepts (the node registers its GPUs, ``Gres=`` in scontrol) and a second run
changes nothing.

The placeholder /dev/nvidiaN device nodes Slurm's GRES needs (the simulator has no kernel driver) are created by
this module's set-up only, as in the reference recipe.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import BIN, REPO, bring_up, grand_total, ssh
from slurm_sim import SLURM_CONF_COMMON, install_cluster, wait_for

from gpufleet import web_auth
from gpufleet.sim import faults, hosts

COMPUTE = ("node02", "node03", "node04")
GPUS = {"node02": 8, "node03": 1, "node04": 1}
SLURM_CONF = SLURM_CONF_COMMON + """GresTypes=gpu
NodeName=node02 CPUs=1 RealMemory=256 Gres=gpu:h100_80gb_hbm3:8 State=UNKNOWN
NodeName=node03 CPUs=1 RealMemory=256 Gres=gpu:a100-sxm4-40gb:1 State=UNKNOWN
NodeName=node04 CPUs=1 RealMemory=256 Gres=gpu:geforce_rtx_4090:1 State=UNKNOWN
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
INVENTORY = """from gpufleet.sim.inventory import sim_groups

gpu_nodes = [(name, dict(data, gpufleet_stages=["exporters", "slurm"], gpufleet_exporters_gpu="nvml",
                         gpufleet_verify_textfile_dir={textfiles!r}))
             for name, data in sim_groups({{}})["gpu_nodes"] if name != "node01"]
"""
TEXTFILES = "/var/tmp/gpufleet-textfiles"


def scontrol_node(fleet, node: str) -> dict[str, str]:
    out = ssh(fleet, "node01", f"scontrol show node {node}").stdout
    return dict(word.split("=", 1) for word in out.split() if "=" in word)


def gres_registered(fleet) -> bool:
    for node in COMPUTE:
        info = scontrol_node(fleet, node)
        if not info.get("Gres", "").startswith("gpu:") or "INVAL" in info.get("State", ""):
            return False
    return True


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The Slurm cluster, slurmd started WITHOUT gres.conf (Slurm marks the nodes invalid: GRES count 0 < N); the
    slurm stage then writes gres.conf and restarts slurmd, the nodes register their GPUs, and are resumed from
    the drain Slurm set itself."""
    started = time.monotonic()
    fleet = bring_up(tmp_path_factory, ["rtx4090-1", "h100-sxm-8", "a100-40gb-1", "rtx4090-1"], driver="preinstalled")
    install_cluster(fleet, SLURM_CONF, GPUS)
    inventory = tmp_path_factory.mktemp("verify-slurm") / "inventory.py"
    inventory.write_text(INVENTORY.format(textfiles=TEXTFILES))
    fleet.gpu_inventory = inventory
    wait_for("slurmd on node02-node04 to register", lambda: all(n in sinfo(fleet) for n in COMPUTE))
    print(f"\nslurm installed: {time.monotonic() - started:.1f} s")
    fleet.before_gres = {n: scontrol_node(fleet, n) for n in COMPUTE}
    fleet.gres_runs = [deploy(inventory), deploy(inventory)]
    print(f"gres stage run twice: {time.monotonic() - started:.1f} s")
    wait_for("node02-node04 to register their GPUs", lambda: gres_registered(fleet), timeout=60)
    print(f"GPUs registered: {time.monotonic() - started:.1f} s")
    ssh(fleet, "node01", "scontrol update nodename=node0[2-4] state=resume", check=False)
    wait_for("node02-node04 to be idle", lambda: all(sinfo(fleet)[n][0] == "idle" for n in COMPUTE), timeout=60)
    fleet.setup_seconds = time.monotonic() - started
    yield fleet
    hosts.down(log=lambda *_: None)


def deploy(inventory: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "pyinfra"), "-y", str(inventory), "deploys/gpu_node.py"], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)


def sinfo(fleet) -> dict[str, tuple[str, str]]:
    out = ssh(fleet, "node01", "sinfo -h -N -o '%N|%T|%E'", check=False).stdout
    rows = [line.split("|", 2) for line in out.splitlines() if line.count("|") >= 2]
    return {n: (state, "" if reason == "none" else reason) for n, state, reason in rows}


def verify(fleet, out: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "gpufleet"), "verify", str(fleet.gpu_inventory), "--out", str(out), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


def via_slurm(fleet) -> str:
    return "slurm:" + shlex.join(hosts.ssh_command(fleet.host("node01")))


def checks_by_host(report: Path) -> dict[str, list[tuple]]:
    """Each host's check results (check, GPU, verdict, message) from a report.json: what the two engines must agree
    on (the probe's own run time aside: a simulated GPU reads the same twice)."""
    data = json.loads(report.read_text())
    found: dict[str, list[tuple]] = {}
    for host in data["hosts"]:
        found[host["host"]] = sorted((c["check"], c.get("gpu_index") if c.get("gpu_index") is not None else -1,
                                      c["verdict"], re.sub(r"probe took [0-9.]+ s", "probe took T s", c["message"]))
                                     for c in host["checks"])
    return found


def test_gres_stage_writes_what_slurmd_accepts_and_a_second_run_changes_nothing(fleet):
    first, second = fleet.gres_runs
    assert first.returncode == 0, first.stdout
    # per host: gres.conf, the health check (gpufleet-healthcheck) and the exporters stage's three
    assert grand_total(first.stdout)["success"] == "15", first.stdout
    assert second.returncode == 0, second.stdout
    total = grand_total(second.stdout)
    assert (total["success"], total["error"], total["no_change"]) == ("-", "-", "18"), second.stdout  # idempotent
    # before: slurmd without gres.conf registered no GPU, so Slurm refused the node's registration (0 < 8 GPUs)
    assert all("INVALID_REG" in fleet.before_gres[n]["State"] for n in COMPUTE), fleet.before_gres
    text = ssh(fleet, "node02", "cat /etc/slurm/gres.conf").stdout
    assert [line for line in text.splitlines() if not line.startswith("#")] == (
        ["AutoDetect=off"] + [f"Name=gpu Type=h100_80gb_hbm3 File=/dev/nvidia{i}" for i in range(8)])
    # Slurm's own view after the stage restarted slurmd: the GPUs are registered with their types
    assert scontrol_node(fleet, "node02")["Gres"] == "gpu:h100_80gb_hbm3:8"
    assert scontrol_node(fleet, "node03")["Gres"] == "gpu:a100-sxm4-40gb:1"
    assert scontrol_node(fleet, "node04")["Gres"] == "gpu:geforce_rtx_4090:1"
    gres_out = ssh(fleet, "node02", "slurmd -G 2>&1", check=False).stdout
    assert "h100_80gb_hbm3" in gres_out and "/dev/nvidia7" in gres_out, gres_out
    print(f"\nSlurm cluster + gres stage set-up: {fleet.setup_seconds:.1f} s")


def while_probing(fleet, node: str) -> dict[str, str]:
    """What anyone on the cluster could read while the verify job runs (its probe held on ``node`` by a gate): every
    command line on the Slurm client (srun's) and on ``node`` (the task's shell, the probe), every process's
    environment on ``node``, Slurm's record of the job and its batch script, the files of ``node``'s /tmp and
    slurmd's spool directory."""
    job = ssh(fleet, "node01", "squeue -h -o %A").stdout.split()
    seen = {f"ps {name}": ssh(fleet, name, "ps -eww -o user=,args=").stdout for name in ("node01", node)}
    seen["environ"] = ssh(fleet, node, "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done 2>/dev/null; true",
                          ).stdout
    seen["scontrol"] = ssh(fleet, "node01", f"scontrol show job -dd {job[0]}").stdout
    seen["batch_script"] = ssh(fleet, "node01", f"scontrol write batch_script {job[0]} - 2>&1", check=False).stdout
    root = fleet.host(node).dir / "root"
    for directory in ("tmp", "var/lib/slurm/slurmd"):
        for path in (root / directory).rglob("*"):
            if path.is_file():
                seen[f"file {path}"] = path.read_text(errors="replace")
    return seen


def test_verify_via_slurm_gives_the_same_checks_as_over_ssh(fleet, tmp_path):
    """... and the exporter checks pass: the probe was given the exporters' credentials, which no command line,
    environment, Slurm record or file on the node shows while the job runs."""
    ssh_run = verify(fleet, tmp_path / "ssh")
    faults.close_gate(fleet.host("node03"), "python3", "probe")
    start = time.monotonic()
    run = subprocess.Popen([str(BIN / "gpufleet"), "verify", str(fleet.gpu_inventory), "--out", str(tmp_path / "slurm"),
                            "--via", via_slurm(fleet)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        wait_for("the probe task on node03", lambda: faults.gate_reached(fleet.host("node03"), "python3")
                 or run.poll() is not None, timeout=120)
        assert run.poll() is None, run.communicate()
        held = time.monotonic()
        seen = while_probing(fleet, "node03")
        gated = time.monotonic() - held
    finally:
        faults.open_gate(fleet.host("node03"), "python3")
    out, err = run.communicate(timeout=300)
    slurm_run = subprocess.CompletedProcess(run.args, run.returncode, out, err)
    seconds = time.monotonic() - start - gated
    secret = web_auth.password("exporters")
    assert [where for where, text in seen.items() if secret in text] == []
    assert "gpufleet-verify-" in seen["scontrol"] and "--exporters-stdin" in seen["ps node03"], seen
    assert slurm_run.returncode == ssh_run.returncode, slurm_run.stdout + slurm_run.stderr
    by_ssh = checks_by_host(tmp_path / "ssh" / "report.json")
    by_slurm = checks_by_host(tmp_path / "slurm" / "report.json")
    assert sorted(by_slurm) == list(COMPUTE)
    differ = {h: (sorted(set(by_ssh[h]) - set(by_slurm[h])), sorted(set(by_slurm[h]) - set(by_ssh[h])))
              for h in COMPUTE if by_ssh[h] != by_slurm[h]}
    assert not differ, differ
    assert sum(len(c) for c in by_slurm.values()) > 30  # the probe ran: GPU checks on 10 GPUs, not just host.*
    # the probe scraped each node's exporters with the exporters account (as over SSH, compared above)
    exporter_checks = {h: sorted((c[0], c[2]) for c in by_slurm[h] if c[0].startswith("config.exporter."))
                       for h in COMPUTE}
    assert exporter_checks == dict.fromkeys(COMPUTE, [("config.exporter.gpu", "pass"),
                                                      ("config.exporter.node", "pass")]), exporter_checks
    report = json.loads((tmp_path / "slurm" / "report.json").read_text())
    assert report["meta"]["via"] == "slurm" and report["meta"]["slurm_job"].startswith("gpufleet-verify-")
    for name in ("report.html", "report.md", "junit.xml", "gpufleet_verify.prom"):
        assert (tmp_path / "slurm" / name).stat().st_size > 0
    assert "via Slurm (job gpufleet-verify-" in slurm_run.stderr
    # the nodes' textfiles, written by the second job, are this run's results; the probe left nothing behind
    for node in COMPUTE:
        prom = ssh(fleet, node, f"cat {TEXTFILES}/gpufleet_verify.prom").stdout
        assert prom == (tmp_path / "slurm" / "prometheus" / f"{node}.prom").read_text()
        assert f'gpufleet_verify_last_run_timestamp_seconds{{hostname="{node}"}}' in prom
        assert ssh(fleet, node, "ls -d /tmp/gpufleet-probe.* 2>/dev/null; true").stdout.strip() == ""
    print(f"\nverify --via slurm over {len(COMPUTE)} nodes: {seconds:.1f} s")


def test_drained_and_down_nodes_are_unreachable_with_slurms_reason_without_waiting(fleet, tmp_path):
    ssh(fleet, "node01", "scontrol update nodename=node03 state=drain reason='admin: bad DIMM, ticket 42'")
    ssh(fleet, "node04", "systemctl stop slurmd")
    ssh(fleet, "node01", "scontrol update nodename=node04 state=down reason='slurmd stopped by the test'")
    try:
        start = time.monotonic()
        result = verify(fleet, tmp_path, "--via", via_slurm(fleet), timeout=120)
        seconds = time.monotonic() - start
        assert result.returncode == 1, result.stdout + result.stderr
        hosts_ = {h["host"]: h for h in json.loads((tmp_path / "report.json").read_text())["hosts"]}
        assert hosts_["node02"]["status"] == "ok"
        assert hosts_["node03"]["status"] == "unreachable"
        assert hosts_["node03"]["error"] == "Slurm node state drained (reason: admin: bad DIMM, ticket 42)"
        assert hosts_["node04"]["status"] == "unreachable"
        assert hosts_["node04"]["error"].startswith("Slurm node state down"), hosts_["node04"]["error"]
        assert "slurmd stopped by the test" in hosts_["node04"]["error"]
        assert seconds < 30, seconds  # not waiting for the nodes: they were left out of the job
    finally:
        ssh(fleet, "node04", "systemctl start slurmd")
        ssh(fleet, "node01", "scontrol update nodename=node03,node04 state=resume", check=False)
    wait_for("node03 and node04 to be idle again", lambda: all(sinfo(fleet)[n][0] == "idle" for n in COMPUTE))


def test_a_node_whose_slurmd_died_unnoticed_is_unreachable_and_the_others_are_verified(fleet, tmp_path):
    """slurmd stops on node04 while Slurm still lists it idle: the launch there fails and aborts the job step on
    every node; verify runs the others again without it."""
    ssh(fleet, "node04", "systemctl stop slurmd")
    try:
        assert sinfo(fleet)["node04"][0] == "idle"  # Slurm has not noticed
        start = time.monotonic()
        result = verify(fleet, tmp_path, "--via", via_slurm(fleet), timeout=300)
        seconds = time.monotonic() - start
        assert result.returncode == 1, result.stdout + result.stderr
        hosts_ = {h["host"]: h for h in json.loads((tmp_path / "report.json").read_text())["hosts"]}
        assert (hosts_["node02"]["status"], hosts_["node03"]["status"]) == ("ok", "ok"), result.stderr
        assert hosts_["node04"]["status"] == "unreachable"
        assert "srun: error: Task launch for StepId=" in hosts_["node04"]["error"]
        assert "failed on node node04: " in hosts_["node04"]["error"]
        print(f"\nverify --via slurm with slurmd dead on node04: {seconds:.1f} s")
    finally:
        ssh(fleet, "node04", "systemctl start slurmd")
        ssh(fleet, "node01", "scontrol update nodename=node04 state=resume", check=False)
    wait_for("node04 to be idle again", lambda: sinfo(fleet)["node04"][0] == "idle")


def test_ctrl_c_to_verify_via_slurm_exits_130_and_leaves_no_job(fleet, tmp_path):
    """A terminal's SIGINT to verify's process group while the probe job runs (stopped on node03 by a gate): exit
    130, the nodes of the job named, no report, and the job cancelled in Slurm (while node03's task still waits)."""
    faults.close_gate(fleet.host("node03"), "python3", "probe")
    run = subprocess.Popen([str(BIN / "gpufleet"), "verify", str(fleet.gpu_inventory), "--out", str(tmp_path),
                            "--via", via_slurm(fleet)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    try:
        wait_for("the probe task on node03", lambda: faults.gate_reached(fleet.host("node03"), "python3")
                 or run.poll() is not None, timeout=120)
        assert run.poll() is None, run.communicate()[0]
        os.killpg(run.pid, signal.SIGINT)
        out, _ = run.communicate(timeout=90)
        wait_for("the verify job to be gone", lambda: ssh(fleet, "node01", "squeue -h -o %j").stdout.strip() == "",
                 timeout=30)
    finally:
        faults.open_gate(fleet.host("node03"), "python3")
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(30)
    assert run.returncode == 130, out
    assert "gpufleet verify: interrupted by SIGINT (exit 130); probe not finished on: node02, node03, node04" in out
    assert not (tmp_path / "report.json").exists()
