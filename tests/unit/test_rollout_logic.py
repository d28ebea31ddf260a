"""gpufleet.rollout pure logic: counts and wave sizes, thresholds, the node state machine and its atomic state
file, pyinfra --json result parsing, the command drain hook, and the controller driven with a fake pyinfra and a
fake verify gate (order of waves, stop on failures, canary, max-unavailable, interruption and resume)."""

from __future__ import annotations

import io
import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpufleet._pyinfra import inprocess
from gpufleet.pyinfra_args import PyinfraArgs
from gpufleet.rollout import converge, report, run, waves
from gpufleet.rollout import state as st
from gpufleet.rollout.drain import CommandDrainer, DrainError, make_drainer

REAL_INVENTORY_ORDER = converge.inventory_order  # the fake fleet replaces it

# ------------------------------------------------------------------------------------------------ waves


@pytest.mark.parametrize(("text", "total", "n"), [("5", 100, 5), ("20%", 100, 20), ("20%", 7, 2), ("0", 9, 0),
                                                  ("100%", 3, 3), ("1%", 1000, 10), ("33%", 10, 4)])
def test_count_of_total(text, total, n):
    assert waves.Count.parse(text, option="--x").of(total) == n


@pytest.mark.parametrize("text", ["", "x", "-1", "5.5", "101%", "%", "5 hosts"])
def test_bad_counts_name_the_option_and_the_value(text):
    with pytest.raises(waves.BadCount, match=r"--max-failures"):
        waves.Count.parse(text, option="--max-failures")


def test_wave_sizes_repeat_the_last_and_cover_every_host():
    spec = waves.parse_waves("1,5,20%")
    assert waves.wave_sizes(40, spec) == [1, 5, 8, 8, 8, 8, 2]
    assert waves.wave_sizes(3, spec) == [1, 2]
    assert waves.wave_sizes(0, spec) == []
    assert waves.wave_sizes(5, waves.parse_waves("1%")) == [1, 1, 1, 1, 1]  # never a wave of 0 hosts
    with pytest.raises(waves.BadCount, match="at least 1"):
        waves.parse_waves("1,0")
    with pytest.raises(waves.BadCount, match="comma-separated"):
        waves.parse_waves("1,,2")


def test_plan_waves_keeps_inventory_order():
    hosts = [f"n{i}" for i in range(10)]
    assert waves.plan_waves(hosts, canary=1, waves=waves.parse_waves("2,50%")) == [
        ["n0"], ["n1", "n2"], ["n3", "n4", "n5", "n6", "n7"], ["n8", "n9"]]
    assert waves.plan_waves(hosts, canary=0, waves=waves.parse_waves("100%")) == [hosts]


def test_failure_and_unavailability_thresholds():
    assert not waves.too_many_failures(0, 10, waves.Count(0))
    assert waves.too_many_failures(1, 10, waves.Count(0))
    assert not waves.too_many_failures(1, 10, waves.Count(10, True))
    assert waves.too_many_failures(2, 10, waves.Count(10, True))
    assert waves.capacity(None, 10, 3) is None
    assert waves.capacity(waves.Count(3), 10, 1) == 2
    assert waves.capacity(waves.Count(3), 10, 5) == 0
    assert waves.capacity(waves.Count(10, True), 30, 0) == 3


# ------------------------------------------------------------------------------------------------ state


def test_state_machine_allows_the_documented_path_only():
    rec = st.NodeRecord("n1")
    for s in (st.DRAINING, st.DRAINED, st.CONVERGING, st.VERIFYING, st.RETURNING, st.DONE):
        rec.move(s)
    assert [h[0] for h in rec.history] == ["draining", "drained", "converging", "verifying", "returning", "done"]
    with pytest.raises(st.BadTransition):
        rec.move(st.CONVERGING)  # done is final
    rec = st.NodeRecord("n2")
    with pytest.raises(st.BadTransition):
        rec.move(st.CONVERGING)  # not drained first
    rec.move(st.DRAINING)
    rec.move(st.FAILED, "drain: boom")
    assert rec.state == "failed" and rec.reason == "drain: boom"


def test_state_file_round_trip_and_atomic_replace(tmp_path):
    s = st.RolloutState.new("r1", "inv.py", "deploy.py", {"canary": 1}, ["a", "b"])
    s.nodes["a"].move(st.DRAINING)
    s.nodes["a"].drained_by_rollout = True
    path = tmp_path / "sub" / "state.json"
    st.save(s, path)
    assert [p.name for p in path.parent.iterdir()] == ["state.json"]  # no temporary file left behind
    back = st.load(path)
    assert back.to_dict() == s.to_dict()
    assert back.drained_now() == ["a"] and back.by_state(st.PENDING) == ["b"]
    path.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(st.StateError, match="not a gpufleet rollout state"):
        st.load(path)
    path.write_text("{half")
    with pytest.raises(st.StateError, match="cannot read"):
        st.load(path)


def test_a_signal_during_a_state_write_waits_for_it_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    """A signal in the middle of a state write lost the write, or (between the temporary file's creation and the
    clean-up's try) left the temporary file beside the state file (seen after a Ctrl-C between two waves in
    tests/sim/test_rollout_slurm.py); it is now delivered once the write is done."""
    import os
    import signal

    from gpufleet import control_files

    s = st.RolloutState.new("r1", "inv.py", "deploy.py", {}, ["a"])
    path = tmp_path / "state.json"
    real_replace = os.replace

    def signalled_before_the_rename(src, dst):
        os.kill(os.getpid(), signal.SIGINT)  # arrives here: the temporary file exists, not yet renamed
        return real_replace(src, dst)

    monkeypatch.setattr(control_files.os, "replace", signalled_before_the_rename)
    # Python's own SIGINT handler, whatever an earlier test (a command run through click) installed
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            st.save(s, path)
    finally:
        signal.signal(signal.SIGINT, handler)
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    assert st.load(path).to_dict() == s.to_dict()


# ------------------------------------------------------------------------------------------------ pyinfra


def test_pyinfra_command_limits_each_host_and_never_uses_a_shell():
    cmd = converge.pyinfra_command("inv.py", "d.py", ["a", "b;rm -rf /"], dry=False)
    assert cmd[1:] == ["--json", "-y", "--limit", "a", "--limit", "b;rm -rf /", "inv.py", "d.py"]
    assert converge.pyinfra_command("inv.py", "d.py", None, dry=True)[1:] == ["--json", "--dry", "inv.py", "d.py"]
    with pytest.raises(ValueError, match="empty host list"):  # no --limit would mean every host
        converge.pyinfra_command("inv.py", "d.py", [], dry=False)


RESULTS = {"plan": [], "results": {
    "operations": [
        {"name": "gpufleet: GPU node | NVIDIA driver 580", "success": ["a"], "error": [], "no_change": ["b", "c"]},
        {"name": "gpufleet: GPU node | GPU power limits", "success": [], "error": ["b"], "no_change": ["a"]}],
    "totals": {}, "failed_hosts": ["b", "d"]}}
STDERR = """    [b] Error: executed 1 commands
    [d] Could not connect (timed out)
    [a] Success
"""


