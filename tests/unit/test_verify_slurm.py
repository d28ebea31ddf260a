"""``gpufleet verify --via slurm`` without a cluster (gpufleet/verify/slurm.py and the Slurm client it shares with
rollout, gpufleet/slurm.py): the sinfo and srun command lines,
Slurm's node states, taking srun's labelled output apart (interleaved tasks, a node missing, garbage, a node cut
short by the time limit), the same checks as over SSH, and the job's task script run here by ``sh`` as Slurm would
run it (stdin: the bundle). The end-to-end run against a real Slurm is tests/sim/test_verify_slurm.py."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from gpufleet import slurm
from gpufleet.config import load_node_config
from gpufleet.verify import bundle as vbundle
from gpufleet.verify import evaluate_host
from gpufleet.verify import slurm as vslurm
from gpufleet.verify.bundle import VerifyError
from gpufleet.verify.expected import expected_state
from tests import upstream

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verify"
PROBE = json.loads((FIXTURES / "probe-rtx4090-1.json").read_text())
PROBE_H100 = json.loads((FIXTURES / "probe-h100-sxm-8.json").read_text())
LSPCI = "0000:01:00.0 0300: 10de:2684 (rev a1)"


def task_lines(node: str, printed: list[str], *, end: bool = True) -> list[str]:
    """What one task's ``sh -c`` prints: markers around the gzip | base64 of its output (76-character lines)."""
    encoded = gzip.compress(("\n".join(printed) + "\n").encode()) if printed else gzip.compress(b"")
    import base64

    b64 = base64.encodebytes(encoded).decode().splitlines()
    return [f"{vslurm.NODE_MARK} begin {node}", *b64, *([f"{vslurm.NODE_MARK} end {node}"] if end else [])]


def probe_output(doc: dict, rc: int = 0) -> list[str]:
    return ["@@gpufleet begin lspci", LSPCI, "@@gpufleet end lspci rc=0", "@@gpufleet begin probe",
            json.dumps(doc), f"@@gpufleet end probe rc={rc}"]


def labelled(tasks: dict[int, list[str]]) -> str:
    """srun --label output of these tasks, interleaved line by line (as srun forwards them)."""
    out = []
    longest = max(len(lines) for lines in tasks.values())
    for i in range(longest):
        for task, lines in tasks.items():
            if i < len(lines):
                out.append(f"{task}: {lines[i]}")
    return "\n".join(out) + "\n"


def split_stdin(stdin: bytes) -> tuple[list[str], bytes]:
    """The probe job's stdin: the exporters' header lines (its end marker left out) and the bundle's tar.gz."""
    end = f"{vslurm.EXPORTERS_END}\n".encode()
    header, found, archive = stdin.partition(end)
    assert found, stdin[:200]
    return header.decode().splitlines(), archive


# ------------------------------------------------------------------------------------------ command lines


def test_srun_command_line_one_task_per_node_bounded_and_named():
    assert slurm.srun_argv(["node02", "node03"], "gpufleet-verify-0a1b2c3d", 120, "SCRIPT") == [
        "srun", "--job-name=gpufleet-verify-0a1b2c3d", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
        "--nodelist=node02,node03", "--time=2:00", "--immediate=30", "--label", "--kill-on-bad-exit=0",
        "--input=all", "sh", "-c", "SCRIPT"]
    assert slurm.time_limit(900) == "15:00" and slurm.time_limit(75) == "1:15"
    # srun(1): --input=all broadcasts srun's stdin to every task (the bundle, the exporters' endpoints); named on the
    # command line, which overrides a SLURM_STDINMODE in the caller's environment
    srun_man = upstream.recorded("slurm/doc/man/man1/srun.1")["statements"]
    assert srun_man["input_all"]["value"].startswith("all: stdin is broadcast to all remote tasks")
    assert "override" in srun_man["command_line_overrides_env"]["value"]


@pytest.mark.parametrize(("via", "prefix"), [
    ("ssh", None), ("slurm", []), ("slurm:ssh root@slurm-ctl", ["ssh", "root@slurm-ctl"])])
def test_via_values(via, prefix):
    assert vslurm.parse_via(via) == prefix


