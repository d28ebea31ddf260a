"""``gpufleet rollout --jobs N`` (gpufleet.rollout.workers) on pyinfra's ``@fake`` hosts: the same state file
outcomes as one process, for a rollout that finishes, one with a failing host, one with a bad setting (nothing
changed: the whole-fleet pass, and the barrier of a wave planned when it runs) and an interrupted one (exit 130,
the hosts in flight named)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet import apply
from gpufleet._pyinfra import inprocess
from gpufleet.rollout import converge, run

FAST = {"PYINFRA_PROGRESS": "off"}
HOSTS = [f"@fake/hgx{i}" for i in range(3)] + [f"@fake/ws{i}" for i in range(3)]

DEPLOY = '''
import os, time
from pathlib import Path
from pyinfra import host
from pyinfra.api.exceptions import PyinfraError
from pyinfra.operations import python

OUT = Path(os.environ["ROLLOUT_TEST_OUT"])
if host.data.get("bad_setting") or OUT.with_name(f"bad-{host.name.split('/')[-1]}").exists():
    raise PyinfraError(f"invalid configuration, no host was changed: {host.name}: bad_setting")

def change(stage):
    path = OUT / f"{host.name.split('/')[-1]}.{stage}"
    if stage == os.environ.get("ROLLOUT_TEST_HANG"):
        path.write_text(stage)
        time.sleep(60)
    if path.exists():
        return  # converged: nothing to do
    path.write_text(stage)
    if host.data.get("fail_in") == stage:
        raise RuntimeError(f"{stage} failed")

if not (OUT / f"{host.name.split('/')[-1]}.nccl").exists():  # what a host would change, known while planning
    python.call(name="power", function=change, stage="power")
    python.call(name="nccl", function=change, stage="nccl")
'''


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    (tmp_path / "out").mkdir()
    groups = {"hgx": [h for h in HOSTS if "hgx" in h], "ws": [h for h in HOSTS if "ws" in h]}
    (tmp_path / "inventory.py").write_text("".join(f"{g} = {[(h, {}) for h in hosts]!r}\n"
                                                   for g, hosts in groups.items()))
    (tmp_path / "deploy.py").write_text(DEPLOY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(inprocess, "supported", lambda: None)  # one process: the in-process engine, as on CI
    for key, value in {**FAST, "ROLLOUT_TEST_OUT": str(tmp_path / "out")}.items():
        monkeypatch.setenv(key, value)
    return tmp_path


def _set(fleet: Path, host: str, data: str) -> None:
    text = (fleet / "inventory.py").read_text().replace(f"('{host}', {{}})", f"('{host}', {{{data}}})")
    (fleet / "inventory.py").write_text(text)


def _rollout(fleet: Path, jobs: int, *, name: str, drain: str = "none", converged: tuple = (), **options
             ) -> tuple[int, dict | None, str]:
    """A rollout (canary 1, waves of 2, no gate); its exit code, its state file as outcomes per host, progress."""
    for path in (fleet / "out").iterdir():
        path.unlink()
    for host in converged:
        (fleet / "out" / f"{host}.nccl").write_text("converged")
    out = fleet / name
    # absolute paths: pyinfra keeps a file's code by its name for the life of the process (each test has its own)
    options = {"canary": 1, "waves": "2", "verify": "none", **options}
    opts = run.RolloutOptions(inventory=str(fleet / "inventory.py"), deploy=str(fleet / "deploy.py"), drain=drain,
                              out=str(out), jobs=jobs, **options)
    progress = io.StringIO()
    code = run.main(opts, progress=progress, echo=lambda text: progress.write(text + "\n"))
    state = out / "state.json"
    return code, (_outcomes(json.loads(state.read_text())) if state.exists() else None), progress.getvalue()


def _outcomes(state: dict) -> dict:
    return {"status": state["status"], "waves": [w["hosts"] for w in state["waves"]],
            "nodes": {n["name"]: (n["state"], n["changed"], n["wave"], n["reason"])
                      for n in state["nodes"].values()}}


def _changed(fleet: Path) -> list[str]:
    return sorted(p.name for p in (fleet / "out").iterdir())


def test_two_workers_give_one_process_outcomes(fleet):
    one = _rollout(fleet, 1, name="one", converged=("ws2",))  # ws2 needs no change: never in a wave
    two = _rollout(fleet, 2, name="two", converged=("ws2",))
    assert one[0] == two[0] == run.EXIT_DONE, one[2] + two[2]
    assert one[1] == two[1]
    assert two[1]["waves"] == [["@fake/hgx0"], ["@fake/hgx1", "@fake/hgx2"], ["@fake/ws0", "@fake/ws1"]]
    assert two[1]["nodes"]["@fake/ws2"] == ("done", False, None, None)
    assert len(_changed(fleet)) == 11  # 5 hosts x 2 stages, and the converged one's file


def test_a_failing_host_fails_the_same_way_over_workers(fleet):
    _set(fleet, "@fake/hgx2", "'fail_in': 'power'")
    one = _rollout(fleet, 1, name="one", max_failures="1")
    two = _rollout(fleet, 2, name="two", max_failures="1")
    assert (one[0], two[0]) == (run.EXIT_FAILED, run.EXIT_FAILED), one[2] + two[2]
    assert one[1] == two[1]
    state, changed, wave, reason = two[1]["nodes"]["@fake/hgx2"]
    assert (state, changed, wave) == ("failed", None, 2) and reason.startswith("converge: operation failed: power")
    assert [n[0] for n in two[1]["nodes"].values()].count("done") == 5


@pytest.mark.parametrize("drain", ["none", "command:true"])
def test_a_bad_setting_changes_nothing_over_workers(fleet, drain):
    """In the whole-fleet pass (``--drain none``, a bad setting on the last host of the last slice), and with a
    drain: the pass again; nothing drained or changed, exit 2, as one process."""
    _set(fleet, "@fake/ws2", "'bad_setting': 1")
    one = _rollout(fleet, 1, name="one", drain=drain)
    two = _rollout(fleet, 2, name="two", drain=drain)
    assert one[0] == two[0] == run.EXIT_BAD_INPUT
    assert one[1] is two[1] is None  # no state file: nothing started
    assert "@fake/ws2: bad_setting" in one[2] and "@fake/ws2: bad_setting" in two[2]
    assert "nothing was drained or changed" in two[2]
    assert _changed(fleet) == []


def test_a_single_wave_is_prepared_in_every_worker_before_any_executes(fleet):
    """One wave without drain is its own validation (no pass): the barrier holds it, nothing changed."""
    _set(fleet, "@fake/ws2", "'bad_setting': 1")
    for jobs in (1, 2):
        code, state, progress = _rollout(fleet, jobs, name=f"single{jobs}", canary=0, waves="100%")
        assert "its pyinfra run validates and preflights every host before any change" in progress
        assert code == run.EXIT_BAD_INPUT and state is None, progress
        assert "@fake/ws2: bad_setting" in progress
        assert _changed(fleet) == []


def test_a_wave_prepared_when_it_runs_holds_at_the_barrier(fleet, monkeypatch):
    """With a drain every wave plans again when it runs: a host that turns bad after the pass fails its wave's
    preparation; no host of that wave is changed (ws0, in the other worker, neither), as in one process."""
    slices = apply.slice_hosts([(h, [h[6:-1]]) for h in HOSTS], 2)
    assert [("@fake/ws0" in s, "@fake/ws1" in s) for s in slices] == [(False, True), (True, False)]
    converging = run.Controller.phase_converge

    def spoil(self, names):
        if "@fake/ws1" in names:  # the wave of ws0 and ws1, after the pass and its drain
            (fleet / "bad-ws1").touch()
        return converging(self, names)

    monkeypatch.setattr(run.Controller, "phase_converge", spoil)
    outcomes = []
    for jobs in (1, 2):
        (fleet / "bad-ws1").unlink(missing_ok=True)
        code, state, progress = _rollout(fleet, jobs, name=f"run{jobs}", drain="command:true", max_failures="2")
        assert code == run.EXIT_FAILED, progress
        for host in ("@fake/ws0", "@fake/ws1"):
            assert state["nodes"][host][0] == "failed" and "bad_setting" in state["nodes"][host][3]
            assert not list((fleet / "out").glob(f"{host.split('/')[-1]}.*"))
        assert state["nodes"]["@fake/ws2"][0] == "done"  # the next wave went on (--max-failures 2)
        outcomes.append(state)
    assert outcomes[0] == outcomes[1]


def _interrupted(fleet: Path, jobs: int) -> tuple[int, str, dict]:
    for path in (fleet / "out").iterdir():
        path.unlink()
    out = fleet / f"stopped{jobs}"
    environ = {**os.environ, **FAST, "ROLLOUT_TEST_OUT": str(fleet / "out"), "ROLLOUT_TEST_HANG": "nccl"}
    process = subprocess.Popen([sys.executable, "-m", "gpufleet", "rollout", "inventory.py", "deploy.py", "-y",
                                "--canary", "1", "--waves", "2", "--verify", "none", "--out", str(out), "--jobs",
                                str(jobs)], cwd=fleet, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not (fleet / "out" / "hgx0.nccl").exists():  # the canary is in its nccl stage
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
    _, err = process.communicate(timeout=60)
    return process.returncode, err, json.loads((out / "state.json").read_text())


def test_ctrl_c_over_workers_exits_130_naming_the_hosts_in_flight_as_one_process(fleet):
    one, two = _interrupted(fleet, 1), _interrupted(fleet, 2)
    assert one[0] == two[0] == 130, one[1] + two[1]
    for _, err, _ in (one, two):
        assert "Hosts mid-change (stage):\n  @fake/hgx0: nccl" in err, err
        assert "Traceback" not in err
    assert _outcomes(one[2]) == _outcomes(two[2])
    assert two[2]["status"] == "interrupted" and two[2]["interruption"]["mid_change"] == ["@fake/hgx0"]


def test_where_the_in_process_engine_is_off_jobs_runs_the_subprocess_fallback_and_says_so(monkeypatch):
    """The workers run the in-process engine: where it is switched off (or pyinfra is not a version CI ran), the
    rollout runs as without --jobs there, and says so."""
    monkeypatch.setenv(inprocess.SWITCH, "off")
    progress = io.StringIO()
    engine = run.open_engine(run.RolloutOptions(inventory="inv.py", jobs=2), progress)
    assert isinstance(engine, converge.Subprocess)
    assert progress.getvalue() == ("gpufleet rollout: --jobs 2: one process, pyinfra as a subprocess per pass and "
                                   "wave (GPUFLEET_ROLLOUT_INPROCESS is off)\n")