def test_host_outcomes_from_pyinfra_json():
    out = converge.host_outcomes(converge.PyinfraRun(1, RESULTS, STDERR), ["a", "b", "c", "d"])
    assert out["a"].ok and out["a"].changed and out["a"].operations_changed == [
        "gpufleet: GPU node | NVIDIA driver 580"]
    assert out["c"].ok and not out["c"].changed
    assert not out["b"].ok and out["b"].reason == ("operation failed: gpufleet: GPU node | GPU power limits "
                                                   "(Error: executed 1 commands)")
    assert not out["d"].ok and out["d"].reason == "Could not connect (timed out)"


def test_host_outcomes_without_results_fail_every_host_with_pyinfra_error():
    run_ = converge.PyinfraRun(1, None, "--> Loading inventory...\n--> pyinfra error: No hosts remaining!\n")
    out = converge.host_outcomes(run_, ["a", "b"])
    assert not out["a"].ok and "No hosts remaining" in out["a"].reason and out["b"].reason == out["a"].reason


def test_json_after_other_output_and_planned_changes():
    payload = {"plan": [{"name": "x | one", "hosts_with_change": ["a"], "hosts_with_conditional_change": ["b"]},
                        {"name": "x | two", "hosts_with_change": ["a"], "hosts_with_conditional_change": []}],
               "results": None}
    text = "some deploy print\n" + json.dumps(payload)
    parsed = converge.parse_json_stdout(text)
    assert converge.planned_changes(converge.PyinfraRun(0, parsed, "")) == {"a": ["x | one", "x | two"],
                                                                            "b": ["x | one"]}
    assert converge.parse_json_stdout("") is None and converge.parse_json_stdout("no json") is None


# ------------------------------------------------------------------------------------------------ drain hook