@pytest.mark.parametrize(("via", "message"), [
    ("slurmm", "--via 'slurmm': allowed: ssh, slurm, slurm:PREFIX (e.g. slurm:ssh root@slurm-ctl)"),
    ("slurm:", "--via 'slurm:': slurm: needs a command prefix, e.g. slurm:ssh root@slurm-ctl"),
    ("slurm:ssh 'ctl", "--via \"slurm:ssh 'ctl\": No closing quotation"),
])
def test_bad_via_is_refused_naming_the_value(via, message):
    with pytest.raises(VerifyError) as error:
        vslurm.parse_via(via)
    assert str(error.value) == message


def test_prefixed_commands_run_as_rollouts_drain_does(monkeypatch):
    seen = []
    popen = subprocess.Popen

    def fake_popen(argv, **kwargs):
        seen.append(argv)
        return popen(["true"], **kwargs)

    monkeypatch.setattr(subprocess, "Popen", fake_popen)
    slurm.bounded_runner(["ssh", "root@ctl"])(["sinfo", "-n", "node 1"], None, 5)
    slurm.bounded_runner([])(["sinfo", "-n", "node 1"], None, 5)
    assert seen == [["ssh", "root@ctl", "sinfo -n 'node 1'"], ["sinfo", "-n", "node 1"]]


def test_bounded_runner_returns_what_came_before_its_bound():
    code, out, _err = slurm.bounded_runner([])(["sh", "-c", "echo early; sleep 30"], None, 0.5)
    assert (code, out) == (None, "early\n")


# ------------------------------------------------------------------------------------------ node states


def test_sinfo_states_usable_or_why_not():
    nodes = slurm.parse_sinfo_nodes(
        "node02|idle|none\nnode03|drained|admin: bad DIMM | ticket 42\nnode04|down*|Not responding\n"
        "node05|mixed|none\nnode06|idle*|none\nnode07|draining|gpufleet rollout r1\nnode08|allocated|none\n")
    usable = {name for name, state in nodes.items() if state.usable}
    assert usable == {"node02", "node05"}
    assert nodes["node08"].why() == ("Slurm node state allocated (every CPU is in a job: verify through Slurm does "
                                     "not wait for them)")
    assert nodes["node03"].why() == "Slurm node state drained (reason: admin: bad DIMM | ticket 42)"
    assert nodes["node04"].why() == "Slurm node state down, not responding (reason: Not responding)"
    assert nodes["node06"].why() == "Slurm node state idle, not responding"
    assert nodes["node07"].why() == "Slurm node state draining (reason: gpufleet rollout r1)"


class FakeSlurm:
    """A runner answering sinfo and srun like Slurm; records the command lines and srun's stdin."""

    def __init__(self, sinfo: str, *srun: tuple[int | None, str, str]):
        self.sinfo, self.srun = sinfo, list(srun) or [(0, "", "")]
        self.calls: list[tuple[list[str], bytes | None, float]] = []

    def __call__(self, argv, stdin, timeout):
        self.calls.append((argv, stdin, timeout))
        if argv[0] == "sinfo":
            return 0, self.sinfo, ""
        if argv[0] == "srun":
            return self.srun.pop(0) if len(self.srun) > 1 else self.srun[0]
        return 0, "", ""


def test_nodes_slurm_cannot_run_on_are_left_out_of_the_job_with_slurms_reason():
    out = labelled({0: task_lines("node02", probe_output(PROBE))})
    fake = FakeSlurm("node02|idle|none\nnode03|drained|admin: bad DIMM\n", (0, out, ""))
    engine = vslurm.SlurmVerify(fake, job_name="gpufleet-verify-test")
    results = engine.probe(["node02", "node03", "node09"], vbundle.probe_bundle(), {"node02": "python3"}, "none")
    assert fake.calls[0][0] == ["sinfo", "-h", "-N", "-n", "node02,node03,node09", "-o", "%N|%T|%E"]
    srun, stdin, timeout = fake.calls[1]
    assert srun[:10] == slurm.srun_argv(["node02"], "gpufleet-verify-test", 120, "")[:10]
    assert timeout == 120 + 30 + 60
    header, archive = split_stdin(stdin)
    assert header == [f"{vslurm.EXPORTERS_MARK} * {{}}"]  # no endpoints given: nothing to scrape
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:  # then the bundle
        assert sorted(tar.getnames()) == sorted(vbundle.probe_bundle().names)
    assert results["node02"].probe == PROBE and results["node02"].pci["gpus"][0]["address"] == "0000:01:00.0"
    assert results["node03"].unreachable == "Slurm node state drained (reason: admin: bad DIMM)"
    assert results["node09"].unreachable.startswith("not a node of this Slurm cluster (sinfo does not list it")
    assert len(fake.calls) == 2  # nothing cancelled


