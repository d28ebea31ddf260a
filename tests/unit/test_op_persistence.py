"""persistence.nvidia_persistenced: commands for given facts (drop-in, add-wants, start/restart by GPU state)."""

from __future__ import annotations

import hashlib

import pytest
from pyinfra.api import State
from pyinfra_harness import run_operation

from gpufleet.facts.files import ManagedState
from gpufleet.facts.nvidia import GpuInventory
from gpufleet.operations import persistence
from tests.upstream import debian_unit_path, read

DROP_IN = persistence.DROP_IN
LINK = persistence.WANTS_LINK
# the unit Debian 12's nvidia-persistenced installs (verbatim), where it installs it
PACKAGED_PATH = "/lib/systemd/system/nvidia-persistenced.service"
PACKAGED = read(debian_unit_path("bookworm", "nvidia-persistenced", "nvidia-persistenced.service"))


def drop_in(persistence_mode: bool = True) -> str:
    return persistence.drop_in_text(PACKAGED, persistence_mode)


def gpu(index: int, mode: str | None) -> dict:
    return {"index": index, "uuid": f"GPU-{index:08d}-0000-0000-0000-000000000000", "name": "NVIDIA H100 80GB HBM3",
            "persistence_mode": mode}


def inventory(*modes: str | None, status: str = "ok") -> dict:
    return {"status": status, "error": None, "exit_code": 0, "driver_version": "580.95.05", "lost_gpus": [],
            "gpus": [gpu(i, m) for i, m in enumerate(modes)]}


def managed(files: dict | None = None, units: dict | None = None):
    """A ManagedState fact: files {path: text (regular file, 644 root) | ("link", target) | None}."""
    files = files or {}
    unit_states = units or {}

    def fact(paths=(), read=(), units=()):
        result = {"files": {}, "contents": {}, "units": {}}
        for path in paths:
            value = files.get(path)
            if value is None:
                result["files"][path] = None
            elif isinstance(value, tuple):
                result["files"][path] = {"type": "link", "mode": None, "user": None, "group": None, "sha1": None,
                                         "target": value[1]}
            else:
                result["files"][path] = {"type": "file", "mode": "644", "user": "root", "group": "root",
                                         "sha1": hashlib.sha1(value.encode()).hexdigest(), "target": None}
        for path in read:
            result["contents"][path] = files.get(path) if isinstance(files.get(path), str) else None
        for unit in units:
            result["units"][unit] = {"load_state": "loaded", "active_state": "inactive", "sub_state": "dead",
                                     "unit_file_state": "static", "need_daemon_reload": False,
                                     **unit_states.get(unit, {})}
        return result

    return fact


def run(inv: dict, files=None, units=None, packaged: bool = True, **kwargs):
    files = {**({PACKAGED_PATH: PACKAGED} if packaged else {}), **(files or {})}
    facts = {GpuInventory: inv, ManagedState: managed(files, units)}
    return run_operation(persistence.nvidia_persistenced, facts=facts, **kwargs)


CONVERGED_FILES = {DROP_IN: drop_in(True), LINK: ("link", "/lib/systemd/system/x.service")}
RUNNING = {persistence.UNIT: {"active_state": "active", "sub_state": "running"}}


def test_drop_in_overrides_exec_start_with_persistence_mode_as_the_packaged_user():
    text = drop_in(True)
    lines = text.splitlines()
    assert "[Service]" in lines
    start = lines.index("ExecStart=")  # clears the packaged ExecStart first
    assert lines[start + 1] == "ExecStart=/usr/bin/nvidia-persistenced --user nvpd --persistence-mode"
    assert "--no-persistence-mode\n" not in text
    assert "ExecStart=/usr/bin/nvidia-persistenced --user nvpd --no-persistence-mode" in drop_in(False)


def test_the_unit_systemd_loads_decides_the_drop_in():
    """Debian 13 (/usr/lib), and an administrator's full unit in /etc/systemd/system, which systemd prefers."""
    trixie = read(debian_unit_path("trixie", "nvidia-persistenced", "nvidia-persistenced.service"))
    commands, _ = run(inventory("Enabled"), {"/usr/lib/systemd/system/nvidia-persistenced.service": trixie},
                      RUNNING, packaged=False)
    assert f"upload {DROP_IN}\n{persistence.drop_in_text(trixie, True)}" in commands
    local = "[Service]\nExecStart=/usr/bin/nvidia-persistenced --user site-user --verbose\n"
    commands, _ = run(inventory("Enabled"), {"/etc/systemd/system/nvidia-persistenced.service": local}, RUNNING)
    assert any(c.startswith(f"upload {DROP_IN}") and "--user site-user --verbose --persistence-mode" in c
               for c in commands)


