"""nccl.nccl_conf: file text, mode/owner, removal, refused values; and the ManagedState fact it reads."""

from __future__ import annotations

import hashlib
import subprocess

import pytest
from pyinfra.api import OperationValueError
from pyinfra_harness import run_operation

from gpufleet.facts.files import ManagedState
from gpufleet.facts.systemd import UnitStates
from gpufleet.operations import nccl

PATH = "/etc/nccl.conf"
SETTINGS = {"NCCL_SOCKET_IFNAME": "=eth0", "NCCL_DEBUG": "WARN", "NCCL_IB_DISABLE": 1, "NCCL_IB_HCA": "^=mlx5_1"}


def file_state(text: str | None, mode: str = "644", user: str = "root", group: str = "root"):
    if text is None:
        return None
    return {"type": "file", "mode": mode, "user": user, "group": group, "target": None,
            "sha1": hashlib.sha1(text.encode()).hexdigest()}


def run(settings, current=None, path=PATH):
    def fact(paths=(), read=(), units=()):
        return {"files": {p: current for p in paths}, "contents": {}, "units": {}}

    return run_operation(nccl.nccl_conf, facts={ManagedState: fact}, settings=settings, path=path)


def test_file_text_is_sorted_key_value_lines_without_spaces_or_quotes():
    text = nccl.conf_text(SETTINGS)
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert body == ["NCCL_DEBUG=WARN", "NCCL_IB_DISABLE=1", "NCCL_IB_HCA=^=mlx5_1", "NCCL_SOCKET_IFNAME==eth0"]
    assert text.endswith("NCCL_SOCKET_IFNAME==eth0\n")
    assert all(line.startswith("#") for line in text.splitlines()[:2])  # comments: NCCL skips lines starting with #


def test_new_file_is_written_with_mode_0644_root():
    commands, noops = run(SETTINGS)
    assert commands == [
        "mkdir -p /etc",
        f"upload {PATH}\n{nccl.conf_text(SETTINGS)}",
        f"chown root:root {PATH} && chmod 644 {PATH}",
    ]
    assert noops == []


def test_same_file_is_noop():
    commands, noops = run(SETTINGS, file_state(nccl.conf_text(SETTINGS)))
    assert commands == []
    assert noops == ["/etc/nccl.conf has 4 setting(s)"]


def test_changed_settings_upload_only():
    commands, _ = run(SETTINGS, file_state("NCCL_DEBUG=INFO\n"))
    assert commands == [f"upload {PATH}\n{nccl.conf_text(SETTINGS)}"]


def test_wrong_mode_and_owner_are_fixed_without_upload():
    commands, _ = run(SETTINGS, file_state(nccl.conf_text(SETTINGS), mode="600", user="alice", group="alice"))
    assert commands == [f"chown root:root {PATH} && chmod 644 {PATH}"]
    commands, _ = run(SETTINGS, file_state(nccl.conf_text(SETTINGS), mode="600"))
    assert commands == [f"chmod 644 {PATH}"]


def test_empty_settings_remove_the_file():
    commands, _ = run({}, file_state("NCCL_DEBUG=INFO\n"))
    assert commands == [f"rm -f {PATH}"]
    commands, noops = run({}, None)
    assert commands == []
    assert noops == ["/etc/nccl.conf absent"]


def test_path_is_quoted():
    path = "/opt/my nccl/nccl.conf"
    commands, _ = run({"NCCL_DEBUG": "WARN"}, None, path=path)
    assert commands[0] == "mkdir -p '/opt/my nccl'"
    assert commands[-1] == "chown root:root '/opt/my nccl/nccl.conf' && chmod 644 '/opt/my nccl/nccl.conf'"


