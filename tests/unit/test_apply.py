"""``gpufleet apply`` (gpufleet/apply.py, gpufleet/_pyinfra/workers.py): slicing, merging, and the whole command on
pyinfra ``@fake`` hosts (real worker processes; the operations are ``python.call`` functions, which run in the
worker, and record what they did in a directory: the oracle for "nothing was changed").

The simulated fleet's end-to-end tests are in tests/sim/test_gpu_node.py (``test_apply_*``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet import apply

REPO = Path(__file__).resolve().parents[2]
FAST = {"PYINFRA_FAKE_DELAY": "0", "PYINFRA_FAKE_DELAY_JITTER": "0"}

# ------------------------------------------------------------------------------------------------ slicing


def test_slices_mix_the_groups_and_hold_each_host_once():
    hosts = [(f"hgx{i:02d}", ["hgx_h100", "gpu_nodes"]) for i in range(40)] + \
            [(f"ws{i:02d}", ["workstations", "gpu_nodes"]) for i in range(40)]
    slices = apply.slice_hosts(hosts, 2)
    assert sorted(h for s in slices for h in s) == sorted(name for name, _ in hosts)
    for part in slices:  # contiguous blocks would give one slice every HGX node
        assert sum(h.startswith("hgx") for h in part) == 20
        assert sum(h.startswith("ws") for h in part) == 20


def test_slices_are_the_same_from_any_inventory_order_and_may_be_empty():
    hosts = [("c", ["b"]), ("a", ["a"]), ("b", ["a"])]
    assert apply.slice_hosts(hosts, 2) == apply.slice_hosts(list(reversed(hosts)), 2) == [["a", "c"], ["b"]]
    assert apply.slice_hosts(hosts[:1], 3) == [["c"], [], []]
    with pytest.raises(ValueError, match="jobs"):
        apply.slice_hosts(hosts, 0)


# ------------------------------------------------------------------------------------------------ merging


def _op(key, hosts=0, success=(), error=(), no_change=(), name=None):
    return {"op_hash": key, "name": name or key, "names": [name or key], "args": [], "hosts": hosts,
            "success": list(success), "error": list(error), "no_change": list(no_change)}


def test_results_merge_per_operation_in_each_workers_order():
    one = {"operations": [_op("lock", 2, no_change=["b", "a"]), _op("mig", 1, success=["a"]),
                          _op("nccl", 2, no_change=["a", "b"])],
           "totals": {"hosts": 5, "success": 1, "error": 0, "no_change": 4}, "failed_hosts": []}
    two = {"operations": [_op("lock", 1, no_change=["c"]), _op("nccl", 1, error=["c"])],
           "totals": {"hosts": 2, "success": 0, "error": 1, "no_change": 1}, "failed_hosts": ["c"]}
    merged = apply.merge_results([two, None, one], failed_elsewhere=["d"])
    assert [op["op_hash"] for op in merged["operations"]] == ["lock", "mig", "nccl"]
    assert merged["operations"][0] == _op("lock", 3, no_change=["a", "b", "c"])
    assert merged["operations"][2] == _op("nccl", 3, no_change=["a", "b"], error=["c"])
    assert merged["totals"] == {"hosts": 7, "success": 1, "error": 1, "no_change": 5}
    assert merged["failed_hosts"] == ["c", "d"]


def test_plan_merge_and_an_operation_only_one_worker_has():
    first = [{"op_hash": "x", "name": "x", "names": ["x"], "args": [], "hosts_with_change": ["b"],
              "hosts_with_conditional_change": []}]
    second = [{"op_hash": "w", "name": "w", "names": ["w"], "args": [], "hosts_with_change": ["c"],
               "hosts_with_conditional_change": []},
              {"op_hash": "x", "name": "x", "names": ["x"], "args": [], "hosts_with_change": ["a"],
               "hosts_with_conditional_change": ["c"]}]
    merged = apply.merge_plan([first, second])
    assert [op["op_hash"] for op in merged] == ["w", "x"]
    assert merged[1]["hosts_with_change"] == ["a", "b"] and merged[1]["hosts_with_conditional_change"] == ["c"]


def test_results_table_is_pyinfras():
    results = {"operations": [_op("k", 3, name="GPU power limits", success=["a"], no_change=["b", "c"])],
               "totals": {"hosts": 3, "success": 1, "error": 0, "no_change": 2}, "failed_hosts": []}
    rows = [line.split("    ") for line in apply.results_table(results)]
    assert [[c.strip() for c in row if c.strip()] for row in rows] == [
        ["Operation", "Hosts", "Success", "Error", "No Change"],
        ["GPU power limits", "3", "1", "-", "2"],
        ["Grand total", "3", "1", "-", "2"]]


# ------------------------------------------------------------------------------------------------ the command

DEPLOY = '''
import os, time
from pathlib import Path
from pyinfra import host
from pyinfra.api.exceptions import PyinfraError
from pyinfra.operations import python, server

OUT = Path(os.environ["APPLY_TEST_OUT"])
if host.data.get("bad_setting"):
    time.sleep(float(os.environ.get("APPLY_TEST_SLOW", "0")))  # the other slices are prepared long before
    raise PyinfraError(f"invalid configuration, no host was changed: {host.name}: bad_setting")

def change(stage):
    (OUT / f"{host.name.split('/')[-1]}.{stage}").write_text(stage)
    if host.data.get("fail_in") == stage:
        raise RuntimeError(f"{stage} failed")
    if stage == os.environ.get("APPLY_TEST_HANG"):
        time.sleep(60)

server.shell(name="read", commands=["cat /etc/os-release"])
python.call(name="power", function=change, stage="power")
python.call(name="nccl", function=change, stage="nccl")
'''


@pytest.fixture
def fleet(tmp_path):
    """An inventory of 8 fake hosts in 2 groups, and the deploy above."""
    (tmp_path / "out").mkdir()
    hgx = [f"@fake/hgx{i}" for i in range(4)]
    ws = [f"@fake/ws{i}" for i in range(4)]
    (tmp_path / "inventory.py").write_text(f"hgx = {[(h, {}) for h in hgx]!r}\nws = {[(h, {}) for h in ws]!r}\n")
    (tmp_path / "deploy.py").write_text(DEPLOY)
    return tmp_path


def _gpufleet(cwd: Path, *args: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    environ = {**os.environ, **FAST, "APPLY_TEST_OUT": str(cwd / "out"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "gpufleet", "apply", "inventory.py", "deploy.py", *args], cwd=cwd,
                          env=environ, capture_output=True, text=True, timeout=120, **kwargs)


def _changed(fleet: Path) -> list[str]:
    return sorted(p.name for p in (fleet / "out").iterdir())


def test_apply_gives_pyinfras_results_over_workers(fleet):
    """Same results document as one ``pyinfra -y --json`` process, every host changed once."""
    workers = _gpufleet(fleet, "-y", "--jobs", "3", "--json")
    assert workers.returncode == 0, workers.stderr
    ours = json.loads(workers.stdout)["results"]
    assert len(_changed(fleet)) == 16
    for path in (fleet / "out").iterdir():
        path.unlink()
    single = subprocess.run([str(Path(sys.executable).with_name("pyinfra")), "-y", "--json", "inventory.py",
                             "deploy.py"], cwd=fleet, capture_output=True, text=True, timeout=120,
                            env={**os.environ, **FAST, "APPLY_TEST_OUT": str(fleet / "out")})
    assert single.returncode == 0, single.stderr
    theirs = json.loads(single.stdout)["results"]
    assert ours == theirs
    assert ours["totals"] == {"hosts": 24, "success": 24, "error": 0, "no_change": 0}


def test_a_bad_setting_on_the_last_host_of_the_last_slice_changes_no_host(fleet):
    """The barrier: the last slice's worker fails its validation a while after the others were prepared; no
    worker executes anything."""
    last = apply.slice_hosts([(f"@fake/hgx{i}", ["hgx"]) for i in range(4)]
                             + [(f"@fake/ws{i}", ["ws"]) for i in range(4)], 2)[-1][-1]
    assert last == "@fake/ws3"
    text = (fleet / "inventory.py").read_text().replace("('@fake/ws3', {})", "('@fake/ws3', {'bad_setting': 1})")
    (fleet / "inventory.py").write_text(text)
    result = _gpufleet(fleet, "-y", "--jobs", "2", env={"APPLY_TEST_SLOW": "2"})
    assert result.returncode == 1, result.stderr
    assert "@fake/ws3: bad_setting" in result.stderr
    assert "nothing was changed on any host" in result.stderr
    assert _changed(fleet) == []


def test_a_failed_host_is_exit_1_and_the_others_go_on(fleet):
    text = (fleet / "inventory.py").read_text().replace("('@fake/hgx1', {})", "('@fake/hgx1', {'fail_in': 'power'})")
    (fleet / "inventory.py").write_text(text)
    result = _gpufleet(fleet, "-y", "--jobs", "2")
    assert result.returncode == 1
    assert len(_changed(fleet)) == 15  # hgx1 stopped after its failed power stage, as under pyinfra
    table = result.stdout.splitlines()
    assert table[-1].split() == ["Grand", "total", "24", "22", "2", "-"]  # its nccl: not run, an error to pyinfra
    assert "Failed hosts (1): @fake/hgx1" in result.stderr


def test_dry_and_limit_and_usage(fleet):
    dry = _gpufleet(fleet, "--dry", "--jobs", "2", "--limit", "ws", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["results"] is None
    assert {h for op in plan["plan"] for h in op["hosts_with_change"]} == {f"@fake/ws{i}" for i in range(4)}
    assert _changed(fleet) == []
    unmatched = _gpufleet(fleet, "-y", "--jobs", "2", "--limit", "nosuchhost")
    assert unmatched.returncode == 2 and "--limit nosuchhost" in unmatched.stderr
    no_terminal = _gpufleet(fleet, "--jobs", "2", stdin=subprocess.DEVNULL)
    assert no_terminal.returncode == 2 and "give -y" in no_terminal.stderr
    assert _changed(fleet) == []


def test_ctrl_c_stops_every_worker_exit_130_naming_the_hosts_in_flight(fleet):
    environ = {**os.environ, **FAST, "APPLY_TEST_OUT": str(fleet / "out"), "APPLY_TEST_HANG": "nccl"}
    process = subprocess.Popen([sys.executable, "-m", "gpufleet", "apply", "inventory.py", "deploy.py", "-y",
                                "--jobs", "2"], cwd=fleet, env=environ, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while len(list((fleet / "out").glob("*.nccl"))) < 8:  # every host is in its nccl stage
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "interrupted by SIGINT while executing" in err
    assert "@fake/hgx0: nccl" in err and "@fake/ws3: nccl" in err
    assert "Traceback" not in err


def test_the_progress_view_sums_the_workers_per_stage():
    progress = apply.Progress(jobs=2, slices={0: ["a", "b"], 1: ["c"]}, prepared={0: True, 1: False},
                              counters={0: {"connect": [2, 0], "ops": {"GPU power limits": [2, 1, 0]}},
                                        1: {"connect": [0, 1], "ops": {"GPU power limits": [1, 0, 1]}}})
    assert progress.lines() == ["hosts: 3 in 2/2 slices; connected 2, unreachable 1",
                                "validated and preflighted: 1/2 slices, FAILED: 1",
                                "  GPU power limits: 3 done, 1 changed, 1 failed"]


@pytest.mark.parametrize("answer", [False, True])
def test_without_y_the_merged_changes_are_confirmed_at_the_barrier(fleet, monkeypatch, answer):
    """Not confirmed: every worker stops, nothing changed, exit 0 (as pyinfra); confirmed: every host changed."""
    monkeypatch.chdir(fleet)
    for key, value in {**FAST, "APPLY_TEST_OUT": str(fleet / "out")}.items():
        monkeypatch.setenv(key, value)
    shown = []
    opts = apply.ApplyOptions(inventory="inventory.py", deploy="deploy.py", jobs=2)
    code = apply.main(opts, echo=lambda *a, **k: None, confirm=lambda text: shown.append(text) or answer)
    assert "power: 8 host(s)" in shown[0] and "nccl: 8 host(s)" in shown[0]
    assert code == 0
    assert len(_changed(fleet)) == (16 if answer else 0)


def test_a_worker_that_dies_before_its_result_fails_the_run_and_the_others_stop(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    said = []
    opts = apply.ApplyOptions(inventory="inventory.py", deploy="deploy.py", jobs=2, yes=True)
    code = apply.main(opts, echo=lambda text, **k: said.append(text),
                      worker_command=[sys.executable, "-c", "import sys; sys.exit(3)"])
    assert code == 1
    assert "worker 0 ended without a result (exit 3; its error is above)" in said
    assert "--> nothing was changed on any host" in said


def _drift(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, **FAST, "APPLY_TEST_OUT": str(cwd / "out")}
    return subprocess.run([sys.executable, "-m", "gpufleet", "drift", "inventory.py", "deploy.py", *args], cwd=cwd,
                          env=environ, capture_output=True, text=True, timeout=120)


def test_drift_over_workers_says_what_one_process_says(fleet):
    one, workers = _drift(fleet, "--json", "--limit", "@fake/hgx*,@fake/ws1"), _drift(fleet, "--json", "--jobs", "3",
                                                                          "--limit", "@fake/hgx*,@fake/ws1")
    assert one.returncode == workers.returncode == 1, one.stderr + workers.stderr
    assert json.loads(workers.stdout) == json.loads(one.stdout)
    assert json.loads(one.stdout)["settings"]["power"] == [f"@fake/hgx{i}" for i in range(4)] + ["@fake/ws1"]
    text = (fleet / "inventory.py").read_text().replace("('@fake/ws3', {})", "('@fake/ws3', {'bad_setting': 1})")
    (fleet / "inventory.py").write_text(text)
    bad_one, bad_workers = _drift(fleet), _drift(fleet, "--jobs", "2")
    assert bad_one.returncode == bad_workers.returncode == 2
    assert "@fake/ws3: bad_setting" in bad_one.stdout and "@fake/ws3: bad_setting" in bad_workers.stdout
    assert _changed(fleet) == []


def test_an_inventory_that_loads_differently_in_each_worker_changes_nothing(fleet):
    """Each worker cuts its slice from the inventory as it loads it: one that differs per process is refused."""
    (fleet / "inventory.py").write_text("import os\nhosts = [(f'@fake/h{os.getpid()}-{i}', {}) for i in range(4)]\n")
    result = _gpufleet(fleet, "-y", "--jobs", "2")
    assert result.returncode == 1
    assert "did not load the same way in every worker; nothing was changed" in result.stderr
    assert _changed(fleet) == []