def test_no_srun_when_no_node_can_take_the_job():
    fake = FakeSlurm("node03|down*|Not responding\n")
    results = vslurm.SlurmVerify(fake).probe(["node03"], vbundle.probe_bundle(), {"node03": "python3"}, "none")
    assert [c[0][0] for c in fake.calls] == ["sinfo"]
    assert results["node03"].unreachable == "Slurm node state down, not responding (reason: Not responding)"


def test_sinfo_failing_stops_verify_before_any_job():
    def runner(argv, stdin, timeout):
        return 1, "", "sinfo: error: Unable to contact slurm controller (connect failure)"

    with pytest.raises(VerifyError, match="sinfo exited 1: sinfo: error: Unable to contact slurm controller"):
        vslurm.SlurmVerify(runner).probe(["node02"], vbundle.probe_bundle(), {"node02": "python3"}, "none")


def test_a_node_that_fails_the_launch_aborts_the_step_so_the_others_run_again_without_it():
    first = labelled({0: ["@@gpufleet-slurm begin node02"], 1: task_lines("node03", probe_output(PROBE))})
    err = ("srun: error: Task launch for StepId=7.0 failed on node node04: Communication connection failure\n"
           "srun: error: Application launch failed: Communication connection failure\n"
           "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n")
    second = labelled({0: task_lines("node02", probe_output(PROBE))})
    fake = FakeSlurm("node02|idle|none\nnode03|idle|none\nnode04|idle|none\n", (1, first, err), (0, second, ""))
    nodes = ["node02", "node03", "node04"]
    results = vslurm.SlurmVerify(fake).probe(nodes, vbundle.probe_bundle(), dict.fromkeys(nodes, "python3"), "none")
    sruns = [argv for argv, _stdin, _timeout in fake.calls if argv[0] == "srun"]
    assert [a[5] for a in sruns] == ["--nodelist=node02,node03,node04", "--nodelist=node02"]
    # between the two: the aborted job cancelled, and Slurm asked whether node02 takes a job again
    assert [c[0][0] for c in fake.calls] == ["sinfo", "srun", "scancel", "sinfo", "srun"]
    assert fake.calls[3][0][4] == "node02"
    assert results["node02"].probe == PROBE and results["node03"].probe == PROBE
    assert results["node04"].unreachable == ("no output from its Slurm task: srun: error: Task launch for StepId=7.0 "
                                             "failed on node node04: Communication connection failure")


def test_srun_killed_after_its_bound_cancels_the_job_and_keeps_what_finished():
    out = labelled({0: task_lines("node02", probe_output(PROBE)), 1: task_lines("node03", ["started"], end=False)})
    fake = FakeSlurm("node02|idle|none\nnode03|idle|none\nnode04|idle|none\n", (None, out, ""))
    engine = vslurm.SlurmVerify(fake, job_name="gpufleet-verify-x", time_s=60)
    results = engine.probe(["node02", "node03", "node04"], vbundle.probe_bundle(),
                           dict.fromkeys(["node02", "node03", "node04"], "python3"), "none")
    assert fake.calls[-1][0] == ["scancel", "--name=gpufleet-verify-x"]
    assert results["node02"].probe == PROBE
    assert results["node03"].probe_failed == "cut short by the Slurm job's end (time limit 60 s): started"
    assert results["node04"].unreachable == ("no output from its Slurm task before srun was stopped (60 s job limit "
                                             "passed) (srun exit status None)")


# ------------------------------------------------------------------------------------------ the output


def test_interleaved_labelled_output_is_taken_apart_per_node():
    out = labelled({0: task_lines("node02", probe_output(PROBE_H100)), 1: task_lines("node03", probe_output(PROBE)),
                    10: task_lines("node13", probe_output(PROBE))})
    out = out.replace("10: ", " 10: ", 1)  # srun pads labels to the widest task number
    results = vslurm.gather(["node02", "node03", "node13"], 0, out, "", time_s=120)
    assert results["node02"].probe == PROBE_H100
    assert results["node03"].probe == PROBE and results["node13"].probe == PROBE


