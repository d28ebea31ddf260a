"""The fleet runner (gpufleet/verify/run.py) without hosts: verify settings, the probe bundle, the one remote command
(run here with bash against a temporary "remote" directory through a local stand-in for a pyinfra host), upload of
changed files only, the node textfile, inventory loading and --limit, unreachable hosts, the summary, the CLI, and
the real-GPU check script (syntax and shellcheck)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from pyinfra.api import Config, Inventory, State

from gpufleet.cli import main as cli_main
from gpufleet.config import ConfigErrors, InputError, load_node_config
from gpufleet.probe import PROBE_FILES
from gpufleet.verify import (
    EXIT_COULD_NOT_RUN,
    ExpectedState,
    build_fleet_result,
    evaluate_host,
    probe_failed_host,
    pyinfra_entry,
    unreachable_host,
)
from gpufleet.verify import run as vrun

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "verify"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


# ------------------------------------------------------------------------------------------ settings


def test_verify_settings_defaults_and_values():
    settings, errors = vrun.load_verify_settings("gpu01", {"ssh_user": "root", "gpufleet_driver_branch": "570"})
    assert errors == [] and settings == vrun.VerifySettings()
    assert settings.textfile_dir == "/var/lib/prometheus/node-exporter" and settings.python == "python3"
    settings, errors = vrun.load_verify_settings("gpu01", {
        "gpufleet_verify_textfile_dir": "/srv/textfiles/", "gpufleet_verify_python": "/usr/bin/python3.11",
        "gpufleet_verify_out": "reports", "gpufleet_verify_bench": "quick"})
    assert errors == []
    assert settings == vrun.VerifySettings(textfile_dir="/srv/textfiles", python="/usr/bin/python3.11", out="reports",
                                           bench="quick")
    settings, _ = vrun.load_verify_settings("gpu01", {"gpufleet_verify_textfile_dir": False})
    assert settings.textfile_dir is None


@pytest.mark.parametrize(("key", "value", "text"), [
    ("gpufleet_verify_textfil_dir", "/x", "gpu01: gpufleet_verify_textfil_dir='/x': unknown gpufleet verify setting; "
                                          "allowed: one of gpufleet_verify_textfile_dir"),
    ("gpufleet_verify_textfile_dir", "textfiles", "gpu01: gpufleet_verify_textfile_dir='textfiles': not an absolute "
                                                  "directory path; allowed: an absolute directory path"),
    ("gpufleet_verify_textfile_dir", "/var/../etc", "not an absolute directory path"),
    ("gpufleet_verify_textfile_dir", True, "not an absolute directory path"),
    ("gpufleet_verify_python", "python3; rm -rf /", "gpu01: gpufleet_verify_python='python3; rm -rf /': not a "
                                                    "command"),
    ("gpufleet_verify_bench", "quik", "gpu01: gpufleet_verify_bench='quik': unknown bench profile; allowed: none, "
                                      "quick, full (did you mean 'quick'?)"),
])
def test_verify_settings_are_strict(key, value, text):
    settings, errors = vrun.load_verify_settings("gpu01", {key: value})
    assert settings is None
    assert len(errors) == 1 and text in str(errors[0])
    assert errors[0].host == "gpu01" and errors[0].key == key


def test_unknown_verify_key_suggests_the_right_one():
    _, errors = vrun.load_verify_settings("gpu01", {"gpufleet_verify_textfile_dri": "/x"})
    assert "(did you mean 'gpufleet_verify_textfile_dir'?)" in str(errors[0])


def test_all_hosts_errors_in_one_exception():
    with pytest.raises(ConfigErrors) as info:
        vrun.validate_verify_inventory([("a", {"gpufleet_verify_bench": "x"}), ("b", {}),
                                        ("c", {"gpufleet_verify_python": ""})])
    assert [e.host for e in info.value.errors] == ["a", "c"]
    assert "2 configuration error(s) on 2 host(s) (a, c)" in str(info.value)


def test_verify_namespace_is_registered_with_the_node_config():
    config = load_node_config("gpu01", {"gpufleet_verify_textfile_dir": "/srv/x", "gpufleet_verify_bench": "quick"})
    assert config.host == "gpu01"  # the gpufleet_verify_ keys are verify's, not unknown gpufleet settings


# ------------------------------------------------------------------------------------------ bundle + command


def test_probe_bundle_ships_the_probe_and_the_control_machines_pynvml():
    bundle = vrun.probe_bundle()
    assert bundle.names == (*PROBE_FILES, "pynvml.py")
    pynvml = next(f for f in bundle.files if f.name == "pynvml.py")
    import pynvml as module

    assert pynvml.path == module.__file__
    for f in bundle.files:
        assert f.sha256 == hashlib.sha256(Path(f.path).read_bytes()).hexdigest()
    assert bundle.nvml_py_version
    assert bundle.changed({f.name: f.sha256 for f in bundle.files}) == []
    assert [f.name for f in bundle.changed({"probe.py": "0" * 64})] == list(bundle.names)


def test_probe_command_quotes_and_refuses_unknown_profiles():
    assert vrun.probe_command("python3", "quick", "/opt/my probe") == \
        "cd '/opt/my probe' && python3 probe.py --bench quick"
    with pytest.raises(ValueError, match="allowed: none, quick, full"):
        vrun.probe_command("python3", "fast")


class LocalHost:
    """A stand-in for a connected pyinfra host: commands run here with bash, files are copied here."""

    def __init__(self, name: str = "local"):
        self.name = name
        self.commands: list[str] = []
        self.puts: list[str] = []

    def run_shell_command(self, command, **kwargs):
        text = command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)
        self.commands.append(text)
        proc = subprocess.run(["bash", "-c", text], capture_output=True, text=True, timeout=60)
        out = SimpleNamespace(stdout_lines=proc.stdout.splitlines(), stderr_lines=proc.stderr.splitlines())
        return proc.returncode == 0, out

    def put_file(self, src, dest, **kwargs):
        self.puts.append(dest)
        data = src.read() if hasattr(src, "read") else Path(src).read_bytes()
        Path(dest).write_bytes(data)
        return True


def test_first_run_installs_the_probe_later_runs_upload_nothing(tmp_path):
    remote = tmp_path / "opt-gpufleet-probe"
    host = LocalHost()
    bundle = vrun.probe_bundle()
    doc, pci, uploaded = vrun.run_probe(host, bundle, python=sys.executable, bench="none", kwargs={},
                                        remote_dir=str(remote))
    assert uploaded == list(bundle.names)
    assert sorted(p.name for p in remote.iterdir() if p.suffix == ".py") == sorted(bundle.names)
    assert len(host.commands) == 2  # the combined command, then the probe after the upload
    assert doc["schema"] == "gpufleet.probe" and doc["schema_version"] == 1
    assert pci is not None and "nvswitch_present" in pci  # the PCI section ran in the same command
    # This machine has no NVIDIA driver: the probe says so instead of failing.
    assert doc["nvml_error"] in ("library_not_found", "driver_not_loaded")

    host = LocalHost()
    doc, _, uploaded = vrun.run_probe(host, bundle, python=sys.executable, bench="none", kwargs={},
                                      remote_dir=str(remote))
    assert uploaded == [] and len(host.commands) == 1 and host.puts == []

    (remote / "probe.py").write_text((remote / "probe.py").read_text() + "\n# changed on the node\n")
    (remote / "pynvml.py").unlink()
    host = LocalHost()
    _, _, uploaded = vrun.run_probe(host, bundle, python=sys.executable, bench="none", kwargs={},
                                    remote_dir=str(remote))
    assert uploaded == ["probe.py", "pynvml.py"]


def test_a_node_without_python_is_a_probe_failure(tmp_path):
    host = LocalHost()
    with pytest.raises(vrun.ProbeFailed, match=r"exit status 127: .*no-such-python3.*not found"):
        vrun.run_probe(host, vrun.probe_bundle(), python="no-such-python3", bench="none", kwargs={},
                       remote_dir=str(tmp_path / "probe"))


def test_parse_script_output_sections():
    lines = ["@@gpufleet begin lspci", "0000:05:00.0 0680: 10de:22a3 (rev a1)",
             "0000:18:00.0 0302: 10de:2330 (rev a1)", "@@gpufleet end lspci rc=0",
             "@@gpufleet begin sums", "a" * 64 + "  probe.py", "b" * 64 + " *pynvml.py", "garbage line",
             "@@gpufleet end sums rc=0"]
    out = vrun.parse_script_output(lines)
    assert out.probe_lines is None
    assert out.remote_sums == {"probe.py": "a" * 64, "pynvml.py": "b" * 64}
    assert out.pci["nvswitch_present"] is True and len(out.pci["gpus"]) == 1
    lines = ["@@gpufleet begin sysfs", "@@gpufleet end sysfs rc=0", "@@gpufleet begin probe", "warning: x",
             '{"schema": "gpufleet.probe", "schema_version": 1}', "@@gpufleet end probe rc=0"]
    out = vrun.parse_script_output(lines)
    assert out.probe_rc == 0 and out.pci["source"] == "sysfs" and out.pci["gpus"] == []
    assert vrun.probe_document(out.probe_lines, out.probe_rc)["schema"] == "gpufleet.probe"


def test_probe_document_failures_say_why():
    with pytest.raises(vrun.ProbeFailed, match="the probe did not run"):
        vrun.probe_document(None, None)
    with pytest.raises(vrun.ProbeFailed, match=r"exit status 1: .*ModuleNotFoundError: No module named 'x'"):
        vrun.probe_document(["Traceback (most recent call last):", "ModuleNotFoundError: No module named 'x'"], 1)
    with pytest.raises(vrun.ProbeFailed, match="cut short: no output"):
        vrun.probe_document([], None)


def test_node_textfile_is_written_atomically(tmp_path):
    host = LocalHost()
    staging = tmp_path / "probe"
    staging.mkdir()
    target = tmp_path / "var/lib/node_exporter/textfile_collector"
    vrun.write_node_textfile(host, 'gpufleet_verify_host_up{host="a"} 1\n', str(target), {},
                             staging_dir=str(staging))
    final = target / vrun.TEXTFILE_NAME
    assert final.read_text() == 'gpufleet_verify_host_up{host="a"} 1\n'
    assert stat.S_IMODE(final.stat().st_mode) == 0o644
    assert sorted(p.name for p in target.iterdir()) == [vrun.TEXTFILE_NAME]  # no temporary file left
    assert list(staging.iterdir()) == []
    assert "mv -f" in host.commands[-1] and f".{vrun.TEXTFILE_NAME}.tmp" in host.commands[-1]


def test_node_textfile_error_is_raised(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    staging = tmp_path / "probe"
    staging.mkdir()
    with pytest.raises(OSError, match="could not write"):
        vrun.write_node_textfile(LocalHost(), "x 1\n", str(blocker / "sub"), {}, staging_dir=str(staging))


# ------------------------------------------------------------------------------------------ inventory


def write_inventory(tmp_path: Path, text: str, group_data: dict[str, str] | None = None) -> Path:
    path = tmp_path / "inventory.py"
    path.write_text(text)
    if group_data:
        (tmp_path / "group_data").mkdir()
        for name, body in group_data.items():
            (tmp_path / "group_data" / f"{name}.py").write_text(body)
    return path


def test_load_inventory_with_group_data_and_limit(tmp_path):
    inv = write_inventory(tmp_path, 'hgx = ["h1", "h2"]\nws = [("w1", {"ssh_port": 2222})]\n',
                          {"hgx": 'gpufleet_power_limit = "80%"\n', "all": 'gpufleet_driver_branch = "570"\n'})
    state, hosts = vrun.load_inventory(str(inv), cwd=str(tmp_path))
    assert [h.name for h in hosts] == ["h1", "h2", "w1"]
    h1 = state.inventory.get_host("h1")
    assert h1.data.gpufleet_power_limit == "80%" and h1.data.gpufleet_driver_branch == "570"
    assert state.inventory.get_host("w1").data.ssh_port == 2222
    _, hosts = vrun.load_inventory(str(inv), ["ws,h2"], cwd=str(tmp_path))
    assert sorted(h.name for h in hosts) == ["h2", "w1"]
    _, hosts = vrun.load_inventory(str(inv), "h*", cwd=str(tmp_path))
    assert sorted(h.name for h in hosts) == ["h1", "h2"]
    with pytest.raises(vrun.VerifyError, match="--limit nope: no host or group of .* matches; hosts: h1, h2, w1"):
        vrun.load_inventory(str(inv), ["nope"], cwd=str(tmp_path))


def test_bad_inventories_cannot_run(tmp_path):
    with pytest.raises(vrun.VerifyError, match="missing.py: no such file"):
        vrun.load_inventory(str(tmp_path / "missing.py"), cwd=str(tmp_path))
    inv = write_inventory(tmp_path, "hosts = [\n")
    with pytest.raises(vrun.VerifyError, match="could not be loaded: .*SyntaxError"):
        vrun.load_inventory(str(inv), cwd=str(tmp_path))
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "gpus.py").write_text("gpufleet_power_limit = undefined_name\n")
    inv = tmp_path / "gpus.py"
    inv.write_text('gpus = ["a"]\n')
    with pytest.raises(vrun.VerifyError, match=r"could not be loaded: NameError: name 'undefined_name' is not "
                                               r"defined \(in .*group_data/gpus.py\)"):
        vrun.load_inventory(str(inv), cwd=str(tmp_path))
    (tmp_path / "group_data" / "gpus.py").unlink()
    inv = tmp_path / "empty.py"  # pyinfra caches compiled inventory files by name
    inv.write_text("nothing = 1\n")
    with pytest.raises(vrun.VerifyError, match="has no hosts"):
        vrun.load_inventory(str(inv), cwd=str(tmp_path))


def test_split_and_match_limit():
    assert vrun.split_limit(None) == []
    assert vrun.split_limit(["a, b", "c", ""]) == ["a", "b", "c"]
    inventory = Inventory((["n1", "n2", "x1"], {}), gpus=(["n1", "x1"], {}))
    hosts, unmatched = vrun.match_limit(inventory, ["gpus", "n*", "zz"])
    assert [h.name for h in hosts] == ["n1", "x1", "n2"] and unmatched == ["zz"]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_hosts_are_reported_and_nothing_reachable_cannot_run(tmp_path):
    port = closed_port()
    inv = write_inventory(tmp_path, f'gpu_nodes = [("gpu-a", {{"ssh_hostname": "127.0.0.1", "ssh_port": {port}}}),'
                                    f' ("gpu-b", {{"ssh_hostname": "127.0.0.1", "ssh_port": {port}}})]\n'
                                    'monitoring = [("mon", {"gpufleet_stages": []})]\n')
    progress = io.StringIO()
    out = tmp_path / "out"
    run = vrun.run_verify(str(inv), out=out, progress=progress, cwd=str(tmp_path))
    assert [h.host for h in run.fleet.hosts] == ["gpu-a", "gpu-b"]  # mon: not a GPU node
    assert run.skipped == {"mon": "no gpufleet stages (gpufleet_stages is empty): not a GPU node"}
    assert all(h.status == "unreachable" and "Could not connect" in h.error for h in run.fleet.hosts)
    assert run.exit_code == EXIT_COULD_NOT_RUN
    assert json.loads((out / "report.json").read_text())["summary"]["hosts_unreachable"] == 2
    lines = progress.getvalue().splitlines()
    assert lines[0] == "gpufleet verify: 2 host(s), bench none"
    assert sorted(line.split()[1] for line in lines[1:3]) == ["gpu-a", "gpu-b"]
    assert all("UNREACHABLE" in line for line in lines[1:3])
    text = vrun.summary_text(run, out)
    assert "gpu-a  host.reachable: unreachable: Could not connect" in text
    assert f"report: {(out / 'report.html').resolve()}" in text
    assert "not verified: mon (no gpufleet stages" in text


def test_bad_configuration_is_refused_before_any_host_is_contacted(tmp_path):
    inv = write_inventory(tmp_path, 'gpu_nodes = [("gpu-a", {"gpufleet_power_limt": 300, "ssh_hostname": '
                                    '"192.0.2.1"}), ("gpu-b", {"gpufleet_verify_bench": "fast"})]\n')
    progress = io.StringIO()
    code = vrun.main(str(inv), out=tmp_path / "out", progress=progress, echo=lambda *_: None)
    assert code == EXIT_COULD_NOT_RUN
    text = progress.getvalue()
    assert "invalid configuration, no host was contacted" in text
    assert "gpu-a: gpufleet_power_limt=300: unknown gpufleet setting" in text
    assert not (tmp_path / "out").exists()


def test_only_non_gpu_hosts_cannot_run(tmp_path):
    inv = write_inventory(tmp_path, 'monitoring = [("mon", {"gpufleet_stages": []})]\n')
    with pytest.raises(vrun.VerifyError, match="no GPU node to verify among mon"):
        vrun.run_verify(str(inv), out=tmp_path / "out", progress=io.StringIO(), cwd=str(tmp_path))


# ------------------------------------------------------------------------------------------ summary / CLI


def fleet_run(tmp_path: Path) -> vrun.VerifyRun:
    hosts = [evaluate_host("gpu-h100-01", fixture("probe-h100-sxm-8.json"), ExpectedState(driver_branch="570")),
             evaluate_host("gpu-h100-02", fixture("probe-h100-sxm-8-faults.json"),
                           ExpectedState(driver_branch="570", power_limit_w_all=700)),
             probe_failed_host("gpu-h100-03", "exit status 127: python3: not found"),
             unreachable_host("gpu-h100-04", "Could not connect (timed out)")]
    fleet = build_fleet_result(hosts, bench_profile="quick")
    runs = [vrun.HostRun(name=h.host, result=h, seconds=0.4, uploaded=["probe.py"] if i == 0 else [])
            for i, h in enumerate(hosts)]
    return vrun.VerifyRun(fleet=fleet, hosts=runs, paths={"html": tmp_path / "report.html"}, skipped={}, seconds=2.5)


def test_summary_lists_counts_failures_with_host_gpu_and_hint(tmp_path):
    text = vrun.summary_text(fleet_run(tmp_path), tmp_path)
    lines = text.splitlines()
    assert lines[0] == "gpufleet verify: 4 host(s) (2 verified, 1 unreachable, 1 probe failed), 16 GPU(s), bench " \
                       "quick, 2.5 s"
    assert lines[1].startswith("checks: ") and " fail" in lines[1]
    assert "  gpu-h100-02 gpu1  health.gpu_status: GPU not responding: gpu_lost" in lines
    assert "  gpu-h100-02 gpu5  config.power_limit: power limit 500 W, expected 700 W" in lines
    i = lines.index("  gpu-h100-02 gpu5  config.power_limit: power limit 500 W, expected 700 W")
    assert lines[i + 1].startswith("      -> reapply with the gpu_node deploy (nvidia-smi -i 5 -pl 700)")
    assert "  gpu-h100-03  host.probe: the probe did not run: exit status 127: python3: not found" in lines
    assert f"report: {(tmp_path / 'report.html').resolve()}" in lines
    assert lines[-1] == "result: FAIL (exit code 1)"


def test_progress_lines():
    run = fleet_run(Path("/tmp"))
    ok, failed, unreachable = run.hosts[0], run.hosts[2], run.hosts[3]
    assert vrun._progress_line(ok, 1, 4).startswith("[1/4] gpu-h100-01  PASS  8 GPU(s), ")
    assert vrun._progress_line(ok, 1, 4).endswith("0.4 s, probe updated (1 file(s))")
    assert vrun._progress_line(failed, 2, 4) == "[2/4] gpu-h100-03  PROBE FAILED  exit status 127: python3: not found"
    assert vrun._progress_line(unreachable, 3, 4) == "[3/4] gpu-h100-04  UNREACHABLE  Could not connect (timed out)"


def test_cli_verify_help_and_bad_inventory(tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli_main, ["verify", "--help"])
    assert result.exit_code == 0
    for option in ("--limit", "--bench", "--out", "[none|quick|full]"):
        assert option in result.output
    result = runner.invoke(cli_main, ["verify", str(tmp_path / "nope.py")])
    assert result.exit_code == EXIT_COULD_NOT_RUN
    assert "nope.py: no such file" in result.output
    result = runner.invoke(cli_main, ["verify", "x.py", "--bench", "fast"])
    assert result.exit_code == 2 and "'fast' is not one of" in result.output


# ------------------------------------------------------------------------------------------ pyinfra entry


def pyinfra_state(hosts: list[tuple[str, dict]]) -> State:
    inventory = Inventory(([name for name, _ in hosts], {}), **{f"g{i}": ([name], data)
                                                                  for i, (name, data) in enumerate(hosts)})
    return State(inventory, Config())


def test_deploy_entry_validates_every_host_and_needs_one_out_dir(tmp_path):
    state = pyinfra_state([("a", {"gpufleet_verify_out": str(tmp_path / "x")}), ("b", {})])
    with pytest.raises(InputError, match=r"gpufleet_verify_out differs between hosts \(a=.*x', b='gpufleet-verify'\)"):
        pyinfra_entry.DeployVerify(state, state.inventory)
    state = pyinfra_state([("a", {"gpufleet_verify_bench": "quick"}), ("b", {"gpufleet_power_limit": 9000})])
    with pytest.raises(InputError, match="(?s)invalid configuration, no host was changed:.*b: "
                                         "gpufleet_power_limit=9000"):
        pyinfra_entry.DeployVerify(state, state.inventory)
    same = {"gpufleet_verify_bench": "quick", "gpufleet_verify_out": "r"}
    state = pyinfra_state([("a", same), ("b", {**same, "gpufleet_stages": []})])
    state.cwd = str(tmp_path)
    verify = pyinfra_entry.deploy_verify(state, state.inventory)
    assert pyinfra_entry.deploy_verify(state, state.inventory) is verify
    assert verify.bench == "quick" and verify.out == tmp_path / "r"
    assert verify.is_gpu_node("a") and not verify.is_gpu_node("b")


# ------------------------------------------------------------------------------------------ gpu_check.sh


def test_gpu_check_script_is_valid_and_never_changes_gpu_settings():
    script = REPO / "verify" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert os.access(script, os.X_OK)
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed (make test installs it)")
    result = subprocess.run(["shellcheck", "-x", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    code = [line.split("#", 1)[0] for line in script.read_text().splitlines()]
    setters = (" -pm", " -pl", " -mig", " -r ", " -lgc", " -lmc", " -rgc", " -rmc", " -ac", " -rac", " -e ", " -c ",
               "--persistence-mode", "--power-limit", "--gpu-reset", "--lock-gpu-clocks", "--applications-clocks",
               "--ecc-config", "--compute-mode", "--multi-instance-gpu")
    for line in code:
        if "nvidia-smi" in line:
            assert not any(flag in line for flag in setters), line


def test_gpu_check_scripts_embedded_python_compiles():
    text = (REPO / "verify" / "gpu_check.sh").read_text()
    blocks = [part.split("\nPY\n", 1)[0] for part in text.split("<<'PY'")[1:]]
    assert len(blocks) >= 3
    for i, block in enumerate(blocks):
        compile(block.split("\n", 1)[1], f"gpu_check.sh python block {i}", "exec")


def test_verify_textfile_dir_follows_the_exporters_setting():
    settings, errors = vrun.load_verify_settings("gpu01", {"gpufleet_exporters_textfile_dir": "/srv/prom/textfiles"})
    assert errors == [] and settings.textfile_dir == "/srv/prom/textfiles"
    settings, errors = vrun.load_verify_settings("gpu01", {"gpufleet_exporters_textfile_dir": "/srv/prom/textfiles",
                                                           "gpufleet_verify_textfile_dir": "/srv/other"})
    assert errors == [] and settings.textfile_dir == "/srv/other"