def test_unit_outside_the_read_directories_fails_the_host_at_execution(monkeypatch):
    monkeypatch.setattr(State, "is_executing", True)
    commands, _ = run(inventory("Enabled"), {}, RUNNING, packaged=False)
    assert len(commands) == 1 and commands[0].startswith("echo 'gpufleet: error: nvidia-persistenced.service on "
                                                         "testhost is not in any of /etc/systemd/system/")


def test_fresh_host_gets_drop_in_reload_wants_and_start():
    commands, noops = run(inventory("Disabled", "Disabled"))
    assert commands == [
        "mkdir -p /etc/systemd/system/nvidia-persistenced.service.d",
        f"upload {DROP_IN}\n{drop_in(True)}",
        f"chown root:root {DROP_IN} && chmod 644 {DROP_IN}",
        "systemctl daemon-reload",
        "systemctl add-wants multi-user.target nvidia-persistenced.service",
        "systemctl start nvidia-persistenced.service",
    ]
    assert noops == []


def test_converged_host_is_noop():
    commands, noops = run(inventory("Enabled", "Enabled"), CONVERGED_FILES, RUNNING)
    assert commands == []
    assert noops == ["nvidia-persistenced enabled and running, persistence mode on (2 GPU(s))"]


def test_gpu_with_persistence_disabled_restarts_the_daemon_only():
    """Checked through the GPU: the unit is running, but a GPU says Disabled (daemon started before the drop-in)."""
    commands, _ = run(inventory("Enabled", "Disabled"), CONVERGED_FILES, RUNNING)
    assert commands == ["systemctl restart nvidia-persistenced.service"]


def test_changed_drop_in_reloads_and_restarts():
    files = {**CONVERGED_FILES, DROP_IN: "[Service]\nExecStart=\nExecStart=/usr/bin/nvidia-persistenced\n"}
    commands, _ = run(inventory("Enabled"), files, RUNNING)
    assert commands == [
        f"upload {DROP_IN}\n{drop_in(True)}",
        "systemctl daemon-reload",
        "systemctl restart nvidia-persistenced.service",
    ]


def test_stopped_daemon_is_started_not_restarted():
    commands, _ = run(inventory("Disabled"), CONVERGED_FILES, {persistence.UNIT: {"active_state": "failed"}})
    assert commands == ["systemctl start nvidia-persistenced.service"]


def test_pending_daemon_reload_is_done_without_drop_in_change():
    units = {persistence.UNIT: {"active_state": "active", "need_daemon_reload": True}}
    commands, _ = run(inventory("Enabled"), CONVERGED_FILES, units)
    assert commands == ["systemctl daemon-reload"]


def test_missing_wants_link_only_adds_wants():
    files = {DROP_IN: drop_in(True)}
    commands, _ = run(inventory("Enabled"), files, RUNNING)
    assert commands == ["systemctl add-wants multi-user.target nvidia-persistenced.service"]


@pytest.mark.parametrize("status", ["driver_not_loaded", "absent", "version_mismatch"])
def test_no_gpu_reachable_configures_but_does_not_start(status):
    commands, noops = run(inventory(status=status))
    assert "systemctl start nvidia-persistenced.service" not in commands
    assert commands[-1] == "systemctl add-wants multi-user.target nvidia-persistenced.service"
    assert noops == [f"no GPU reachable ({status}): nvidia-persistenced starts at the next boot"]


def test_lost_gpu_is_ignored_for_the_persistence_check():
    inv = inventory("Enabled", None, status="gpu_lost")
    commands, _ = run(inv, CONVERGED_FILES, RUNNING)
    assert commands == []


def test_persistence_mode_false_writes_no_persistence_mode_and_does_not_check_gpus():
    files = {**CONVERGED_FILES, DROP_IN: drop_in(False)}
    commands, noops = run(inventory("Disabled", "Enabled"), files, RUNNING, persistence_mode=False)
    assert commands == []
    assert noops


def test_never_uses_legacy_nvidia_smi_pm():
    for inv in (inventory("Disabled"), inventory("Enabled"), inventory(status="driver_not_loaded")):
        commands, _ = run(inv)
        assert not [c for c in commands if "nvidia-smi" in c or "-pm" in c.split()]


def test_missing_unit_is_refused_at_execution_not_while_planning(monkeypatch):
    units = {persistence.UNIT: {"load_state": "not-found"}}
    # planning: the driver stage may install it (its command is read when the operation runs)
    commands, _ = run(inventory(status="absent"), {}, units, packaged=False)
    assert commands[-1] == "systemctl add-wants multi-user.target nvidia-persistenced.service"
    monkeypatch.setattr(State, "is_executing", True)  # executing: this host fails with a message, others go on
    commands, _ = run(inventory(status="absent"), {}, units, packaged=False)
    assert commands == ["echo 'gpufleet: error: nvidia-persistenced.service is not installed on testhost: install "
                        "the NVIDIA driver first (its nvidia-persistenced package)' >&2; exit 1"]