def test_a_node_missing_from_the_output_is_unreachable_with_sruns_message():
    out = labelled({0: task_lines("node02", probe_output(PROBE))})
    err = ("srun: error: node03: task 1: Exited with exit code 255\n"
           "srun: error: Task launch for StepId=12.0 failed on node node03: Communication connection failure\n")
    results = vslurm.gather(["node02", "node03"], 1, out, err, time_s=120)
    assert results["node02"].probe == PROBE
    assert results["node03"].unreachable == (
        "no output from its Slurm task: srun: error: node03: task 1: Exited with exit code 255 | srun: error: Task "
        "launch for StepId=12.0 failed on node node03: Communication connection failure")


def test_garbage_output_is_a_probe_failure_with_its_last_lines():
    garbage = ["@@gpufleet begin probe", "Traceback (most recent call last):", "ModuleNotFoundError: No module named "
               "'pynvml'", "@@gpufleet end probe rc=1"]
    out = labelled({0: task_lines("node02", garbage), 1: ["@@gpufleet-slurm begin node03", "%%% not base64 %%%",
                                                          "@@gpufleet-slurm end node03"]})
    results = vslurm.gather(["node02", "node03"], 0, out, "", time_s=120)
    assert results["node02"].probe_failed == ("exit status 1: Traceback (most recent call last): | "
                                              "ModuleNotFoundError: No module named 'pynvml'")
    assert results["node03"].probe_failed == "the probe did not run"


def test_a_node_cut_short_by_the_time_limit_is_a_probe_failure():
    printed = ["@@gpufleet begin lspci", LSPCI, "@@gpufleet end lspci rc=0", "@@gpufleet begin probe", "{\"sche"]
    out = labelled({0: task_lines("node02", printed, end=False)})
    results = vslurm.gather(["node02"], 0, out, "srun: error: node02: task 0: Killed\n", time_s=120)
    assert results["node02"].probe_failed == ("cut short by the Slurm job's end (time limit 120 s): "
                                              "@@gpufleet begin probe | {\"sche")


def test_results_get_the_same_checks_as_over_ssh():
    config = load_node_config("node02", {"gpufleet_stages": ["driver", "persistence"]})
    out = labelled({0: task_lines("node02", probe_output(PROBE))})
    result = vslurm.gather(["node02"], 0, out, "", time_s=120)["node02"]
    via_slurm = vslurm.host_result(result, config)
    over_ssh = evaluate_host("node02", PROBE, expected_state(config, PROBE, pci=result.pci))
    assert [c.to_dict() for c in via_slurm.checks] == [c.to_dict() for c in over_ssh.checks]
    unreachable = vslurm.host_result(vslurm.NodeResult("node03", unreachable="Slurm node state drained"), config)
    assert (unreachable.status, unreachable.error) == ("unreachable", "Slurm node state drained")
    assert unreachable.checks[0].remediation == vslurm.REMEDIATION


# ------------------------------------------------------------------------------------------ the task script


SECRET = "s3cr3t-Password_0123456789abcdefghijkl"


def endpoints(url_host: str) -> dict:
    return {"gpu": {"url": f"http://{url_host}:9400/metrics", "user": "gpufleet", "password": SECRET},
            "node": {"url": "http://127.0.0.1:9100/metrics", "user": "gpufleet", "password": SECRET}}


# A fake probe.py: what it was given (arguments, the endpoints line on its stdin) and whether the password is in its
# environment or any process's command line it can see (ps)
FAKE_PROBE = f"""import json, os, subprocess, sys
stdin = sys.stdin.readline() if "--exporters-stdin" in sys.argv else None
ps = subprocess.run(["ps", "-eww", "-o", "args="], capture_output=True, text=True).stdout
print(json.dumps({{"schema": "gpufleet.probe", "cwd": os.getcwd(), "argv": sys.argv[1:], "stdin": stdin,
                  "rest": sys.stdin.read(), "in_env": any({SECRET!r} in v for v in os.environ.values()),
                  "in_ps": {SECRET!r} in ps, "files": sorted(os.listdir("."))}}))
"""


def run_task(tmp_path: Path, node: str, stdin: bytes) -> vslurm.NodeResult:
    """The job's command, run here by sh as srun runs it on a node (``stdin``: srun's, broadcast)."""
    probe = tmp_path / "probe.py"
    probe.write_text(FAKE_PROBE)
    fake = vbundle.ProbeBundle(files=(vbundle.BundleFile("probe.py", str(probe), "0" * 64),))
    script = vslurm.task_script(fake, {"node02": "python3", "node03": "python3"}, "none")
    assert SECRET not in script
    env = dict(os.environ, SLURMD_NODENAME=node, TMPDIR=str(tmp_path))
    proc = subprocess.run(["sh", "-c", script], input=stdin + vslurm.bundle_archive(fake), capture_output=True,
                          env=env, timeout=30, check=True)
    return vslurm.gather([node], 0, labelled({0: proc.stdout.decode().splitlines()}), "", time_s=120)[node]