def test_a_directory_at_the_path_is_refused():
    directory = {"type": "dir", "mode": None, "user": None, "group": None, "sha1": None, "target": None}
    with pytest.raises(OperationValueError, match="/etc/nccl.conf exists and is not a regular file"):
        run(SETTINGS, directory)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"NCCL_SOCKET_IFNAME": "eth0 eth1"}, r"NCCL_SOCKET_IFNAME='eth0 eth1' contains a space"),
        ({"NCCL_DEBUG": "WARN\nNCCL_P2P_DISABLE=1"}, r"contains a newline"),
        ({"NCCL_DEBUG": "WARN\r"}, r"contains a carriage return"),
        ({"NCCL_DEBUG": "\tWARN"}, r"contains a tab"),
        ({"NCCL_DEBUG": '"WARN"'}, r"contains a double quote"),
        ({"NCCL_IB_HCA": "'mlx5_0'"}, r"contains a single quote"),
        ({"NCCL_DEBUG": "WA\x00RN"}, r"contains a control character"),
        ({"NCCL_DEBUG": ""}, r"NCCL_DEBUG: empty value"),
        ({"NCCL_IB_DISABLE": True}, r"True is not a string or an integer"),
        ({"NCCL_IB_TIMEOUT": 1.5}, r"1.5 is not a string or an integer"),
        ({"NCCL DEBUG": "WARN"}, r"'NCCL DEBUG' is not a variable name"),
        ({"NCCL_DEBUG=": "WARN"}, r"'NCCL_DEBUG=' is not a variable name"),
        ({"#NCCL_DEBUG": "WARN"}, r"is not a variable name"),
        ({"NCCL_ALGO": "x" * 1024}, r"longer than 1023"),
        (["NCCL_DEBUG=WARN"], r"settings must be a dict"),
    ],
)
def test_bad_values_are_refused_with_the_key_named(settings, message):
    with pytest.raises(OperationValueError, match=message):
        run(settings)


def test_relative_path_is_refused():
    with pytest.raises(OperationValueError, match="not an absolute file path"):
        run(SETTINGS, path="nccl.conf")


# ------------------------------------------------------------------ ManagedState, run by a local shell


def test_managed_state_fact_reads_files_links_contents_in_one_command(tmp_path):
    (tmp_path / "conf").write_text("A=1\n|pipe\n\nlast")
    (tmp_path / "empty").write_text("")
    (tmp_path / "conf").chmod(0o640)
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to("/lib/systemd/system/x.service")
    paths = tuple(str(tmp_path / n) for n in ("conf", "dir", "link", "missing", "empty"))
    read = (str(tmp_path / "conf"), str(tmp_path / "empty"), str(tmp_path / "missing"))
    fact = ManagedState()
    command = fact.command(paths=paths, read=read)
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    state = fact.process(output.splitlines())
    conf = state["files"][paths[0]]
    assert conf["type"] == "file" and conf["mode"] == "640"
    assert conf["sha1"] == hashlib.sha1(b"A=1\n|pipe\n\nlast").hexdigest()
    assert state["files"][paths[1]]["type"] == "dir"
    assert state["files"][paths[2]] == {"type": "link", "target": "/lib/systemd/system/x.service", "mode": None,
                                        "user": None, "group": None, "sha1": None}
    assert state["files"][paths[3]] is None
    assert state["contents"] == {read[0]: "A=1\n|pipe\n\nlast\n", read[1]: "", read[2]: None}


def test_unit_states_parse_need_daemon_reload_and_an_empty_unit_file_state():
    output = [
        "units",
        "Id=nvidia-persistenced.service",
        "LoadState=loaded",
        "ActiveState=active",
        "SubState=running",
        "UnitFileState=static",
        "NeedDaemonReload=no",
        "",
        "Id=gpufleet-power-limits.service",
        "LoadState=not-found",
        "ActiveState=inactive",
        "SubState=dead",
        "UnitFileState=",
        "NeedDaemonReload=yes",
    ]
    units = UnitStates().process(output)
    assert units["nvidia-persistenced.service"] == {"load_state": "loaded", "active_state": "active",
                                                    "sub_state": "running", "unit_file_state": "static",
                                                    "need_daemon_reload": False}
    assert units["gpufleet-power-limits.service"]["unit_file_state"] is None
    assert units["gpufleet-power-limits.service"]["need_daemon_reload"] is True


def test_managed_state_fact_refuses_odd_names():
    with pytest.raises(OperationValueError):
        ManagedState().command(paths=("relative/path",))
