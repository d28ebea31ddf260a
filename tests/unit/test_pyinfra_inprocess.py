"""The rollout's in-process pyinfra (gpufleet._pyinfra.inprocess) on pyinfra's ``@fake`` hosts: a run per pass and wave,
each wave planned again when it runs, one connection per host for the whole session, pyinfra errors as the CLI
prints them, an interrupted wave, and the version guard with its fallback."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyinfra
import pytest
from pyinfra.connectors.fake import FakeConnector

from gpufleet._pyinfra import inprocess
from gpufleet.pyinfra_args import PyinfraArgs
from gpufleet.rollout import converge, run

HOSTS = ("@fake/a", "@fake/b", "@fake/c")
INVENTORY = f"hosts = [(name, {{'fake_delay': 0, 'fake_delay_jitter': 0}}) for name in {HOSTS!r}]\n"
# The value each host gets is read when the deploy is prepared: a wave that runs with the value of its own time was
# planned when it ran, not in the whole-fleet pass.
DEPLOY = """from pathlib import Path
from pyinfra import host
from pyinfra.operations import server
value = Path(__file__).with_name("value.txt").read_text().strip()
server.shell(name="apply value", commands=[f"apply {value} {host.name}"])
"""


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inventory.py").write_text(INVENTORY)
    (tmp_path / "value.txt").write_text("one\n")

    def deploy(text: str = DEPLOY) -> str:
        path = tmp_path / f"deploy{len(list(tmp_path.glob('deploy*.py')))}.py"  # pyinfra caches code per file name
        path.write_text(text)
        return str(path)

    connects: list[str] = []
    original = FakeConnector.connect
    monkeypatch.setattr(FakeConnector, "connect", lambda self: connects.append(self.host.name) or original(self))
    return tmp_path, deploy, connects


def executed(session: inprocess.Session) -> dict[str, list[str]]:
    """What each host's connection ran (the connector of the host in the runs it took part in)."""
    out = {name: [] for name in HOSTS}
    for state, _ in session._runs:
        for host in state.activated_hosts:
            out[host.name] = list(host.connector.executed_commands)
    return out


def test_the_pass_plans_every_host_and_each_wave_is_planned_again_when_it_runs(files):
    tmp_path, deploy, connects = files
    session = inprocess.Session(str(tmp_path / "inventory.py"), deploy())
    try:
        assert session.order() == (list(HOSTS), None)
        plan = session.run(None, plan=True)
        assert (plan.rc, plan.payload["results"]) == (0, None)
        assert converge.planned_changes(plan) == {h: ["apply value"] for h in HOSTS}
        first = session.run(["@fake/a"], plan=False)
        (tmp_path / "value.txt").write_text("two\n")  # changed between the waves
        second = session.run(["@fake/b", "@fake/c"], plan=False)
        assert converge.host_outcomes(first, ["@fake/a"])["@fake/a"].changed
        assert {h: o.changed for h, o in converge.host_outcomes(second, ["@fake/b", "@fake/c"]).items()} \
            == {"@fake/b": True, "@fake/c": True}
        assert second.payload["results"]["operations"][0]["success"] == ["@fake/b", "@fake/c"]
        assert executed(session) == {"@fake/a": ["apply one @fake/a"], "@fake/b": ["apply two @fake/b"],
                                     "@fake/c": ["apply two @fake/c"]}
        assert "--> Beginning operation run..." in second.stderr and "[@fake/b] Success" in second.stderr
    finally:
        session.close()
    assert sorted(connects) == sorted(HOSTS)  # one connection per host: the waves adopted the pass's
    assert pyinfra.is_cli is False  # put back as it was


def test_a_kept_plan_is_executed_wave_by_wave_without_planning_again(files):
    """``--drain none``: the waves execute the whole-fleet pass's plan (the deploy is not prepared again: the value
    read in the pass is the one applied), each wave its own hosts only, over the pass's connections."""
    tmp_path, deploy, connects = files
    session = inprocess.Session(str(tmp_path / "inventory.py"), deploy())
    try:
        plan = session.run(None, plan=True, keep_plan=True)
        assert converge.planned_changes(plan) == {h: ["apply value"] for h in HOSTS}
        first = session.run(["@fake/a"], plan=False)
        (tmp_path / "value.txt").write_text("two\n")  # not seen: the plan was made in the pass
        second = session.run(["@fake/b", "@fake/c"], plan=False)
        assert first.payload["results"] == {
            "operations": [dict(first.payload["results"]["operations"][0], hosts=1, success=["@fake/a"], error=[],
                                no_change=[])],
            "totals": {"hosts": 1, "success": 1, "error": 0, "no_change": 0}, "failed_hosts": []}
        assert second.payload["results"]["operations"][0]["success"] == ["@fake/b", "@fake/c"]
        assert (first.rc, second.rc) == (0, 0)
        assert executed(session) == {"@fake/a": ["apply one @fake/a"], "@fake/b": ["apply one @fake/b"],
                                     "@fake/c": ["apply one @fake/c"]}
        with pytest.raises(ValueError, match="not hosts of the plan: @fake/x"):
            session.run(["@fake/x"], plan=False)
    finally:
        session.close()
    assert sorted(connects) == sorted(HOSTS)


