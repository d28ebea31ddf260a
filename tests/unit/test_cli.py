"""The ``gpufleet`` command line: ``-h`` and the exit codes in every command's help, pyinfra's options on rollout,
drift and verify (parsed as pyinfra parses them and handed to the runs), rollout's confirmation, the default deploy,
shell completion and ``python -m gpufleet``."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from gpufleet import apply, cli, drift, pyinfra_args
from gpufleet.pyinfra_args import PyinfraArgs
from gpufleet.rollout import run as rollout_run
from gpufleet.verify import run as verify_run


def commands(group: click.Group = cli.main, path: tuple[str, ...] = ()):
    """Every command of the tree as (argv path, command), groups included."""
    yield path, group
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


@pytest.fixture
def runner(monkeypatch):
    monkeypatch.setattr(cli, "_patch_for_gevent", lambda: None)  # not in the test process
    return CliRunner()


@pytest.fixture
def captured(monkeypatch):
    """What rollout, drift and verify hand to their library entry (nothing runs)."""
    seen: dict = {}

    def rollout_main(opts, *, echo, confirm=None):
        seen["rollout"] = (opts, confirm)
        return 0

    def drift_main(inventory, deploy, *, as_json, echo, args, jobs):
        seen["drift"] = (inventory, deploy, args)
        seen["drift_jobs"] = jobs
        return 0

    def apply_main(opts, *, echo, confirm=None):
        seen["apply"] = (opts, confirm)
        return 0

    def verify_main(inventory, *, limit, bench, out, echo, via, override_data, jobs):
        seen["verify"] = (inventory, limit, override_data)
        seen["verify_jobs"] = jobs
        return 0

    monkeypatch.setattr(rollout_run, "main", rollout_main)
    monkeypatch.setattr(drift, "main", drift_main)
    monkeypatch.setattr(apply, "main", apply_main)
    monkeypatch.setattr(apply, "catch_signals", lambda: None)
    monkeypatch.setattr(verify_run, "main", verify_main)
    return seen


@pytest.mark.parametrize("path", [p for p, _ in commands()], ids=lambda p: " ".join(p) or "gpufleet")
def test_every_command_takes_dash_h_and_says_its_exit_codes(runner, path):
    short = runner.invoke(cli.main, [*path, "-h"])
    assert short.exit_code == 0, short.output
    assert short.output == runner.invoke(cli.main, [*path, "--help"]).output
    assert "Exit code" in short.output, f"gpufleet {' '.join(path)} -h does not say its exit codes"


def test_rollout_takes_pyinfras_options(runner, captured):
    result = runner.invoke(cli.main, ["rollout", "inv.py", "--limit", "node01,a100", "--limit", "node0*",
                                      "--data", "gpufleet_power_limit=80%", "--data", "ssh_port=2222",
                                      "--user", "ops", "--port", "2200", "--key", "id_ed25519", "-vv", "-y"])
    assert result.exit_code == 0, result.output
    opts, confirm = captured["rollout"]
    assert opts.deploy == "gpufleet.deploys.gpu_node.gpu_node" and confirm is None
    assert opts.pyinfra == PyinfraArgs(limit=("node01,a100", "node0*"), data=("gpufleet_power_limit=80%",
                                       "ssh_port=2222"), verbosity=2, ssh_user="ops", ssh_port=2200,
                                       ssh_key="id_ed25519")
    assert opts.pyinfra.patterns == ["node01", "a100", "node0*"]
    # as pyinfra's CLI: --data values parsed, the SSH options over --data
    assert opts.pyinfra.override_data() == {"gpufleet_power_limit": "80%", "ssh_port": 2200, "ssh_user": "ops",
                                            "ssh_key": "id_ed25519"}
    long = runner.invoke(cli.main, ["rollout", "inv.py", "deploys/gpu_node.py", "--ssh-user", "ops", "--yes"])
    assert long.exit_code == 0, long.output
    assert captured["rollout"][0].pyinfra.ssh_user == "ops" and captured["rollout"][0].deploy == "deploys/gpu_node.py"
    assert captured["rollout"][0].jobs == 1  # one process unless asked
    assert runner.invoke(cli.main, ["rollout", "inv.py", "-y", "--jobs", "4"]).exit_code == 0
    assert captured["rollout"][0].jobs == 4
    assert runner.invoke(cli.main, ["rollout", "inv.py", "-y", "--jobs", "0"]).exit_code == 2


def test_drift_and_verify_take_pyinfras_options(runner, captured):
    result = runner.invoke(cli.main, ["drift", "inv.py", "--limit", "gpu", "--data", "a=1", "--key", "k", "-v"])
    assert result.exit_code == 0, result.output
    assert captured["drift"] == ("inv.py", "gpufleet.deploys.gpu_node.gpu_node",
                                 PyinfraArgs(limit=("gpu",), data=("a=1",), verbosity=1, ssh_key="k"))
    result = runner.invoke(cli.main, ["verify", "inv.py", "--limit", "gpu", "--data", "x=true", "--user", "ops"])
    assert result.exit_code == 0, result.output
    assert captured["verify"] == ("inv.py", ["gpu"], {"x": True, "ssh_user": "ops"})
    assert captured["verify_jobs"] == 1  # one process unless asked
    assert runner.invoke(cli.main, ["verify", "inv.py", "--jobs", "3"]).exit_code == 0
    assert captured["verify_jobs"] == 3
    assert runner.invoke(cli.main, ["verify", "inv.py", "--jobs", "0"]).exit_code == 2


def test_apply_takes_pyinfras_options_and_jobs(runner, captured, monkeypatch):
    result = runner.invoke(cli.main, ["apply", "inv.py", "deploys/gpu_node.py", "-y", "--jobs", "3", "--limit", "gpu",
                                      "--data", "a=1", "--diff", "--json", "-v"])
    assert result.exit_code == 0, result.output
    opts, confirm = captured["apply"]
    assert opts == apply.ApplyOptions(inventory="inv.py", deploy="deploys/gpu_node.py", jobs=3, yes=True, diff=True,
                                      as_json=True, pyinfra=PyinfraArgs(limit=("gpu",), data=("a=1",), verbosity=1))
    assert confirm is None
    monkeypatch.setattr(apply, "default_jobs", lambda: 16)
    assert runner.invoke(cli.main, ["apply", "inv.py", "--dry"]).exit_code == 0
    assert captured["apply"][0].jobs == 16 and captured["apply"][0].dry
    assert runner.invoke(cli.main, ["drift", "inv.py", "--jobs", "4"]).exit_code == 0
    assert captured["drift_jobs"] == 4


def test_apply_of_a_deploy_file_that_does_not_exist_is_a_usage_error(runner, captured):
    result = runner.invoke(cli.main, ["apply", "inv.py", "no/such/deploy.py", "-y"])
    assert result.exit_code == 2 and "deploy no/such/deploy.py: no such file" in result.output
    assert "apply" not in captured


def test_apply_without_y_and_without_a_terminal_refuses_at_once(runner, captured, monkeypatch):
    monkeypatch.setattr(cli, "_interactive", lambda: False)
    result = runner.invoke(cli.main, ["apply", "inv.py"])
    assert result.exit_code == 2 and "give -y" in result.output
    assert "apply" not in captured


@pytest.mark.parametrize("argv, message", [
    (["rollout", "inv.py", "-y", "--data", "novalue"], "expected KEY=VALUE"),
    (["drift", "inv.py", "--data", "=1"], "expected KEY=VALUE"),
    (["rollout", "inv.py", "-y", "--port", "0"], "--port"),
    (["rollout", "inv.py", "-y", "--no-such-flag"], "No such option"),
    (["verify", "inv.py", "-v"], "No such option"),  # verify has no pyinfra log to show
])
def test_bad_options_are_usage_errors(runner, captured, argv, message):
    result = runner.invoke(cli.main, argv)
    assert result.exit_code == 2 and message in result.output, result.output
    assert captured == {}


def test_rollout_without_y_and_without_a_terminal_refuses_at_once(runner, captured, monkeypatch):
    monkeypatch.setattr(cli, "_interactive", lambda: False)
    result = runner.invoke(cli.main, ["rollout", "inv.py"])
    assert result.exit_code == 2
    assert "no terminal to confirm the plan on" in result.output and "give -y" in result.output
    assert captured == {}  # nothing loaded, connected or changed
    dry = runner.invoke(cli.main, ["rollout", "inv.py", "--dry"])  # changes nothing: nothing to confirm
    assert dry.exit_code == 0 and captured["rollout"][1] is None


def test_rollout_without_y_on_a_terminal_asks(runner, captured, monkeypatch):
    monkeypatch.setattr(cli, "_interactive", lambda: True)
    assert runner.invoke(cli.main, ["rollout", "inv.py"]).exit_code == 0
    assert captured["rollout"][1] is cli._confirm


@pytest.mark.parametrize("answer, confirmed", [("", True), ("n", False), (EOFError, False)])
def test_the_confirmation_is_enter_as_in_pyinfra(monkeypatch, capsys, answer, confirmed):
    def fake_input():
        if isinstance(answer, type):
            raise answer
        return answer

    monkeypatch.setattr("builtins.input", fake_input)
    assert cli._confirm("the plan") is confirmed
    out = capsys.readouterr()
    assert out.out.startswith("the plan") and "Press enter to roll out..." in out.err


def test_a_signal_at_the_confirmation_is_not_a_no(monkeypatch, capsys):
    """Ctrl-C, SIGTERM or a closed terminal at the prompt is an interruption (exit 130/143/129 from the rollout),
    not an answer: it propagates (tests/unit/test_rollout_prompt.py sends the real signals)."""
    from gpufleet import interruption

    def interrupted():
        raise interruption.Interrupted(15)

    monkeypatch.setattr("builtins.input", interrupted)
    with pytest.raises(interruption.Interrupted):
        cli._confirm("the plan")


@pytest.mark.parametrize("shell, marker", [("bash", "complete -o nosort -F _gpufleet_completion gpufleet"),
                                           ("zsh", "#compdef gpufleet"),
                                           ("fish", "complete --no-files --command gpufleet")])
def test_completion_prints_clicks_script(runner, shell, marker):
    result = runner.invoke(cli.main, ["completion", shell])
    assert result.exit_code == 0 and marker in result.output and "_GPUFLEET_COMPLETE" in result.output, result.output
    assert runner.invoke(cli.main, ["completion", "tcsh"]).exit_code == 2


def test_python_dash_m_gpufleet_is_the_cli():
    result = subprocess.run([sys.executable, "-m", "gpufleet", "-h"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Usage: python -m gpufleet" in result.stdout and "rollout" in result.stdout


# ------------------------------------------------------------------------------------------------ pyinfra_args


def test_limit_matches_groups_then_globs_in_pattern_order():
    from pyinfra.api import Inventory

    inventory = Inventory((["n1", "n2", "x1"], {}), gpus=(["n1", "x1"], {}))
    hosts, unmatched = pyinfra_args.match_limit(inventory, ["gpus", "n*", "zz"])
    assert [h.name for h in hosts] == ["n1", "x1", "n2"] and unmatched == ["zz"]
    assert pyinfra_args.split_limit(["a, b", "c", ""]) == ["a", "b", "c"]


def test_argv_for_a_pyinfra_process():
    args = PyinfraArgs(limit=("a",), data=("k=v w",), verbosity=3, ssh_user="u", ssh_port=22, ssh_key="key")
    assert args.argv() == ["--data", "k=v w", "-vvv", "--ssh-user", "u", "--ssh-port", "22", "--ssh-key", "key"]
    assert PyinfraArgs().argv() == [] and PyinfraArgs().override_data() == {}


def test_a_deploy_is_a_file_or_a_module_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "site.py").write_text("")
    assert pyinfra_args.check_deploy("site.py") is None
    assert pyinfra_args.check_deploy("gpufleet.deploys.gpu_node.gpu_node") is None
    assert pyinfra_args.check_deploy("gpufleet.deploys.gpu_node:gpu_node") is None
    assert pyinfra_args.check_deploy("missing.py") == "deploy missing.py: no such file"
    assert pyinfra_args.check_deploy("gpu_node").startswith("deploy gpu_node: neither a deploy file")
    assert pyinfra_args.check_deploy("gpufleet.deploys.gpu_node.nothing") == (
        "deploy gpufleet.deploys.gpu_node.nothing: No such attribute in module gpufleet.deploys.gpu_node: nothing")
    assert pyinfra_args.check_deploy("no_such_package.deploy") == (
        "deploy no_such_package.deploy: No such module: no_such_package")
    assert pyinfra_args.check_deploy("gpufleet.pyinfra_args.DEFAULT_DEPLOY") == (
        "deploy gpufleet.pyinfra_args.DEFAULT_DEPLOY: not a function")
