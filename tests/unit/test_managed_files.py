"""managed_files.put_file / remove_file, the file writer of gpufleet's operations: ``--diff`` and ``_temp_dir`` as
pyinfra's ``files.put`` (shown through nccl.nccl_conf and persistence's drop-in, which use it)."""

from __future__ import annotations

import hashlib
import logging
import re

import pytest
from pyinfra.api import Config, State
from pyinfra.api.command import FileUploadCommand
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.files import FileContents
from pyinfra_harness import FakeHost, MissingFact, render

from gpufleet.facts.files import ManagedState
from gpufleet.operations import nccl
from gpufleet.operations.managed_files import put_file

PATH = "/etc/nccl.conf"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class DiffHost(FakeHost):
    def __init__(self, facts: dict, temp_dir: str | None = None):
        super().__init__("testhost", facts)
        self.temp_dirs: list = []
        if temp_dir:
            self.current_op_global_arguments = {"_temp_dir": temp_dir}

    def get_temp_filename(self, hash_key=None, temp_directory=None, **_kwargs) -> str:
        self.temp_dirs.append(temp_directory)
        return f"{temp_directory or '/tmp'}/upload"

    def log(self, message, log_func=None):
        (log_func or logging.getLogger("pyinfra").info)(f"[{self.name}] {message}")


def current_file(text: str | None) -> dict | None:
    if text is None:
        return None
    return {"type": "file", "mode": "644", "user": "root", "group": "root", "target": None,
            "sha1": hashlib.sha1(text.encode()).hexdigest()}


def run_nccl(settings: dict, current_text: str | None, *, diff: bool, temp_dir: str | None = None,
             contents: str | None = None):
    facts = {ManagedState: lambda paths=(), read=(), units=(): {"files": {p: current_file(current_text)
                                                                           for p in paths}}}
    if contents is not None:
        facts[(FileContents, frozenset({"path": PATH}.items()))] = contents.splitlines()
    host = DiffHost(facts, temp_dir)
    state = State()
    state.config = Config(DIFF=diff)
    with ctx_state.use(state), ctx_host.use(host):
        commands = list(nccl.nccl_conf._inner(settings=settings))
    return commands, host


def logged(caplog) -> list[str]:
    return [ANSI.sub("", r.getMessage()) for r in caplog.records if r.name == "pyinfra"]


def test_diff_of_a_new_file_is_shown_as_files_put_shows_it(caplog):
    caplog.set_level(logging.INFO, logger="pyinfra")
    commands, _ = run_nccl({"NCCL_DEBUG": "WARN"}, None, diff=True)
    lines = logged(caplog)
    assert lines[0] == "[testhost] Will create /etc/nccl.conf"
    assert "  + NCCL_DEBUG=WARN" in lines and lines[-1] == ""
    assert [type(c) for c in commands][1] is FileUploadCommand


def test_diff_of_a_changed_file_reads_its_text_and_shows_the_lines(caplog):
    caplog.set_level(logging.INFO, logger="pyinfra")
    old = nccl.conf_text({"NCCL_DEBUG": "WARN"})
    commands, host = run_nccl({"NCCL_DEBUG": "INFO"}, old, diff=True, contents=old)
    lines = logged(caplog)
    assert lines[0] == "[testhost] Will modify /etc/nccl.conf"
    assert "  - NCCL_DEBUG=WARN" in lines and "  + NCCL_DEBUG=INFO" in lines
    assert render(commands[0]).startswith("upload /etc/nccl.conf\n")


def test_without_diff_the_current_text_is_never_read(caplog):
    caplog.set_level(logging.INFO, logger="pyinfra")
    old = nccl.conf_text({"NCCL_DEBUG": "WARN"})
    commands, host = run_nccl({"NCCL_DEBUG": "INFO"}, old, diff=False)  # no FileContents given: reading it fails
    assert logged(caplog) == [] and len(commands) == 1
    assert FileContents not in [call[0] if isinstance(call, tuple) else call for call in host.fact_calls]
    with pytest.raises(MissingFact):  # the harness refuses facts a test does not give: the check above is real
        run_nccl({"NCCL_DEBUG": "INFO"}, old, diff=True)


