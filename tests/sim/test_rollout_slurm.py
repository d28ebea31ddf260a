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

import contextlib
import ctypes
import json
import os
import re
import secrets
import select
import shlex
import signal
import struct
import subprocess
import threading
import time
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
# once. 20 timings, in three chains: a chain is one rollout, started, signalled at its first timing, continued with
# --resume and signalled at the next timing, and so on, then finished by a last --resume (exit 0, every node changed
# and idle in Slurm). Each run starts in its own process group (start_new_session) and the signal goes to the group.
# A moment is reached by a gate (a wrapper stops the n-th matching command on a host: before it runs, released only
# once the rollout has exited, so that its remote side goes on after the rollout asked Slurm, as a real controller's
# would; or after it ran, so that Slurm applied it and its ssh dies with the rollout), by the state file, at a
# state-file write (inotify), or with stdout blocked at the summary. Judged after every signal: the exit
# status, the state file, Slurm (every node it has drained for the rollout is named by the summary and the state file,
# no other), the node caught mid-phase named, and the later nodes untouched (not drained, never drained for this
# rollout in slurmctld's log, power limit unchanged). Waves: the canary node02, then node03, then node04; the deploy
# is the power stage only (a converge is one `nvidia-smi -pl`: 20 timings fit the CI budget); --max-failures 5, so
# that a child's death taken for a node's failure would let the rollout go on (as it did).

FAST_INVENTORY = INVENTORY.replace('["driver", "power", "nccl"]', '["power"]')
GATE_DIR = "/var/lib/gpufleet-sim/hw"  # the host's hardware directory (gpufleet.sim.hosts_paths.HW_MOUNT) inside it


class Gate:
    """Stop the ``nth`` call of ``program`` on ``host`` (an SSH session's: the rollout's, never the host's own
    services) whose arguments contain ``match``: ``before`` it runs (until :meth:`open`) or ``after`` it ran."""

    def __init__(self, fleet, host: str, program: str, match: str, when: str = "before", nth: int = 1):
        self.host, self.program, self.match, self.when, self.nth = fleet.host(host), program, match, when, nth
        hw = self.host.dir / "hw"
        self.files = {k: hw / f"test-gate.{program}.{k}" for k in ("closed", "reached", "done", "count")}
        self.wrapper = self.host.dir / "root" / faults.GATE_BIN / program

    def close(self) -> None:
        inside = {k: f"{GATE_DIR}/{p.name}" for k, p in self.files.items()}
        real, hold = shlex.quote(f"/usr/bin/{self.program}"), f'while [ -e {inside["closed"]} ]; do sleep 0.05; done'
        then = (f'touch {inside["reached"]}; {hold}; {real} "$@"; rc=$?' if self.when == "before" else
                f'{real} "$@"; rc=$?; touch {inside["reached"]}; {hold}')
        for p in self.files.values():
            p.unlink(missing_ok=True)
        self.files["closed"].touch()
        self.wrapper.write_text(
            "#!/bin/sh\n# gpufleet test gate (tests/sim/test_rollout_slurm.py)\n"
            f'case "${{SSH_CONNECTION:+ssh}} $* " in "ssh "*{shlex.quote(self.match)}*)\n'
            f'  n=$(( $(cat {inside["count"]} 2>/dev/null || echo 0) + 1 )); echo $n > {inside["count"]}\n'
            f'  if [ "$n" = {self.nth} ]; then {then}; touch {inside["done"]}; exit $rc; fi;;\n'
            f"esac\nexec {real} \"$@\"\n")
        self.wrapper.chmod(0o755)

    def reached(self) -> bool:
        return self.files["reached"].exists()

    def open(self) -> None:
        self.files["closed"].unlink(missing_ok=True)

    def remove(self) -> None:
        """Open it, wait for a held command to finish (its effect is then in Slurm or the GPU), remove it."""
        self.open()
        if self.reached():
            wait_for(f"the {self.program} held by the gate to finish", self.files["done"].exists, timeout=60,
                     every=0.05)
        self.wrapper.unlink(missing_ok=True)