def test_a_pyinfra_error_while_preparing_is_reported_as_the_cli_prints_it_and_nothing_runs(files):
    tmp_path, deploy, _ = files
    bad = deploy(DEPLOY + "from gpufleet.config import InputError\n"
                 "if host.name == '@fake/b':\n"
                 "    raise InputError('preflight failed: 1 error(s)\\n  @fake/b: gpufleet_power_limit=900')\n")
    session = inprocess.Session(str(tmp_path / "inventory.py"), bad)
    try:
        result = session.run(["@fake/a", "@fake/b"], plan=False)
    finally:
        session.close()
    assert (result.rc, result.payload, result.executed()) == (1, None, False)
    assert result.error_text().splitlines() == ["--> pyinfra error: preflight failed: 1 error(s)",
                                                "  @fake/b: gpufleet_power_limit=900"]
    assert executed(session) == {h: [] for h in HOSTS}


def test_an_exception_in_the_deploy_names_the_file(files):
    tmp_path, deploy, _ = files
    bad = deploy("raise ValueError('boom')\n")
    session = inprocess.Session(str(tmp_path / "inventory.py"), bad)
    try:
        result = session.run(None, plan=True)
    finally:
        session.close()
    assert result.payload is None
    assert result.error_text() == f"--> pyinfra error: ValueError: boom (in {bad})"


def test_an_inventory_that_cannot_be_loaded_is_an_inventory_error(files):
    tmp_path, deploy, _ = files
    (tmp_path / "broken.py").write_text("hosts = [\n")
    with pytest.raises(inprocess.InventoryError, match=r"cannot load the inventory .*broken\.py: SyntaxError"):
        inprocess.Session(str(tmp_path / "broken.py"), deploy())
    assert pyinfra.is_cli is False


def test_an_interrupted_wave_names_the_hosts_mid_change_and_sends_nothing_more(files):
    tmp_path, deploy, _ = files
    interrupting = deploy("""from pathlib import Path
import gevent
from pyinfra import host
from pyinfra.operations import python, server
def stage(who):
    if who == "@fake/a":
        raise KeyboardInterrupt  # as SIGINT does: raised in a host's greenlet, handed to the main one by gevent
    gevent.sleep(30)  # @fake/b is in this stage when the interrupt comes (and so is @fake/a, raising it)
    Path(__file__).with_name("finished").touch()
python.call(name="slow stage", function=stage, who=host.name)
server.shell(name="after", commands=["after"])
""")
    session = inprocess.Session(str(tmp_path / "inventory.py"), interrupting)
    try:
        with pytest.raises(KeyboardInterrupt):
            session.run(["@fake/a", "@fake/b"], plan=False)
    finally:
        session.close()
    assert session.interruption.splitlines()[:4] == ["gpufleet: interrupted by SIGINT while executing (exit 130).",
                                                    "Hosts mid-change (stage):", "  @fake/a: slow stage",
                                                    "  @fake/b: slow stage"]
    # @fake/b's stage was stopped where it was and nothing more was sent ("after" never ran anywhere)
    assert not (tmp_path / "finished").exists() and executed(session)["@fake/b"] == []


def test_supported_names_what_is_missing(monkeypatch):
    monkeypatch.delenv(inprocess.SWITCH, raising=False)
    from gevent import monkey
    monkeypatch.setattr(monkey, "is_module_patched", lambda name: True)
    assert inprocess.supported() is None  # the installed pyinfra is one it was tested with
    assert inprocess.supported("3.10.9") is None
    assert inprocess.supported("3.11.0") == "pyinfra 3.11.0 is not a version CI ran (3.10.x)"
    assert inprocess.supported("4.0.1") == "pyinfra 4.0.1 is not a version CI ran (3.10.x)"
    assert inprocess.supported("3.9").startswith("pyinfra 3.9 is not a version")
    from pyinfra_cli import prints
    monkeypatch.delattr(prints, "build_results_json")
    assert inprocess.supported("3.10.0") == "pyinfra 3.10.0 lacks pyinfra_cli.prints.build_results_json"
    monkeypatch.undo()
    monkeypatch.setattr(monkey, "is_module_patched", lambda name: False)
    assert inprocess.supported("3.10.0") == ("the standard library is not patched for gevent (pyinfra's hosts would "
                                             "run one after another)")
    monkeypatch.setenv(inprocess.SWITCH, "off")
    assert inprocess.supported() == "GPUFLEET_ROLLOUT_INPROCESS is off"