def hook(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "hook.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_command_drainer_calls_the_hook_with_action_and_node(tmp_path):
    log = tmp_path / "log"
    h = hook(tmp_path, f'echo "$1 $2 $GPUFLEET_ROLLOUT_REASON" >> {log}\n[ "$1" = drained ] && exit 1\nexit 0\n')
    d = make_drainer(f"command:{h}", "r1")
    assert isinstance(d, CommandDrainer)
    assert d.drain("node 1", "gpufleet rollout r1") is True
    assert d.is_drained("node 1") is False
    d.resume("node 1")
    assert log.read_text().splitlines() == ["drain node 1 gpufleet rollout r1", "drained node 1 ", "resume node 1 "]


def test_command_drainer_failure_names_the_command(tmp_path):
    h = hook(tmp_path, 'echo "scheduler says no" >&2\nexit 3\n')
    with pytest.raises(DrainError, match=r"hook.sh … drain n1 exited 3: scheduler says no"):
        make_drainer(f"command:{h}", "r").drain("n1", "x")
    with pytest.raises(DrainError, match="needs a command"):
        make_drainer("command:", "r")
    with pytest.raises(DrainError, match="allowed: none, slurm, slurm:PREFIX, command:CMD"):
        make_drainer("kubernetes", "r")


# ------------------------------------------------------------------------------------------------ controller


class FakeFleet:
    """A fake pyinfra (per-host outcome from ``broken``/``down``) and a fake verify gate (``gate_fails``)."""

    def __init__(self, hosts, *, broken=(), down=(), gate_fails=(), converged=(), interrupt_on=None):
        self.hosts, self.broken, self.down, self.gate_fails = list(hosts), set(broken), set(down), set(gate_fails)
        self.converged = set(converged)
        self.calls: list[tuple[str, list[str]]] = []
        self.interrupt_on = interrupt_on

    def run_pyinfra(self, inventory, deploy, hosts, *, dry, **_):
        hosts = list(hosts or self.hosts)
        self.calls.append(("dry" if dry else "run", hosts))
        if dry:
            plan = [{"name": "g | op", "hosts_with_change": [h for h in hosts if h not in self.converged],
                     "hosts_with_conditional_change": []}]
            return converge.PyinfraRun(0, {"plan": plan, "results": None}, "")
        if self.interrupt_on and self.interrupt_on in hosts:
            self.interrupt_on = None
            raise KeyboardInterrupt
        ok = [h for h in hosts if h not in self.broken | self.down]
        results = {"operations": [{"name": "g | op", "success": [h for h in ok if h not in self.converged],
                                   "error": sorted(self.broken & set(hosts)),
                                   "no_change": [h for h in ok if h in self.converged]}],
                   "failed_hosts": sorted((self.broken | self.down) & set(hosts))}
        stderr = "".join(f"    [{h}] Could not connect (timed out)\n" for h in self.down)
        return converge.PyinfraRun(1 if set(hosts) & (self.broken | self.down) else 0,
                                   {"plan": [], "results": results}, stderr)

    def gate(self, ctl, names, wave_index):
        for n in names:
            ctl.node(n).move(st.VERIFYING)
        ok = []
        for n in names:
            if n in self.gate_fails:
                ctl.fail(n, "verify: FAIL (health.temperature)")
            else:
                ok.append(n)
        return ok, None


@pytest.fixture
def fake(monkeypatch, tmp_path):
    def make(n=6, **kwargs):
        fleet = FakeFleet([f"n{i}" for i in range(1, n + 1)], **kwargs)
        monkeypatch.setenv(inprocess.SWITCH, "off")  # the subprocess engine, whose pyinfra this fakes
        monkeypatch.setattr(converge, "run_pyinfra", fleet.run_pyinfra)
        monkeypatch.setattr(converge, "inventory_order", lambda inv, **_: (list(fleet.hosts), None))
        monkeypatch.setattr(run.Controller, "phase_verify", lambda self, names, i: fleet.gate(self, names, i))
        return fleet
    deploy = tmp_path / "deploy.py"
    deploy.write_text("")
    make.deploy = str(deploy)
    return make


def opts(tmp_path, deploy, **kw) -> run.RolloutOptions:
    values = dict(inventory="inv.py", deploy=deploy, out=str(tmp_path / "out"), verify="quick")
    values.update(kw)
    return run.RolloutOptions(**values)


def go(o) -> tuple[int, str]:
    out = io.StringIO()
    lines: list[str] = []
    rc = run.main(o, progress=out, echo=lines.append)
    return rc, "\n".join(lines)


def test_waves_run_in_inventory_order_and_finish(fake, tmp_path):
    fleet = fake(6)
    rc, text = go(opts(tmp_path, fake.deploy, canary=1, waves="2,50%"))
    assert rc == 0, text
    assert fleet.calls == [("dry", ["n1", "n2", "n3", "n4", "n5", "n6"]), ("run", ["n1"]), ("run", ["n2", "n3"]),
                           ("run", ["n4", "n5", "n6"])]
    state = st.load(tmp_path / "out" / "state.json")
    assert state.status == "finished" and all(r.state == "done" and r.changed for r in state.nodes.values())
    assert "changed (6): n1, n2, n3, n4, n5, n6" in text and "untouched (0)" in text
    data = json.loads((tmp_path / "out" / "rollout.json").read_text())
    assert [w["hosts"] for w in data["waves"]] == [["n1"], ["n2", "n3"], ["n4", "n5", "n6"]]
    assert set(data["waves"][0]["phases"]) == {"drain", "converge", "verify", "return"}
    root = ET.parse(tmp_path / "out" / "rollout-junit.xml").getroot()
    assert root.get("tests") == "6" and root.get("failures") == "0"


def test_a_failing_canary_stops_before_any_other_host(fake, tmp_path):
    fleet = fake(4, gate_fails={"n1"})
    rc, text = go(opts(tmp_path, fake.deploy, canary=1, waves="100%", max_failures="50%"))
    assert rc == 1
    assert [c for c in fleet.calls if c[0] == "run"] == [("run", ["n1"])]
    assert "failed (1): n1" in text and "n1: verify: FAIL (health.temperature)" in text
    assert "untouched (3): n2, n3, n4" in text


def test_failure_in_wave_2_with_max_failures_0_stops_there(fake, tmp_path):
    fleet = fake(5, broken={"n3"})
    rc, text = go(opts(tmp_path, fake.deploy, canary=1, waves="2", max_failures="0"))
    assert rc == 1
    assert [c[1] for c in fleet.calls if c[0] == "run"] == [["n1"], ["n2", "n3"]]
    assert "changed (2): n1, n2" in text and "failed (1): n3" in text and "untouched (2): n4, n5" in text
    assert "n3: converge: operation failed: g | op" in text
    root = ET.parse(tmp_path / "out" / "rollout-junit.xml").getroot()
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("5", "1", "2")


def test_host_down_counts_as_a_failure_and_tolerated_failures_continue(fake, tmp_path):
    fleet = fake(5, down={"n2"})
    rc, text = go(opts(tmp_path, fake.deploy, canary=1, waves="2", max_failures="1"))
    assert rc == 1  # a host failed: not a clean rollout, even though the threshold let it continue
    assert [c[1] for c in fleet.calls if c[0] == "run"] == [["n1"], ["n2", "n3"], ["n4", "n5"]]
    assert "n2: converge: Could not connect (timed out)" in text and "untouched (0)" in text


def test_already_converged_hosts_are_not_drained_or_converged(fake, tmp_path, monkeypatch):
    fleet = fake(3, converged={"n2"})
    drainer = BusyDrainer(set())
    monkeypatch.setattr(run, "make_drainer", lambda spec, rid: drainer)
    rc, text = go(opts(tmp_path, fake.deploy, canary=1, waves="100%", drain="command:true"))
    assert rc == 0 and fleet.calls == [("dry", ["n1", "n2", "n3"]), ("run", ["n1"]), ("run", ["n3"])]
    assert "n2" not in drainer.checks and drainer.resumed == ["n1", "n3"]
    assert "already converged (1): n2" in text


def test_bad_input_stops_before_anything(fake, tmp_path, monkeypatch):
    fleet = fake(3)
    monkeypatch.setattr(converge, "run_pyinfra", lambda *a, **k: converge.PyinfraRun(
        1, None, "--> pyinfra error: n2: gpufleet_power_limit=900 W on GPU 0: outside this GPU's range\n"))
    drained = []
    monkeypatch.setattr(run.Drainer, "drain", lambda self, n, r: drained.append(n))
    out = io.StringIO()
    assert run.main(opts(tmp_path, fake.deploy), progress=out, echo=lambda _: None) == 2
    assert "gpufleet_power_limit=900 W" in out.getvalue() and "nothing was drained or changed" in out.getvalue()
    assert drained == [] and fleet.calls == []
    for bad in (dict(waves="1,x"), dict(max_failures="120%"), dict(canary=-1), dict(deploy="/nonexistent.py"),
                dict(drain="k8s")):
        o = opts(tmp_path, fake.deploy)
        for key, value in bad.items():
            setattr(o, key, value)
        rc, _ = go(o)
        assert rc == 2, bad


def test_interrupt_then_resume_never_touches_done_hosts(fake, tmp_path):
    fleet = fake(5, interrupt_on="n2")
    o = opts(tmp_path, fake.deploy, canary=1, waves="2")
    rc, text = go(o)
    assert rc == 130 and "INTERRUPTED" in text
    assert "interrupted mid-phase (2): n2 (converging), n3 (converging)" in text
    state = st.load(o.state_path())
    assert state.nodes["n1"].state == "done" and state.nodes["n2"].state == "converging"
    rc, text = go(opts(tmp_path, fake.deploy, canary=1, waves="2"))
    assert rc == 2  # the state file exists: not silently started over
    fleet.calls.clear()
    o.resume = True
    rc, text = go(o)
    assert rc == 0, text
    assert all(set(hosts).isdisjoint({"n1"}) for _, hosts in fleet.calls)  # n1 (done) not even preflighted again
    assert [c[1] for c in fleet.calls if c[0] == "run"] == [["n2", "n3"], ["n4", "n5"]]
    assert st.load(o.state_path()).status == "finished"


def test_interrupt_during_the_whole_fleet_pass_exits_130_with_nothing_drained_or_saved(fake, tmp_path, monkeypatch):
    fleet = fake(3)

    def interrupted(inventory, deploy, hosts, *, dry, **_):
        fleet.calls.append(("dry" if dry else "run", list(hosts or fleet.hosts)))
        raise KeyboardInterrupt

    monkeypatch.setattr(converge, "run_pyinfra", interrupted)
    drained = []
    monkeypatch.setattr(run.Drainer, "drain", lambda self, n, r: drained.append(n))
    o = opts(tmp_path, fake.deploy, canary=1, waves="2")
    out = io.StringIO()
    assert run.main(o, progress=out, echo=lambda _: None) == 130
    assert "interrupted during the whole-fleet validation and preflight: nothing was drained or changed" \
        in out.getvalue()
    assert fleet.calls == [("dry", ["n1", "n2", "n3"])] and drained == [] and not o.state_path().exists()


def test_max_unavailable_counts_failed_hosts_left_drained(fake, tmp_path, monkeypatch):
    fleet = fake(6, gate_fails={"n2"})
    monkeypatch.setattr(run.Drainer, "drain", lambda self, n, r: True)
    rc, text = go(opts(tmp_path, fake.deploy, canary=1, waves="3", max_failures="100%", max_unavailable="3"))
    # n2 failed and stays drained: later waves get 3 - 1 = 2 hosts at a time
    assert [c[1] for c in fleet.calls if c[0] == "run"] == [["n1"], ["n2", "n3", "n4"], ["n5", "n6"]]
    assert "STILL DRAINED by this rollout (1): n2" in text and rc == 1


def test_dry_prints_the_waves_and_changes_nothing(fake, tmp_path):
    fleet = fake(4, converged={"n3"})
    rc, text = go(opts(tmp_path, fake.deploy, canary=1, waves="2", dry=True))
    assert rc == 0 and [c[0] for c in fleet.calls] == ["dry"]
    assert "wave 1 (canary): n1" in text and "wave 2 (wave): n2, n4" in text and "already converged" in text
    assert not (tmp_path / "out" / "state.json").exists()


def test_report_junit_lists_untouched_hosts_as_skipped():
    s = st.RolloutState.new("r", "i", "d", {}, ["a", "b"])
    s.nodes["a"].move(st.DONE)
    root = ET.fromstring(report.junit(s).split("\n", 1)[1])
    assert [ts.get("name") for ts in root] == ["not run"] and root.get("skipped") == "1"



# ------------------------------------------------------------------------------------------------ Slurm


class FakeSlurm:
    """scontrol/sinfo answering like Slurm 22.05 (messages from /work/shared/reference/slurm-on-sim.md)."""

    def __init__(self, nodes):
        self.nodes = {n: dict(v) for n, v in nodes.items()}  # name -> {state, reason, user}
        self.calls: list[list[str]] = []

    def __call__(self, argv):
        import subprocess

        self.calls.append(argv)
        if argv[0] == "sinfo":
            n = self.nodes.get(argv[3])
            out = f"{n['state']}|{n['reason'] or 'none'}|{n['user']}\n" if n else ""
            return subprocess.CompletedProcess(argv, 0, out, "")
        node = self.nodes[argv[2].split("=", 1)[1]]
        if argv[3] == "state=drain":
            if not any(a.startswith("reason=") for a in argv):
                return subprocess.CompletedProcess(argv, 1, "", "You must specify a reason when DOWNING or "
                                                   "DRAINING a node. Request denied")
            node.update(state="draining" if node.get("job") else "drained",
                        reason=argv[4].split("=", 1)[1], user="root")
        elif argv[3] == "state=resume":
            if "drain" not in node["state"]:
                return subprocess.CompletedProcess(argv, 1, "", "slurm_update error: Invalid node state specified")
            node.update(state="allocated" if node.get("job") else "idle", reason="", user="")
        return subprocess.CompletedProcess(argv, 0, "", "")


def test_sinfo_parsing_keeps_spaces_and_bars_in_the_reason():
    from gpufleet.slurm import SlurmError, parse_sinfo

    s = parse_sinfo("drained|gres/gpu count reported lower | than configured (0 < 8)|slurm\n", "n1")
    assert (s.state, s.reason, s.user) == ("drained", "gres/gpu count reported lower | than configured (0 < 8)",
                                           "slurm")
    assert s.drained and s.drain_set
    assert parse_sinfo("draining|gpufleet rollout r1|root", "n").drain_set
    assert not parse_sinfo("draining|x|root", "n").drained
    assert parse_sinfo("drained*|x|root", "n").drained
    assert not parse_sinfo("idle|none|Unknown", "n").drain_set
    with pytest.raises(SlurmError, match="no node 'n9'"):
        parse_sinfo("", "n9")


def test_slurm_drains_with_the_rollout_reason_and_resumes_only_its_own():
    from gpufleet.rollout.drain import SlurmDrainer

    fake = FakeSlurm({"n1": {"state": "idle", "reason": "", "user": ""},
                      "n2": {"state": "drained", "reason": "bad DIMM, ticket 42", "user": "admin"},
                      "n3": {"state": "allocated", "reason": "", "user": "", "job": True}})
    d = SlurmDrainer("r1", run=fake)
    assert d.drain("n1", "x") is True
    assert ["scontrol", "update", "nodename=n1", "state=drain", "reason=gpufleet rollout r1"] in fake.calls
    assert d.is_drained("n1")
    assert d.drain("n2", "x") is False  # the admin's drain: not ours
    d.resume("n2")
    assert fake.nodes["n2"]["state"] == "drained" and fake.nodes["n2"]["reason"] == "bad DIMM, ticket 42"
    assert d.drain("n3", "x") is True and not d.is_drained("n3")  # a job still runs: draining
    d.resume("n1")
    assert fake.nodes["n1"]["state"] == "idle"
    d.keep_drained("n3", "verify: FAIL (health.ecc)")
    assert fake.nodes["n3"]["reason"] == "gpufleet rollout r1: verify: FAIL (health.ecc)"
    d.resume("n3")  # still ours (reason starts with the marker): resumed
    assert fake.nodes["n3"]["state"] == "allocated"
    assert d.drain("n1", "again") is True and d.drain("n1", "again") is True  # idempotent


def test_slurm_errors_name_the_command():
    from gpufleet.rollout.drain import SlurmDrainer

    fake = FakeSlurm({"n1": {"state": "idle", "reason": "", "user": ""}})

    def refuse(argv):
        import subprocess

        if argv[0] == "scontrol":
            return subprocess.CompletedProcess(argv, 1, "", "Invalid node name specified")
        return fake(argv)

    with pytest.raises(DrainError, match=r"scontrol update nodename=n1 state=drain .* exited 1: Invalid node name"):
        SlurmDrainer("r1", run=refuse).drain("n1", "x")


def test_error_text_keeps_the_preflight_errors_after_pyinfras_error_line():
    stderr = ("--> Loading config...\n    [node01] Connected\n--> Disconnecting from hosts...\n"
              "--> pyinfra error in /x/_inputs.py line 47: preflight failed: 1 error(s) on 1 host(s) (node01); no "
              "host was changed:\n  - node01: gpufleet_power_limit=900 W on GPU 0 (NVIDIA GeForce RTX 4090): "
              "outside this GPU's power limit range; allowed: 150-600 W\n")
    text = converge.PyinfraRun(1, None, stderr).error_text()
    assert text.splitlines()[0].startswith("--> pyinfra error in /x/_inputs.py line 47: preflight failed")
    assert text.splitlines()[1] == ("  - node01: gpufleet_power_limit=900 W on GPU 0 (NVIDIA GeForce RTX 4090): "
                                    "outside this GPU's power limit range; allowed: 150-600 W")


# ------------------------------------------------------------------------------------------------ drift


def test_drift_summary_per_setting_and_host():
    from gpufleet import drift

    payload = {"plan": [
        {"name": "gpufleet: GPU node | GPU power limits", "hosts_with_change": ["a"],
         "hosts_with_conditional_change": []},
        {"name": "gpufleet: GPU node | /etc/nccl.conf", "hosts_with_change": ["a", "c"],
         "hosts_with_conditional_change": []},
        {"name": "gpufleet: GPU node | MIG layout", "hosts_with_change": [], "hosts_with_conditional_change": []}],
        "results": None}
    d = drift.drift_from_run(converge.PyinfraRun(0, payload, ""), ["a", "b", "c"])
    assert d.exit_code == 1
    data = d.to_dict()
    assert data["hosts"] == {"a": ["GPU power limits", "/etc/nccl.conf"], "b": [], "c": ["/etc/nccl.conf"]}
    assert data["settings"] == {"GPU power limits": ["a"], "/etc/nccl.conf": ["a", "c"]} and data["in_sync"] == ["b"]
    assert drift.text(d).splitlines() == [
        "gpufleet drift: 2 of 3 host(s) differ from the configuration", "by setting:", "  GPU power limits: a",
        "  /etc/nccl.conf: a, c", "by host:", "  a: GPU power limits; /etc/nccl.conf", "  c: /etc/nccl.conf",
        "in sync: b"]
    many = [f"n{i:02d}" for i in range(25)]  # a large fleet in sync: the first 20 named, the JSON has all
    large = drift.drift_from_run(converge.PyinfraRun(0, {"plan": payload["plan"][2:], "results": None}, ""), many)
    assert drift.text(large).splitlines()[-1] == f"in sync: {', '.join(many[:20])} ... (+5)"
    assert large.to_dict()["in_sync"] == many
    clean = drift.drift_from_run(converge.PyinfraRun(0, {"plan": payload["plan"][2:], "results": None}, ""), ["a"])
    assert clean.exit_code == 0
    down = drift.drift_from_run(converge.PyinfraRun(0, {"plan": [], "results": None},
                                                    "    [b] Could not connect (timed out)\n"), ["a", "b"])
    assert down.exit_code == 2 and down.unreachable == {"b": "Could not connect (timed out)"}
    bad = drift.drift_from_run(converge.PyinfraRun(1, None, "--> pyinfra error: preflight failed\n"), ["a"])
    assert bad.exit_code == 2 and "preflight failed" in drift.text(bad)


class BusyDrainer(run.Drainer):
    """Drains every node; ``busy`` nodes run a job that ends after ``polls`` checks (never, with None)."""

    def __init__(self, busy, polls=None):
        self.busy, self.polls, self.checks, self.resumed, self.failed = dict.fromkeys(busy, 0), polls, [], [], []

    def drain(self, node, reason):
        return True

    def is_drained(self, node):
        self.checks.append(node)
        if node not in self.busy:
            return True
        self.busy[node] += 1
        return self.polls is not None and self.busy[node] > self.polls

    def resume(self, node):
        self.resumed.append(node)

    def keep_drained(self, node, reason):
        self.failed.append(node)


@pytest.mark.parametrize(("policy", "state", "converged"), [("fail", "failed", False), ("skip", "skipped", False),
                                                            ("force", "done", True)])
def test_wait_for_jobs_timeout_policies(fake, tmp_path, monkeypatch, policy, state, converged):
    fleet = fake(2)
    drainer = BusyDrainer({"n2"})
    monkeypatch.setattr(run, "make_drainer", lambda spec, rid: drainer)
    rc, text = go(opts(tmp_path, fake.deploy, canary=0, waves="100%", max_failures="100%", wait_for_jobs=0.05,
                       on_timeout=policy, poll_s=0.01))
    s = st.load(tmp_path / "out" / "state.json")
    assert s.nodes["n2"].state == state and s.nodes["n1"].state == "done"
    assert (["n1", "n2"] in [c[1] for c in fleet.calls if c[0] == "run"]) == converged
    if policy != "force":
        assert "jobs still running after --wait-for-jobs 0.05 s" in s.nodes["n2"].reason
        assert "n2" in drainer.resumed and not s.nodes["n2"].drained_by_rollout  # given back, nothing changed
    assert rc == (0 if policy == "force" else 1)  # a skipped host is not done either
    if policy != "force":  # the only other host of the wave was held back: pyinfra ran on n1 alone
        assert [c[1] for c in fleet.calls if c[0] == "run"] == [["n1"]]


def test_wait_for_jobs_waits_until_the_jobs_end(fake, tmp_path, monkeypatch):
    fleet = fake(2)
    drainer = BusyDrainer({"n2"}, polls=3)
    monkeypatch.setattr(run, "make_drainer", lambda spec, rid: drainer)
    rc, text = go(opts(tmp_path, fake.deploy, canary=0, waves="100%", wait_for_jobs=30, poll_s=0.01))
    assert rc == 0 and drainer.checks.count("n2") == 4
    assert [c[1] for c in fleet.calls if c[0] == "run"] == [["n1", "n2"]]
    assert drainer.resumed == ["n1", "n2"]


def test_a_job_still_running_without_wait_for_jobs_fails_the_node_with_a_message(fake, tmp_path, monkeypatch):
    fake(2)
    drainer = BusyDrainer({"n2"})
    monkeypatch.setattr(run, "make_drainer", lambda spec, rid: drainer)
    rc, text = go(opts(tmp_path, fake.deploy, canary=0, waves="100%", max_failures="100%"))
    assert rc == 1, text
    rec = st.load(tmp_path / "out" / "state.json").nodes["n2"]
    assert rec.state == "failed" and rec.reason == "drain: jobs still running (not waited for: no --wait-for-jobs)"
    assert "n2" in drainer.resumed


def test_verify_gate_uses_verify_and_fails_hosts_that_fail_a_check(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from gpufleet.verify import CheckResult, FleetResult, HostResult, unreachable_host
    from gpufleet.verify import run as verify_run

    calls = []

    def fake_run_verify(inventory, *, limit, bench, out, progress, override_data):
        calls.append((inventory, list(limit), bench, override_data))
        hosts = [HostResult("n1", checks=[CheckResult("health.ecc", "pass", "n1", "ok")]),
                 HostResult("n2", checks=[CheckResult("health.temperature", "fail", "n2", "92 C"),
                                          CheckResult("health.ecc", "warn", "n2", "x")]),
                 unreachable_host("n4", "timed out")]
        return SimpleNamespace(fleet=FleetResult(hosts), paths={"json": Path(out) / "report.json"})

    monkeypatch.setattr(verify_run, "run_verify", fake_run_verify)
    o = run.RolloutOptions(inventory="inv.py", out=str(tmp_path), verify="full",
                           pyinfra=PyinfraArgs(data=("ssh_port=2222",), ssh_user="ops"))
    state = st.RolloutState.new("r", "inv.py", "d.py", {}, ["n1", "n2", "n3", "n4"])
    for n in state.order:
        for s in (st.DRAINING, st.DRAINED, st.CONVERGING):
            state.nodes[n].move(s)
    ctl = run.Controller(o, run.Parsed([], waves.Count(0), None), state,
                         run.Drainer(), io.StringIO())
    state.waves.append({"index": 2, "kind": "wave", "hosts": state.order, "phases": {}})
    ok, path = ctl.phase_verify(["n1", "n2", "n3", "n4"], 2)
    # --verify full = probe + quick benchmarks; the gate reaches the hosts as the converge does (--data, --user)
    assert calls == [("inv.py", ["n1", "n2", "n3", "n4"], "quick", {"ssh_port": 2222, "ssh_user": "ops"})]
    assert ok == ["n1", "n3"]  # n3: not a GPU node (verify skipped it), nothing to gate
    assert state.nodes["n2"].reason == "verify: FAIL (health.temperature)"
    assert state.nodes["n4"].reason == "verify: UNREACHABLE (host.reachable)"
    assert path == str(tmp_path / "wave-002-verify" / "report.json")
    summary = state.waves[0]["verify_summary"]
    assert (summary["hosts"], summary["hosts_failed"], summary["hosts_unreachable"]) == (3, 2, 1)


def test_resume_after_a_stop_retries_the_failed_hosts_and_not_the_done_ones(fake, tmp_path):
    fleet = fake(4, broken={"n2"})
    o = opts(tmp_path, fake.deploy, canary=1, waves="1", max_failures="0")
    rc, text = go(o)
    assert rc == 1 and "failed (1): n2" in text and "untouched (2): n3, n4" in text
    assert "--resume" in text
    fleet.broken.clear()  # the operator fixed n2
    fleet.calls.clear()
    o.resume = True
    rc, text = go(o)
    assert rc == 0, text
    assert fleet.calls == [("dry", ["n2", "n3", "n4"]), ("run", ["n2"]), ("run", ["n3"]), ("run", ["n4"])]
    s = st.load(o.state_path())
    assert [h[0] for h in s.nodes["n2"].history][-2:] == ["returning", "done"] and "failed" in [
        h[0] for h in s.nodes["n2"].history]


def test_slurm_spec_runs_commands_locally_or_through_a_prefix(monkeypatch):
    from gpufleet import slurm

    seen = []
    monkeypatch.setattr(slurm, "run_command", lambda argv: seen.append(argv) or __import__(
        "subprocess").CompletedProcess(argv, 0, "idle|none|Unknown\n", ""))
    assert slurm.parse_spec("slurm") == [] and slurm.parse_spec("slurm:ssh -p 2222 root@ctl") == [
        "ssh", "-p", "2222", "root@ctl"]
    make_drainer("slurm:ssh root@ctl", "r1").status("gpu node")
    assert seen[-1] == ["ssh", "root@ctl", "sinfo -h -n 'gpu node' -o '%T|%E|%u'"]
    with pytest.raises(DrainError, match="needs a command prefix"):
        make_drainer("slurm:", "r1")


def test_a_wave_with_every_host_held_back_runs_pyinfra_on_nobody(fake, tmp_path, monkeypatch):
    fleet = fake(3)
    monkeypatch.setattr(run, "make_drainer", lambda spec, rid: BusyDrainer({"n1"}))
    rc, text = go(opts(tmp_path, fake.deploy, canary=1, waves="100%", wait_for_jobs=0.02, poll_s=0.01))
    assert rc == 1 and "untouched (2): n2, n3" in text
    assert [c for c in fleet.calls if c[0] == "run"] == []  # not a pyinfra run without --limit (= every host)


def test_one_wave_without_drain_is_its_own_validation_pass(fake, tmp_path):
    fleet = fake(4)
    rc, text = go(opts(tmp_path, fake.deploy, canary=0, waves="100%"))
    # the wave's own pyinfra -y validates and preflights every host before any change: no separate pass
    assert rc == 0 and fleet.calls == [("run", ["n1", "n2", "n3", "n4"])]
    assert "changed (4)" in text
    # any other shape keeps the separate whole-fleet pass first
    for shape in (dict(canary=1, waves="100%"), dict(canary=0, waves="50%"), dict(canary=0, waves="100%", dry=True),
                  dict(canary=0, waves="100%", max_unavailable="2")):
        fleet.calls.clear()
        go(opts(tmp_path / str(len(shape)) / str(shape.get("canary")), fake.deploy, **shape))
        assert fleet.calls[0][0] == "dry", shape


def test_one_wave_converged_hosts_change_nothing_and_are_reported(fake, tmp_path):
    fleet = fake(3, converged={"n2"})
    rc, text = go(opts(tmp_path, fake.deploy, canary=0, waves="100%"))
    # no per-host plan first: n2 is in the wave, pyinfra changes nothing there
    assert rc == 0 and fleet.calls == [("run", ["n1", "n2", "n3"])]
    assert "changed (2): n1, n3" in text and "already converged (1): n2" in text


def test_one_wave_bad_input_exits_2_with_nothing_changed_and_no_state_file(fake, tmp_path, monkeypatch):
    fake(3)
    error = ("--> Loading inventory...\n--> Preparing operations...\n--> pyinfra error: invalid configuration\n"
             "  - n2: gpufleet_power_limit=900 W on GPU 0: outside this GPU's power limit range\n")
    monkeypatch.setattr(converge, "run_pyinfra", lambda *a, **k: converge.PyinfraRun(1, None, error))
    out = io.StringIO()
    o = opts(tmp_path, fake.deploy, canary=0, waves="100%")
    assert run.main(o, progress=out, echo=lambda _: None) == 2
    assert "n2: gpufleet_power_limit=900 W" in out.getvalue() and "nothing was drained or changed" in out.getvalue()
    assert not o.state_path().exists()  # the corrected command starts afresh, no --resume needed
    # a run that crashed after execution began is no bad input: the wave's hosts fail, the state says so
    crashed = "--> Beginning operation run...\n    [n1] Error: unexpected\n"
    monkeypatch.setattr(converge, "run_pyinfra", lambda *a, **k: converge.PyinfraRun(1, None, crashed))
    assert run.main(o, progress=io.StringIO(), echo=lambda _: None) == 1
    assert st.load(o.state_path()).nodes["n1"].state == "failed"


def test_a_new_rollout_runs_the_whole_fleet_pass_beside_the_inventory_order(fake, tmp_path, monkeypatch):
    fleet = fake(4)
    seen = []
    real = fleet.run_pyinfra

    def spy(inventory, deploy, hosts, **kwargs):
        seen.append(hosts)
        return real(inventory, deploy, hosts, **kwargs)

    monkeypatch.setattr(converge, "run_pyinfra", spy)
    o = opts(tmp_path, fake.deploy, canary=1, waves="100%", max_failures="0")
    fleet.broken = {"n2"}
    rc, _ = go(o)
    # new rollout: the pass over every host of the inventory (no --limit) needs no order, so it runs beside it
    assert rc == 1 and seen[0] is None and json.loads((tmp_path / "out" / "rollout.json").read_text())[
        "preflight"][0]["hosts"] is None
    fleet.broken.clear()
    seen.clear()
    o.resume = True
    rc, _ = go(o)
    assert rc == 0 and seen[0] == ["n2"]  # --resume: the hosts still to do, by name
    monkeypatch.setattr(converge, "inventory_order", lambda inv, **_: ([], "cannot load the inventory inv.py"))
    rc, _ = go(opts(tmp_path / "again", fake.deploy, canary=1))
    assert rc == 2


# ---------------------------------------------------------------------------- interruption from a terminal (issue 20)


@pytest.fixture
def signalled(monkeypatch):
    """The rollout process received ``signum`` (gpufleet.interruption.catch_signals' record), as when a terminal's
    Ctrl-C reached the whole process group; cleared afterwards."""
    import signal

    from gpufleet import interruption

    def receive(signum=signal.SIGINT):
        monkeypatch.setattr(interruption, "_received", [signum])

    return receive


def test_a_slurm_command_killed_with_the_rollout_is_the_interruption_not_a_node_failure(signalled, monkeypatch):
    import signal
    import subprocess

    from gpufleet import interruption, slurm

    ssh_killed = ["sh", "-c", "echo 'Killed by signal 2.' >&2; exit 255"]  # what ssh -T prints and exits with
    assert slurm.run_command(ssh_killed).returncode == 255  # no signal: a failing command is for the caller to judge
    signalled(signal.SIGINT)
    with pytest.raises(interruption.Interrupted) as caught:
        slurm.run_command(ssh_killed)
    assert caught.value.signum == signal.SIGINT

    def gone(*_a, **_k):  # subprocess.run killing a child the same signal already took
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(slurm.subprocess, "run", gone)
    with pytest.raises(interruption.Interrupted):
        slurm.run_command(["sinfo"])
    monkeypatch.setattr(subprocess, "run", gone)
    with pytest.raises(interruption.Interrupted):
        CommandDrainer(["hook"]).drain("n1", "r")


def test_ctrl_c_in_a_drain_starts_nothing_more_and_names_the_drain_slurm_applied(fake, tmp_path, monkeypatch,
                                                                                  signalled):
    """With failures tolerated (--max-failures 5) a child's death taken for a failure let the rollout go on: two
    more nodes drained and changed after Ctrl-C. Here the drain of n3 is applied by Slurm while the signal arrives
    (its scontrol is cut off): the rollout stops, asks Slurm again and names n3 as still drained; --resume ends it."""
    from gpufleet import interruption
    from gpufleet.rollout.drain import SlurmDrainer

    fleet = fake(5)
    slurm = FakeSlurm({f"n{i}": {"state": "idle", "reason": "", "user": ""} for i in range(1, 6)})

    def terminal(argv):
        result = slurm(argv)
        if argv[:3] == ["scontrol", "update", "nodename=n3"] and "state=drain" in argv and not fleet.interrupted:
            fleet.interrupted = True
            signalled()
            raise interruption.Interrupted(2)  # as _run raises it once the child died of the same Ctrl-C
        return result

    fleet.interrupted = False
    monkeypatch.setattr(run, "make_drainer", lambda spec, rid: SlurmDrainer(rid, run=terminal))
    o = opts(tmp_path, fake.deploy, canary=1, waves="1", max_failures="5", drain="slurm")
    rc, text = go(o)
    assert rc == 130, text
    state = st.load(o.state_path())
    assert state.status == "interrupted" and state.interruption["signal"] == "SIGINT"
    assert state.interruption["mid_change"] == ["n3"]
    assert not state.by_state(st.FAILED)
    assert state.nodes["n3"].drained_by_rollout  # asked again: Slurm applied it
    assert "STILL DRAINED by this rollout (1): n3" in text and "INTERRUPTED by SIGINT" in text
    assert [c[1] for c in fleet.calls if c[0] == "run"] == [["n1"], ["n2"]]  # nothing after the signal
    assert [n for n, v in slurm.nodes.items() if v["reason"]] == ["n3"]  # and n4, n5 were never drained
    monkeypatch.setattr(interruption, "_received", [])
    o.resume = True
    rc, text = go(o)
    assert rc == 0, text
    assert all(v["state"] == "idle" and not v["reason"] for v in slurm.nodes.values())


def test_resume_drains_again_a_node_whose_cut_off_resume_slurm_applied_after_the_rollout_asked(fake, tmp_path,
                                                                                               monkeypatch, signalled):
    """Ctrl-C while n2's `scontrol ... state=resume` was on its way to a remote controller: the rollout asked Slurm
    (still drained: recorded as drained by the rollout), then the resume applied. --resume drains n2 again before
    its converge (it must not be changed in service, nor taken for a node whose jobs never end), then resumes it."""
    from gpufleet import interruption
    from gpufleet.rollout.drain import SlurmDrainer

    fleet = fake(3)
    slurm = FakeSlurm({f"n{i}": {"state": "idle", "reason": "", "user": ""} for i in range(1, 4)})
    late: list[list[str]] = []

    def terminal(argv):
        if argv[:3] == ["scontrol", "update", "nodename=n2"] and "state=resume" in argv and not late:
            late.append(argv)  # its remote side applies after the rollout has exited
            signalled()
            raise interruption.Interrupted(2)
        return slurm(argv)

    monkeypatch.setattr(run, "make_drainer", lambda spec, rid: SlurmDrainer(rid, run=terminal))
    o = opts(tmp_path, fake.deploy, canary=1, waves="1", max_failures="5", drain="slurm")
    rc, text = go(o)
    assert rc == 130 and "STILL DRAINED by this rollout (1): n2" in text, text
    slurm(late[0])  # applied now
    assert slurm.nodes["n2"]["state"] == "idle"
    monkeypatch.setattr(interruption, "_received", [])
    o.resume = True
    slurm.calls.clear()
    rc, text = go(o)
    assert rc == 0, text
    updates = [c for c in slurm.calls if c[0] == "scontrol"]
    assert updates[0][:4] == ["scontrol", "update", "nodename=n2", "state=drain"]  # drained before its converge
    assert all(v["state"] == "idle" and not v["reason"] for v in slurm.nodes.values())
    assert [c[1] for c in fleet.calls if c[0] == "run"][-2:] == [["n2"], ["n3"]]


def test_a_signal_while_printing_the_summary_exits_130_with_the_rollout_finished(fake, tmp_path, signalled):
    from gpufleet import interruption

    fake(2)

    def blocked_terminal(text):  # stdout full (nobody reads it): Ctrl-C arrives while the summary is written
        signalled()
        raise interruption.Interrupted(2)

    o = opts(tmp_path, fake.deploy, canary=1, waves="1")
    out = io.StringIO()
    assert run.main(o, progress=out, echo=blocked_terminal) == 130  # was click's "Aborted!", exit 1
    assert st.load(o.state_path()).status == "finished" and (Path(o.out) / "rollout.json").exists()
    assert "interrupted by SIGINT after the last wave, while saving or printing: the rollout is FINISHED" in \
        out.getvalue()


def test_sigterm_and_sighup_exit_143_and_129(fake, tmp_path, signalled):
    import signal

    from gpufleet import interruption

    for signum, status in ((signal.SIGTERM, 143), (signal.SIGHUP, 129)):
        fleet = fake(3)

        def stopped(inventory, deploy, hosts, *, dry, signum=signum, fleet=fleet, **_):
            if not dry:
                raise interruption.Interrupted(signum)
            return FakeFleet.run_pyinfra(fleet, inventory, deploy, hosts, dry=dry)

        converge.run_pyinfra = stopped  # restored by the fake fixture's monkeypatch
        o = opts(tmp_path / str(signum), fake.deploy, canary=1)
        rc, text = go(o)
        assert rc == status, text
        assert st.load(o.state_path()).interruption["signal"] == signal.Signals(signum).name


def test_a_node_failing_before_its_drain_is_recorded_and_listed_as_not_drained(fake, tmp_path, monkeypatch):
    fake(3)

    class Refusing(BusyDrainer):
        def drain(self, node, reason):
            if node == "n2":
                raise DrainError("scontrol update nodename=n2 state=drain exited 1: Invalid node name specified")
            return True

    monkeypatch.setattr(run, "make_drainer", lambda spec, rid: Refusing(set()))
    o = opts(tmp_path, fake.deploy, canary=1, waves="1", max_failures="1", drain="command:true")
    rc, text = go(o)
    assert rc == 1
    rec = st.load(o.state_path()).nodes["n2"]
    assert rec.state == "failed" and not rec.drained_by_rollout
    assert rec.not_drained == "failed while draining, before this rollout drained it"
    assert "failed, NOT drained (1): n2 (failed while draining, before this rollout drained it)" in text
    assert "STILL DRAINED" not in text


def test_a_node_interrupted_in_its_gate_is_gated_and_resumed_by_resume_though_already_converged(fake, tmp_path,
                                                                                                 monkeypatch):
    """Interrupted in its verify gate, n2 is converged but drained and not verified: --resume's plan finds no change
    for it, yet it must go through its gate and be given back to the scheduler, not be marked done still drained."""
    from gpufleet import interruption

    fleet = fake(3)
    drainer = BusyDrainer(set())
    monkeypatch.setattr(run, "make_drainer", lambda spec, rid: drainer)
    gate = fleet.gate
    gated = []

    def gate_interrupted_once(ctl, names, wave_index):
        gated.extend(names)
        if "n2" in names and not fleet.converged:
            fleet.converged.add("n2")  # its converge ran: the next plan has no change for it
            raise interruption.Interrupted(2)
        return gate(ctl, names, wave_index)

    monkeypatch.setattr(run.Controller, "phase_verify", lambda self, names, i: gate_interrupted_once(self, names, i))
    o = opts(tmp_path, fake.deploy, canary=1, waves="1", drain="command:true")
    assert go(o)[0] == 130
    assert st.load(o.state_path()).nodes["n2"].drained_by_rollout
    o.resume = True
    rc, text = go(o)
    assert rc == 0, text
    assert gated.count("n2") == 2 and drainer.resumed == ["n1", "n2", "n3"]
    assert not st.load(o.state_path()).drained_now()


def test_a_hook_cut_off_mid_drain_leaves_that_node_maybe_drained_and_no_other(fake, tmp_path, monkeypatch):
    """A command: hook cannot say whose drain a node has: the node whose drain was in flight is "may be drained"
    (drained again and resumed by --resume); the wave's next node, whose drain never started, is not."""
    from gpufleet import interruption

    fake(4)

    class CutOff(BusyDrainer):
        def drain(self, node, reason):
            if node == "n3":
                raise interruption.Interrupted(2)
            return True

    monkeypatch.setattr(run, "make_drainer", lambda spec, rid: CutOff(set()))
    o = opts(tmp_path, fake.deploy, canary=1, waves="100%", drain="command:true")
    rc, text = go(o)
    assert rc == 130
    nodes = st.load(o.state_path()).nodes
    assert [n for n in nodes if nodes[n].drain_uncertain] == ["n3"] and nodes["n2"].drained_by_rollout
    assert "MAY BE DRAINED by this rollout (1: " in text and "STILL DRAINED by this rollout (1): n2" in text


# ------------------------------------------------------------------------------------------------ CLI parity


def listed_inventory(monkeypatch, hosts: dict[str, list[str]]) -> list[list[str]]:
    """``pyinfra --json INVENTORY debug-inventory`` faked ({host: groups}); returns the argv of each call."""
    calls = []

    def fake_run(argv, **_):
        calls.append(argv)
        assert argv[-1] == "debug-inventory"
        document = [{"name": n, "groups": g, "data": {}} for n, g in hosts.items()]
        return subprocess.CompletedProcess(argv, 0, json.dumps(document), "")

    monkeypatch.setattr(converge.subprocess, "run", fake_run)
    return calls


def test_inventory_order_takes_limit_and_data_as_pyinfra(monkeypatch):
    calls = listed_inventory(monkeypatch, {"n1": ["h100"], "n2": [], "x1": ["h100"], "n3": []})
    args = PyinfraArgs(limit=("n3,h100",), data=("k=v",), ssh_user="ops", verbosity=1)
    assert REAL_INVENTORY_ORDER("inv.py", args=args) == (["n1", "x1", "n3"], None)  # pyinfra's order
    assert calls[0][1:] == ["--json", "--data", "k=v", "--ssh-user", "ops", "inv.py", "debug-inventory"]
    names, error = REAL_INVENTORY_ORDER("inv.py", args=PyinfraArgs(limit=("n1,zz*",)))
    assert names == [] and error == "--limit zz*: no host or group of inv.py matches; hosts: n1, n2, x1, n3"


def test_limit_rolls_out_only_those_hosts_and_resume_keeps_them(fake, tmp_path, monkeypatch):
    fleet = fake(4)
    listed_inventory(monkeypatch, {h: [] for h in fleet.hosts})
    monkeypatch.setattr(converge, "inventory_order", REAL_INVENTORY_ORDER)
    o = opts(tmp_path, fake.deploy, canary=1, waves="100%", pyinfra=PyinfraArgs(limit=("n4,n2",)))
    rc, text = go(o)
    assert rc == 0, text
    assert fleet.calls == [("dry", ["n2", "n4"]), ("run", ["n2"]), ("run", ["n4"])]  # never every host
    assert st.load(o.state_path()).options["limit"] == ["n4", "n2"]
    o.resume, o.pyinfra = True, PyinfraArgs(limit=("n1",))
    out = io.StringIO()
    assert run.main(o, progress=out, echo=lambda _: None) == 2
    assert "is the rollout of --limit n4,n2, not --limit n1" in out.getvalue()


def test_the_plan_is_confirmed_before_any_drain_or_change(fake, tmp_path):
    fleet = fake(3, converged={"n2"})
    asked: list[str] = []
    o = opts(tmp_path, fake.deploy, canary=0, waves="100%")  # one wave: without confirmation, no separate plan
    out = io.StringIO()
    assert run.main(o, progress=out, echo=lambda _: None, confirm=lambda plan: asked.append(plan) or False) == 2
    assert fleet.calls == [("dry", ["n1", "n2", "n3"])] and not o.state_path().exists()
    assert "not confirmed: nothing was drained or changed" in out.getvalue()
    assert asked[0].splitlines()[:3] == ["gpufleet rollout: 3 host(s); the plan to confirm",
                                         "already converged (no change planned): n2", "wave 1 (wave): n1, n3"]
    fleet.calls.clear()
    assert run.main(o, progress=io.StringIO(), echo=lambda _: None, confirm=lambda plan: True) == 0
    assert fleet.calls == [("dry", ["n1", "n2", "n3"]), ("run", ["n1", "n3"])]


def test_a_signal_at_the_confirmation_exits_128_plus_it_with_nothing_changed_or_saved(fake, tmp_path, signalled,
                                                                                     monkeypatch):
    import signal

    from gpufleet import interruption

    def interrupted_by(signum):
        def confirm(plan):
            signalled(signum)
            raise interruption.Interrupted(signum)
        return confirm

    fleet = fake(3)
    o = opts(tmp_path, fake.deploy, canary=1, waves="1")
    out = io.StringIO()
    assert run.main(o, progress=out, echo=lambda _: None, confirm=interrupted_by(signal.SIGTERM)) == 143
    assert fleet.calls == [("dry", ["n1", "n2", "n3"])]  # planned, nothing run
    assert not Path(o.out).exists() or not list(Path(o.out).iterdir())  # no state file, no report
    assert "interrupted at the confirmation by SIGTERM: nothing was drained or changed (exit 143)" in out.getvalue()
    # --resume of an interrupted rollout: its state file stays as it was
    monkeypatch.setattr(interruption, "_received", [])
    fleet.interrupt_on = "n2"
    assert run.main(o, progress=io.StringIO(), echo=lambda _: None) == 130
    before = o.state_path().read_bytes()
    o.resume = True
    fleet.calls.clear()
    out = io.StringIO()
    assert run.main(o, progress=out, echo=lambda _: None, confirm=interrupted_by(signal.SIGHUP)) == 129
    assert [c[0] for c in fleet.calls] == ["dry"] and o.state_path().read_bytes() == before
    assert f"{o.state_path()} is as it was" in out.getvalue()


def test_nothing_to_change_is_not_asked(fake, tmp_path):
    fake(2, converged={"n1", "n2"})
    asked = []
    o = opts(tmp_path, fake.deploy)
    assert run.main(o, progress=io.StringIO(), echo=lambda _: None, confirm=asked.append) == 0
    assert asked == []


def test_a_drain_hook_command_line_is_not_kept_in_the_state_file_nor_the_reports(fake, tmp_path, monkeypatch):
    fake(2)
    monkeypatch.setattr(run, "make_drainer", lambda spec, rid: BusyDrainer(set()))
    o = opts(tmp_path, fake.deploy, canary=1, waves="100%", drain="command:/opt/hook --token s3cr3t-t0ken")
    rc, text = go(o)
    assert rc == 0, text
    out = Path(o.out)
    written = {p.name: p.read_text() for p in [o.state_path(), out / "rollout.json", out / "rollout.html"]}
    assert not [name for name, body in written.items() if "s3cr3t" in body or "/opt/hook" in body], written
    assert "command:sha256=" in written["rollout.json"]