def test_unchanged_file_shows_no_diff(caplog):
    caplog.set_level(logging.INFO, logger="pyinfra")
    text = nccl.conf_text({"NCCL_DEBUG": "WARN"})
    commands, host = run_nccl({"NCCL_DEBUG": "WARN"}, text, diff=True)
    assert commands == [] and logged(caplog) == [] and host.noops == ["/etc/nccl.conf has 1 setting(s)"]


def test_temp_dir_is_where_the_upload_lands():
    commands, host = run_nccl({"NCCL_DEBUG": "WARN"}, None, diff=False, temp_dir="/var/tmp/site")
    upload = [c for c in commands if isinstance(c, FileUploadCommand)]
    assert host.temp_dirs == ["/var/tmp/site"] and upload[0].remote_temp_filename == "/var/tmp/site/upload"


def test_mode_and_owner_changes_are_shown_under_diff(caplog):
    caplog.set_level(logging.INFO, logger="pyinfra")
    text = "x\n"
    current = {**current_file(text), "mode": "600", "user": "nobody"}
    host = DiffHost({})
    state = State()
    state.config = Config(DIFF=True)
    with ctx_state.use(state), ctx_host.use(host):
        commands = [render(c) for c in put_file(current, "/etc/x", text)]
    assert commands == ["chown root:root /etc/x && chmod 644 /etc/x"]
    assert logged(caplog) == ["mode 600", "mode 644", "user/group nobody:root", "user/group root:root"]


def run_secret(current_text: str | None, text: str, *, diff: bool):
    from gpufleet.operations import files

    facts = {ManagedState: lambda paths=(), read=(), units=(): {"files": {p: current_file(current_text)
                                                                           for p in paths}}}
    host = DiffHost(facts)
    state = State()
    state.config = Config(DIFF=diff)
    with ctx_state.use(state), ctx_host.use(host):
        return list(files.secret_file._inner(path="/etc/prometheus/alertmanager.yml", content=text, mode="640",
                                             group="prometheus"))


def test_a_secret_file_is_never_shown_and_never_wider_than_its_mode(caplog):
    """--diff names the file but not its text; the text goes on stdin (not in the command line, not in an upload's
    temporary file); the temporary file is made under umask 077 and gets owner and mode before it is renamed."""
    text = "receivers:\n- url: https://hooks.example.com/?token=s3cr3t\n"
    caplog.set_level(logging.INFO)
    commands = run_secret("old: 1\n", text, diff=True)
    assert [type(c).__name__ for c in commands] == ["StringCommand"]
    command = commands[0].get_raw_value()
    assert "s3cr3t" not in command and "s3cr3t" not in repr(commands[0])
    assert "s3cr3t" not in "\n".join(logged(caplog))
    assert any("Will modify" in line and "alertmanager.yml" in line and "not shown" in line for line in logged(caplog))
    assert commands[0].connector_arguments["_stdin"] == text
    assert command.index("umask 077") < command.index("mktemp /etc/prometheus/.alertmanager.yml.gpufleet-XXXXXX")
    assert command.index("chown root:prometheus") < command.index("chmod 640") < command.index("mv -f")


def test_a_converged_secret_file_is_left_alone():
    text = "route: {}\n"
    current = current_file(text)
    current.update(mode="640", group="prometheus")
    from gpufleet.operations import files

    facts = {ManagedState: lambda paths=(), read=(), units=(): {"files": {p: current for p in paths}}}
    host = DiffHost(facts)
    state = State()
    state.config = Config()
    with ctx_state.use(state), ctx_host.use(host):
        assert list(files.secret_file._inner(path="/etc/prometheus/alertmanager.yml", content=text, mode="640",
                                             group="prometheus")) == []


def test_the_upload_name_is_random_not_derived_from_the_destination():
    """files.put uploads to /tmp/pyinfra-<sha1 of dest>: a name another user can plant a symlink at."""
    keys = []

    class KeyHost(DiffHost):
        def get_temp_filename(self, hash_key=None, temp_directory=None, **_kwargs) -> str:
            keys.append(hash_key)
            return "/tmp/upload"

    facts = {ManagedState: lambda paths=(), read=(), units=(): {"files": {p: None for p in paths}}}
    host = KeyHost(facts)
    state = State()
    state.config = Config()
    with ctx_state.use(state), ctx_host.use(host):
        assert any(isinstance(c, FileUploadCommand) for c in put_file(None, PATH, "NCCL_DEBUG=WARN\n"))
    assert keys == [None]  # pyinfra then names it after a uuid4