def test_where_unsupported_the_rollout_falls_back_to_pyinfra_subprocesses(monkeypatch):
    from gpufleet._pyinfra import _guard

    monkeypatch.delenv(inprocess.SWITCH, raising=False)
    monkeypatch.setattr(_guard, "pyinfra_version", lambda: "3.11.0")  # a version CI did not run
    progress = io.StringIO()
    engine = run.open_engine(run.RolloutOptions(inventory="inv.py"), progress)
    assert isinstance(engine, converge.Subprocess)
    assert progress.getvalue() == ("gpufleet rollout: pyinfra runs as a subprocess per pass and wave (pyinfra 3.11.0 "
                                   "is not a version CI ran (3.10.x))\n")  # one line


def test_a_rollout_in_process_end_to_end(files, monkeypatch):
    tmp_path, deploy, connects = files
    monkeypatch.setattr(inprocess, "supported", lambda: None)
    opts = run.RolloutOptions(inventory=str(tmp_path / "inventory.py"), deploy=deploy(), canary=1, waves="1",
                              verify="none", out=str(tmp_path / "out"))
    lines: list[str] = []
    progress = io.StringIO()
    assert run.main(opts, progress=progress, echo=lines.append) == run.EXIT_DONE, progress.getvalue()
    assert "changed (3): @fake/a, @fake/b, @fake/c" in "\n".join(lines)
    report = json.loads(Path(tmp_path / "out/rollout.json").read_text())
    assert [w["hosts"] for w in report["waves"]] == [["@fake/a"], ["@fake/b"], ["@fake/c"]]
    assert [p["hosts"] for p in report["preflight"]] == [None]  # the whole-fleet pass, once
    assert sorted(connects) == sorted(HOSTS)
    assert pyinfra.is_cli is False


def test_in_process_the_users_limit_data_verbosity_and_a_deploy_function(files, monkeypatch):
    """As ``pyinfra --limit ... --data ... -v INVENTORY package.module.function``: only the hosts --limit selects
    (in the inventory's order) are connected to, --data reaches host.data, the deploy is a function, and -v shows
    pyinfra's log."""
    tmp_path, _, connects = files
    (tmp_path / "site_deploys.py").write_text(
        "from pyinfra import host\nfrom pyinfra.operations import server\n\n\ndef apply():\n"
        "    server.shell(name='apply value', commands=[f\"apply {host.data.get('value')} {host.name}\"])\n")
    monkeypatch.setattr(inprocess, "supported", lambda: None)
    args = PyinfraArgs(limit=("@fake/c,@fake/a",), data=("value=three",), verbosity=1)
    opts = run.RolloutOptions(inventory=str(tmp_path / "inventory.py"), deploy="site_deploys.apply", canary=1,
                              waves="1", verify="none", out=str(tmp_path / "out"), pyinfra=args)
    lines: list[str] = []
    progress = io.StringIO()
    assert run.main(opts, progress=progress, echo=lines.append) == run.EXIT_DONE, progress.getvalue()
    report = json.loads(Path(tmp_path / "out/rollout.json").read_text())
    assert [w["hosts"] for w in report["waves"]] == [["@fake/a"], ["@fake/c"]]
    assert sorted(connects) == ["@fake/a", "@fake/c"]  # @fake/b: not even connected to
    assert "changed (2): @fake/a, @fake/c" in "\n".join(lines)
    assert "--> Beginning operation run..." in progress.getvalue()  # -v: pyinfra's log as it comes
    session = inprocess.Session(str(tmp_path / "inventory.py"), "site_deploys.apply", args=args)
    try:
        plan = session.run(["@fake/a"], plan=True)
        assert converge.planned_changes(plan) == {"@fake/a": ["apply value"]}
        assert session._runs[-1][0].inventory.get_host("@fake/a").data.get("value") == "three"
    finally:
        session.close()
    with pytest.raises(inprocess.InventoryError, match=r"--limit nothing\*: no host or group of .* matches"):
        inprocess.Session(str(tmp_path / "inventory.py"), "site_deploys.apply",
                          args=PyinfraArgs(limit=("nothing*",)))


def test_without_v_pyinfras_log_is_read_not_shown(files, monkeypatch):
    tmp_path, deploy, _ = files
    monkeypatch.setattr(inprocess, "supported", lambda: None)
    opts = run.RolloutOptions(inventory=str(tmp_path / "inventory.py"), deploy=deploy(), canary=0, waves="100%",
                              verify="none", out=str(tmp_path / "out"))
    progress = io.StringIO()
    assert run.main(opts, progress=progress, echo=lambda _: None) == run.EXIT_DONE
    assert "Beginning operation run" not in progress.getvalue()