def test_task_script_unpacks_the_bundle_from_stdin_runs_the_probe_and_leaves_nothing(tmp_path):
    result = run_task(tmp_path, "node02", vslurm.exporters_header({"node02": None}))
    assert result.probe["schema"] == "gpufleet.probe"
    assert result.probe["cwd"].startswith(str(tmp_path / "gpufleet-probe."))
    assert result.probe["files"] == ["probe.py"]  # the bundle unpacked whole, after the header
    assert (result.probe["argv"], result.probe["stdin"]) == (["--bench", "none", "--exporters-stdin"], "{}\n")
    assert not list(tmp_path.glob("gpufleet-probe.*"))  # removed after the run


def test_exporters_header_one_line_for_most_nodes_and_one_per_other_node():
    header = vslurm.exporters_header({"node02": endpoints("10.0.0.2"), "node03": endpoints("10.0.0.3"),
                                      "node04": endpoints("10.0.0.2"), "node05": None})
    lines = header.decode().splitlines()
    assert [line.split(" ", 3)[:3] for line in lines[:-1]] == [
        [vslurm.NODE_MARK, "exporters", "*"], [vslurm.NODE_MARK, "exporters", "node03"],
        [vslurm.NODE_MARK, "exporters", "node05"]]
    assert json.loads(lines[0].split(" ", 3)[3]) == endpoints("10.0.0.2")
    assert json.loads(lines[1].split(" ", 3)[3]) == endpoints("10.0.0.3")
    assert lines[2].endswith(" {}") and lines[-1] == vslurm.EXPORTERS_END


@pytest.mark.parametrize(("node", "want"), [("node02", endpoints("10.0.0.2")), ("node03", endpoints("10.0.0.3")),
                                            ("node05", {})])
def test_each_task_gives_its_probe_its_own_nodes_endpoints_on_stdin_only(tmp_path, node, want):
    """The password reaches the probe through its stdin only: not the task's command, the probe's arguments or
    environment, or any command line (ps), and no file beside the probe."""
    header = vslurm.exporters_header({"node02": endpoints("10.0.0.2"), "node03": endpoints("10.0.0.3"),
                                      "node04": endpoints("10.0.0.2"), "node05": None})
    probe = run_task(tmp_path, node, header).probe
    assert json.loads(probe["stdin"]) == want and probe["rest"] == ""
    assert probe["argv"] == ["--bench", "none", "--exporters-stdin"]
    assert (probe["in_env"], probe["in_ps"], probe["files"]) == (False, False, ["probe.py"])


def test_task_script_chooses_each_nodes_python():
    assignment = vslurm.python_assignment({"node02": "python3", "node03": "/opt/py/bin/python3", "node04": "python3"})
    assert assignment == 'case "$SLURMD_NODENAME" in node03) py=/opt/py/bin/python3;; *) py=python3;; esac'
    for node, want in (("node03", "/opt/py/bin/python3"), ("node04", "python3")):
        out = subprocess.run(["sh", "-c", assignment + '; echo "$py"'], capture_output=True, text=True,
                             env=dict(os.environ, SLURMD_NODENAME=node), check=True).stdout.strip()
        assert out == want


# ------------------------------------------------------------------------------------------ the fleet run


INVENTORY = """gpu_nodes = [("node02", {"gpufleet_stages": ["driver", "persistence"]}),
             ("node03", {"gpufleet_stages": ["driver"], "gpufleet_verify_textfile_dir": False}),
             ("node04", {"gpufleet_stages": ["driver"]})]
"""