class StateWrites:
    """inotify on the state file's directory: the moment the rollout creates the temporary file of a state write
    (gpufleet.control_files.write_atomic), that is, while it writes the state file."""

    IN_CREATE = 0x100

    def __init__(self, directory: Path):
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK)
        assert self.fd >= 0 and libc.inotify_add_watch(self.fd, str(directory).encode(), self.IN_CREATE) >= 0

    def wait(self, prefix: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            data, off = os.read(self.fd, 65536), 0
            while off < len(data):
                _wd, _mask, _cookie, size = struct.unpack_from("iIII", data, off)
                name = data[off + 16:off + 16 + size].rstrip(b"\0").decode()
                off += 16 + size
                if name.startswith(prefix):
                    return True
        return False

    def close(self) -> None:
        os.close(self.fd)


def _state(out: Path) -> dict:
    try:
        return json.loads((out / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def _node_state(out: Path, node: str) -> str | None:
    return (_state(out).get("nodes") or {}).get(node, {}).get("state")


# (name, signal, moment, node caught mid-phase or None, nodes the run must leave untouched, whether Slurm has that
# node drained for the rollout when the rollout has exited: nothing after the signal drained or resumed it)
# moments: ("start",) the rollout's first line (its whole-fleet validation and preflight); ("gate", host, program,
# match, before|after, nth); ("state", node, state) in the state file; ("write", host, program, match) the first
# state-file write after that command (let through); ("summary",) the rollout done, printing its summary to a stdout
# nobody reads (a full pipe).
DRAIN2, DRAIN3, DRAIN4 = (f"nodename={n} state=drain" for n in COMPUTE)
RESUME2, RESUME3, RESUME4 = (f"nodename={n} state=resume" for n in COMPUTE)
CHAINS = {
    "A": ("none", [
        ("at the very start (whole-fleet preflight)", signal.SIGINT, ("start",), None, COMPUTE, None),
        ("canary: drain status query (sinfo)", signal.SIGINT, ("gate", "node01", "sinfo", "-n node02", "before", 1),
         "node02", ("node03", "node04"), False),
        ("canary: drain command cut off, applied after the rollout exited (scontrol)", signal.SIGINT,
         ("gate", "node01", "scontrol", DRAIN2, "before", 1), "node02", ("node03", "node04"), False),
        ("canary: converge (nvidia-smi -pl)", signal.SIGINT, ("gate", "node02", "nvidia-smi", "-pl", "before", 1),
         "node02", ("node03", "node04"), True),
        # wave 2's drain status query (1st sinfo -n node03), then whether it is drained (2nd): Slurm has drained
        # it, the answer is cut off
        ("wave 2: drained in Slurm, the poll's answer cut off (sinfo)", signal.SIGINT,
         ("gate", "node01", "sinfo", "-n node03", "after", 2), "node03", ("node04",), True),
    ]),
    "B": ("none", [
        ("canary: drain applied by Slurm, its ssh cut off (scontrol)", signal.SIGINT,
         ("gate", "node01", "scontrol", DRAIN2, "after", 1), "node02", ("node03", "node04"), True),
        ("canary: resume command cut off, applied after the rollout exited (scontrol)", signal.SIGTERM,
         ("gate", "node01", "scontrol", RESUME2, "before", 1), "node02", ("node03", "node04"), True),
        ("wave 2: drain status query (sinfo)", signal.SIGINT, ("gate", "node01", "sinfo", "-n node03", "before", 1),
         "node03", ("node04",), False),
        ("wave 2: converge (nvidia-smi -pl)", signal.SIGTERM, ("gate", "node03", "nvidia-smi", "-pl", "before", 1),
         "node03", ("node04",), True),
        ("wave 2: resume applied by Slurm, its ssh cut off (scontrol)", signal.SIGHUP,
         ("gate", "node01", "scontrol", RESUME3, "after", 1), "node03", ("node04",), False),
        ("wave 3: drain command cut off, applied after the rollout exited (scontrol)", signal.SIGTERM,
         ("gate", "node01", "scontrol", DRAIN4, "before", 1), "node04", (), False),
        # node04 is drained for the rollout now: its drain status query (1st sinfo), then whether it is drained (2nd)
        ("wave 3: poll whether the node is drained (sinfo)", signal.SIGINT,
         ("gate", "node01", "sinfo", "-n node04", "before", 2), "node04", (), True),
        ("wave 3: resume command cut off, applied after the rollout exited (scontrol)", signal.SIGINT,
         ("gate", "node01", "scontrol", RESUME4, "before", 1), "node04", (), True),
        # drain status query (1st), drained? (2nd), the resume's status query (3rd)
        ("wave 3: the resume's status query (sinfo)", signal.SIGHUP,
         ("gate", "node01", "sinfo", "-n node04", "before", 3), "node04", (), True),
    ]),
    "C": ("quick", [
        ("canary: verify gate (probe)", signal.SIGINT, ("gate", "node02", "python3", "probe", "before", 1), "node02",
         ("node03", "node04"), True),
        ("between the canary and wave 2", signal.SIGINT, ("state", "node02", "done"), None, ("node04",), None),
        ("wave 2: verify gate (probe)", signal.SIGHUP, ("gate", "node03", "python3", "probe", "before", 1), "node03",
         ("node04",), True),
        ("at the state-file write after wave 2's resume", signal.SIGINT, ("write", "node01", "scontrol", RESUME3),
         None, ("node04",), None),
        ("wave 3: converge (nvidia-smi -pl)", signal.SIGINT, ("gate", "node04", "nvidia-smi", "-pl", "before", 1),
         "node04", (), True),
        ("after the last wave (printing the summary)", signal.SIGINT, ("summary",), None, (), None),
    ]),
}
TIMINGS = [(chain, *t) for chain, (_verify, steps) in CHAINS.items() for t in steps]
assert len(TIMINGS) == 20


def _slurm_view(fleet, rid: str) -> tuple[dict[str, tuple[str, str]], set[str]]:
    """Slurm's state, and the nodes slurmctld's log shows ever drained for rollout ``rid`` (one ssh)."""
    out = ssh(fleet, "node01", "sinfo -h -N -o '%N|%T|%E'; echo ---; "
              f"grep -o 'node node0[0-9] reason set to: gpufleet rollout {rid}' /var/log/slurm/slurmctld.log",
              check=False).stdout
    table, _, log = out.partition("---\n")
    rows = [line.split("|", 2) for line in table.splitlines() if line.count("|") >= 2]
    state = {n: (st.rstrip("*"), "" if reason == "none" else reason) for n, st, reason in rows}
    return state, {line.split()[1] for line in log.splitlines() if line}


def _interrupted_run(fleet, argv: list[str], out: Path, step: int, signum: int, moment: tuple):
    """Run ``argv`` in its own process group, signal the group at ``moment``; (exit status, stdout, stderr)."""
    logs = out.parent / f"run-{step}"
    stderr_path = logs.with_suffix(".stderr")
    gate = Gate(fleet, *moment[1:4], *moment[4:]) if moment[0] in ("gate", "write") else None
    if gate:
        gate.close()
    stdout, blocked = None, None
    if moment[0] == "summary":  # stdout a pipe nobody reads, already full: the summary's write blocks
        blocked, stdout = os.pipe()
        os.set_blocking(stdout, False)
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(stdout, b"\0" * 4096)
        os.set_blocking(stdout, True)
    else:
        stdout = open(logs.with_suffix(".stdout"), "w")  # (closed below)
    with open(stderr_path, "w") as stderr:
        run = subprocess.Popen(argv, cwd=REPO, stdout=stdout, stderr=stderr, start_new_session=True)
    os.close(stdout) if isinstance(stdout, int) else stdout.close()
    reader = None
    try:
        kind = moment[0]
        if kind == "start":
            reached = lambda: "gpufleet rollout " in stderr_path.read_text()  # noqa: E731
        elif kind in ("gate", "write"):
            reached = gate.reached
        elif kind == "state":
            reached = lambda: _node_state(out, moment[1]) == moment[2]  # noqa: E731
        else:
            reached = lambda: _state(out).get("status") == "finished"  # noqa: E731
        wait_for(moment, lambda: reached() or run.poll() is not None, timeout=300, every=0.05)
        assert run.poll() is None, stderr_path.read_text()
        if kind == "write":
            writes = StateWrites(out)
            gate.open()
            try:
                assert writes.wait(".state.json.", timeout=60), "no state-file write after the gate"
            finally:
                writes.close()
        os.killpg(run.pid, signum)  # as a terminal does: the rollout and its children
        if blocked is not None:  # read the pipe now, so that the rollout's last writes end
            reader = ThreadPoolExecutor(1)
            text = reader.submit(lambda: os.read(blocked, 1 << 20) + b"".join(iter(lambda: os.read(blocked, 65536),
                                                                                  b"")))
        run.wait(120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(30)
    if reader is not None:
        out_text = text.result(30).lstrip(b"\0").decode(errors="replace")
        reader.shutdown()
        os.close(blocked)
    else:
        out_text = logs.with_suffix(".stdout").read_text()
    return run.returncode, out_text, stderr_path.read_text(), gate


@pytest.mark.parametrize("chain", CHAINS)
def test_a_terminal_signal_to_the_process_group_stops_the_rollout_and_resume_finishes_it(fleet, tmp_path, chain):
    verify, steps = CHAINS[chain]
    watts = 250 + 5 * list(CHAINS).index(chain)
    inventory, out = tmp_path / "inventory.py", tmp_path / "out"
    inventory.write_text(FAST_INVENTORY.format(watts=watts))
    drain = "slurm:" + shlex.join(hosts.ssh_command(fleet.host("node01")))
    argv = [str(BIN / "gpufleet"), "rollout", "-y", str(inventory), "deploys/gpu_node.py", "--out", str(out), "--drain",
            drain, "--canary", "1", "--waves", "1", "--max-failures", "5", "--verify", verify]
    for step, (name, signum, moment, node, untouched, drained) in enumerate(steps):
        before = {n: power_w(fleet, n) for n in COMPUTE}
        resume = ["--resume"] if (out / "state.json").exists() else []
        t0 = time.monotonic()
        rc, stdout, stderr, gate = _interrupted_run(fleet, [*argv, *resume], out, step, signum, moment)
        t1 = time.monotonic()
        try:
            print(f"{chain}{step + 1} {name}: {signal.Signals(signum).name} -> exit {rc} after {t1 - t0:.1f} s")
            what = f"{chain}{step + 1} {name}\n{stdout}\n{stderr}"
            assert rc == 128 + signum, what
            assert "No such process" not in stdout + stderr, what
            state = _state(out)
            if moment[0] == "start":  # nothing drained or changed: no state file to resume
                assert "during the whole-fleet validation and preflight: nothing was drained" in stderr, what
                assert state == {}, what
            elif moment[0] == "summary":  # every node done: nothing to name, the state file says finished
                assert state["status"] == "finished" and all(v["state"] == "done" for v in state["nodes"].values())
                assert "after the last wave, while saving or printing: the rollout is FINISHED" in stderr, what
            else:
                assert state["status"] == "interrupted", what
                assert state["interruption"]["signal"] == signal.Signals(signum).name, what
                assert f"INTERRUPTED by {signal.Signals(signum).name}" in stdout, what
            nodes = state.get("nodes", {})
            assert not [n for n in nodes if nodes[n]["state"] == "failed"], what  # a child's death: no failure
            if node:  # the node caught mid-phase is named
                assert node in state["interruption"]["mid_change"], what
                assert re.search(rf"^interrupted mid-phase \(\d+\): .*{node} \(", stdout, re.M), what
            slurm, ever_drained = _slurm_view(fleet, state.get("rollout_id", "-"))
            # no half-written state file left beside it (the signal may land in a write)
            assert not list(out.glob(".state.json.*")), what
            # A state write is followed by others within milliseconds (the node done, the wave's timings, the next
            # wave's node draining) until the next remote command (its drain status query): the signal sent at the
            # first lands in that burst, the next node is at most waiting for its status query.
            before_start = ("pending", "draining") if moment[0] == "write" else ("pending",)
            for n in untouched:  # nothing started after the signal: the later nodes untouched
                assert nodes.get(n, {"state": "pending"})["state"] in before_start, what
                assert power_w(fleet, n) == before[n], (n, what)
                assert slurm[n] == ("idle", "") and n not in ever_drained, (n, slurm, what)
            # every node Slurm has drained for this rollout is named (state file and summary), and no other
            ours = sorted(n for n in COMPUTE if slurm[n][1].startswith(f"gpufleet rollout {state.get('rollout_id')}"))
            if drained is not None:  # nothing drained or resumed the node after the signal
                assert (node in ours) is drained, (node, slurm, what)
            recorded = sorted(n for n in nodes if nodes[n]["drained_by_rollout"])
            uncertain = sorted(n for n in nodes if nodes[n]["drain_uncertain"])
            assert set(ours) <= set(recorded) | set(uncertain) and set(recorded) <= set(ours), \
                (ours, recorded, uncertain, slurm, what)
            if recorded:
                assert f"STILL DRAINED by this rollout ({len(recorded)}): {', '.join(recorded)}" in stdout, what
            elif state:
                assert "STILL DRAINED" not in stdout, what
        finally:
            if gate:  # the held command goes on now (its remote side, as on a real controller): --resume copes
                gate.remove()
            print(f"    judged in {time.monotonic() - t1:.1f} s")
    # the last --resume finishes it: every node changed, every node back in service
    t0 = time.monotonic()
    resumed = subprocess.run([*argv, "--resume"], cwd=REPO, capture_output=True, text=True, timeout=600)
    print(f"{chain}: --resume -> exit {resumed.returncode} after {time.monotonic() - t0:.1f} s")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [power_w(fleet, n) for n in COMPUTE] == [watts] * 3
    slurm = sinfo(fleet)
    assert all(slurm[n] == ("idle", "") for n in COMPUTE), (slurm, slurm_logs(fleet))