def test_fleet_run_via_slurm_writes_the_same_reports_and_node_textfiles(tmp_path, monkeypatch):
    (tmp_path / "inventory.py").write_text(INVENTORY)
    probe = labelled({0: task_lines("node02", probe_output(PROBE)), 1: task_lines("node03", probe_output(PROBE))})
    textfiles = labelled({0: task_lines("node02", ["ok"])})
    fake = FakeSlurm("node02|idle|none\nnode03|mixed|none\nnode04|drained|admin\n", (0, probe, ""), (0, textfiles, ""))
    from gpufleet.verify import run as vrun

    monkeypatch.setattr(vrun, "bounded_runner", lambda prefix: fake)

    progress = io.StringIO()
    run = vrun.run_verify(str(tmp_path / "inventory.py"), out=tmp_path / "out", via="slurm", progress=progress,
                          cwd=str(tmp_path))
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [(h["host"], h["status"]) for h in report["hosts"]] == [
        ("node02", "ok"), ("node03", "ok"), ("node04", "unreachable")]
    assert report["meta"]["via"] == "slurm" and report["meta"]["slurm_job"] == run.fleet.meta["slurm_job"]
    assert run.exit_code == 1  # node04 is unreachable
    sruns = [argv for argv, _stdin, _timeout in fake.calls if argv[0] == "srun"]
    assert [a[5] for a in sruns] == ["--nodelist=node02,node03", "--nodelist=node02"]  # node03: no textfile dir
    with tarfile.open(fileobj=io.BytesIO(fake.calls[-1][1]), mode="r:gz") as tar:
        assert tar.extractfile("node02.prom").read().decode() == (tmp_path / "out/prometheus/node02.prom").read_text()
        assert tar.extractfile("node02.dir").read().decode() == "/var/lib/prometheus/node-exporter"
    assert {r.name: r.textfile for r in run.hosts} == {
        "node02": "/var/lib/prometheus/node-exporter/gpufleet_verify.prom", "node03": None, "node04": None}
    assert "[3/3] node04  UNREACHABLE  Slurm node state drained (reason: admin)" in progress.getvalue()


def test_bad_via_stops_verify_with_exit_code_2_before_anything(tmp_path):
    from gpufleet.verify import run as vrun

    progress = io.StringIO()
    assert vrun.main(str(tmp_path / "missing.py"), via="slurmm", progress=progress) == 2
    assert progress.getvalue() == ("gpufleet verify: --via 'slurmm': allowed: ssh, slurm, slurm:PREFIX (e.g. "
                                   "slurm:ssh root@slurm-ctl)\n")


def test_fleet_run_via_slurm_sends_the_exporters_credentials_on_the_jobs_stdin_only(tmp_path, monkeypatch):
    """What verify gives the Slurm job: each node's endpoints (the exporters stage's listen addresses, the
    ``exporters`` account's password) on srun's stdin, before the bundle; the password on no command line (srun's,
    sinfo's, the task's script) and not in the environment srun is started with (it exports it to the job)."""
    from gpufleet import web_auth
    from gpufleet.verify import run as vrun

    monkeypatch.setenv("GPUFLEET_CREDENTIALS_DIR", str(tmp_path / "credentials"))
    (tmp_path / "inventory.py").write_text(
        'gpu_nodes = [("node02", {"ssh_hostname": "10.0.0.2", "gpufleet_stages": ["exporters"]}),\n'
        '             ("node03", {"ssh_hostname": "10.0.0.3", "gpufleet_stages": ["driver"],\n'
        '                         "gpufleet_verify_textfile_dir": False})]\n')
    probe = labelled({0: task_lines("node02", probe_output(PROBE)), 1: task_lines("node03", probe_output(PROBE))})
    fake = FakeSlurm("node02|idle|none\nnode03|idle|none\n", (0, probe, ""), (0, "", ""))
    environments = []
    monkeypatch.setattr(vrun, "bounded_runner", lambda prefix: (lambda *a: environments.append(dict(os.environ))
                                                                 or fake(*a)))
    vrun.run_verify(str(tmp_path / "inventory.py"), out=tmp_path / "out", via="slurm", progress=io.StringIO(),
                    cwd=str(tmp_path))
    secret = web_auth.password("exporters")
    srun, stdin, _timeout = next(c for c in fake.calls if c[0][0] == "srun")
    header, archive = split_stdin(stdin)
    lines = dict(line[len(vslurm.EXPORTERS_MARK) + 1:].split(" ", 1) for line in header)
    sent = {node: json.loads(lines.get(node, lines["*"])) for node in ("node02", "node03")}
    assert sent == {"node02": {"gpu": {"url": "http://10.0.0.2:9400/metrics", "user": "gpufleet", "password": secret},
                               "node": {"url": "http://10.0.0.2:9100/metrics", "user": "gpufleet", "password": secret}},
                    "node03": {}}  # its exporters stage is off
    assert tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz").getnames()
    assert [argv for argv, _stdin, _timeout in fake.calls if any(secret in word for word in argv)] == []
    assert [env for env in environments if any(secret in value for value in env.values())] == []
