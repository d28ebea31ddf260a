"""The Grafana stage and the simulated Grafana package held to Grafana's own files, as tests/reference/upstream
records them (facts only: grafana/grafana's files are not kept, docs/upstream.md).

Grafana's current packaged unit and /etc/default/grafana-server could not be obtained: the recorded ones are
Grafana 4-era (``grafana/stale/``, ``"current": false``). So the simulator's unit and environment file are gpufleet's
own text, and what is asserted here is what the recorded facts fix: the unit's name, EnvironmentFile, user, group,
working directory and limits; every path variable the old ExecStart passed is passed, every variable the unit or the
password reset reads is defined, with upstream's values; the provisioning directory from the variable Grafana's
postinst reads from the environment file; the program is the ``grafana`` binary's ``server`` command, and the
password reset is the ``cli`` command's ``admin reset-admin-password --password-from-stdin`` with the global flags
Grafana's source defines. The APT key, keyring and source line are the installation page's.
"""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath

import pytest

from gpufleet.deploys import monitoring
from gpufleet.monitoring import config
from gpufleet.operations import grafana
from gpufleet.sim import repo
from tests import upstream

STALE_UNIT = "grafana/stale/packaging/deb/systemd/grafana-server.service"
STALE_DEFAULTS = "grafana/stale/packaging/deb/default/grafana-server"
INSTALL_PAGE = "grafana/docs/sources/setup-grafana/installation/debian/index.md"
CLI_PAGE = "grafana/docs/sources/cli.md"
PATHS_INI = "grafana/conf/defaults.ini.paths-server.excerpt.ini"
MAIN_GO = "grafana/pkg/cmd/grafana/main.go"
CLI_GO = "grafana/pkg/cmd/grafana-cli/commands/cli.go"
COMMANDS_GO = "grafana/pkg/cmd/grafana-cli/commands/commands.go"
RESET_GO = "grafana/pkg/cmd/grafana-cli/commands/reset_password_command.go"
POSTINST = "grafana/packaging/deb/control/postinst"


def _values(unit: dict, section: str, key: str) -> list[str]:
    return [value for name, value in unit.get(section, []) if name == key]


def _env(text: str) -> dict[str, str]:
    return dict(word.split("=", 1) for line in text.splitlines() for word in shlex.split(line, comments=True))


SIM_UNIT = upstream.parse_systemd_unit((repo.GRAFANA_DIR / repo.GRAFANA_UNIT).read_text())
SIM_DEFAULTS = _env((repo.GRAFANA_DIR / repo.GRAFANA_DEFAULTS).read_text())
SIM_EXEC = _values(SIM_UNIT, "Service", "ExecStart")


def _variables(text: str) -> set[str]:
    return set(re.findall(r"\$\{?(\w+)\}?", text))


def _path_overrides(text: str) -> dict[str, str]:
    """``cfg:default.paths.X=${VAR}`` arguments: Grafana setting -> the environment variable that sets it."""
    return dict(re.findall(r"cfg:default\.(paths\.\w+)=\$\{?(\w+)\}?", text))


def test_grafanas_files_are_recorded_not_kept():
    assert upstream.recorded_index()[STALE_UNIT]["current"] is False
    assert upstream.provenance(STALE_UNIT)["path"] == "packaging/deb/systemd/grafana-server.service"
    assert upstream.provenance(RESET_GO)["commit"] == "01e609d65659c7a09283eb3d76ab9ccd506a9e5d"
    for relpath in (STALE_UNIT, STALE_DEFAULTS, INSTALL_PAGE, MAIN_GO, CLI_GO, COMMANDS_GO, RESET_GO, POSTINST):
        assert re.fullmatch(r"[0-9a-f]{64}", upstream.upstream_sha256(relpath))
        with pytest.raises(KeyError):
            upstream.read(relpath)


def test_simulated_unit_keeps_upstreams_stable_directives():
    for section, key in (("Service", "EnvironmentFile"), ("Service", "User"), ("Service", "Group"),
                         ("Service", "Type"), ("Service", "WorkingDirectory"), ("Service", "LimitNOFILE"),
                         ("Service", "TimeoutStopSec"), ("Service", "UMask"), ("Install", "WantedBy")):
        assert _values(SIM_UNIT, section, key) == upstream.unit_values(STALE_UNIT, section, key), (section, key)
    # upstream's old unit says Restart=on-failure twice; once is the same to systemd
    assert set(_values(SIM_UNIT, "Service", "Restart")) == set(upstream.unit_values(STALE_UNIT, "Service", "Restart"))
    assert _values(SIM_UNIT, "Service", "EnvironmentFile") == [grafana.DEFAULTS]
    assert _values(SIM_UNIT, "Service", "User") == _values(SIM_UNIT, "Service", "Group") == [grafana.GROUP]


def test_simulated_unit_runs_the_grafana_binarys_server_command():
    [exec_start] = SIM_EXEC
    program, command = exec_start.split()[:2]
    main_go = upstream.recorded(MAIN_GO)
    assert PurePosixPath(program).name == main_go["binary"]["value"]
    assert command == "server" and command in main_go["commands"]["value"]
    # in the home's bin directory, where the CLI page puts Grafana's programs on Linux
    cli_binary = PurePosixPath(upstream.recorded(CLI_PAGE)["cli_binary"]["value"])
    assert PurePosixPath(program).parent == cli_binary.parent == PurePosixPath(SIM_DEFAULTS["GRAFANA_HOME"], "bin")


def test_simulated_unit_passes_every_path_upstream_passed_and_the_provisioning_directory():
    [stale_exec] = upstream.unit_values(STALE_UNIT, "Service", "ExecStart")
    [sim_exec] = SIM_EXEC
    stale = _path_overrides(stale_exec)
    assert stale and stale.items() <= _path_overrides(sim_exec).items()
    assert "--config=${CONF_FILE}" in stale_exec.split() and "--config=${CONF_FILE}" in sim_exec.split()
    # the provisioning directory: a [paths] key of defaults.ini, set from the variable Grafana's postinst reads from
    # /etc/default/grafana-server; gpufleet writes its provisioning files there
    assert "paths.provisioning" in upstream.recorded(PATHS_INI)["keys"]
    postinst = upstream.recorded(POSTINST)
    assert "PROVISIONING_CFG_DIR" in postinst["variables_used_without_default"]["value"]
    assert _path_overrides(sim_exec)["paths.provisioning"] == "PROVISIONING_CFG_DIR"
    assert SIM_DEFAULTS["PROVISIONING_CFG_DIR"] == monitoring.GRAFANA_PROVISIONING
    assert _variables(sim_exec) <= set(SIM_DEFAULTS), _variables(sim_exec) - set(SIM_DEFAULTS)


def test_simulated_defaults_keep_upstreams_variables_and_values():
    stale = upstream.env_file(STALE_DEFAULTS)
    # UMASK went to the unit's UMask= (the same value)
    assert stale.pop("UMASK") == _values(SIM_UNIT, "Service", "UMask")[0]
    assert {key: SIM_DEFAULTS.get(key) for key in stale} == stale
    postinst = upstream.recorded(POSTINST)
    assert {key: SIM_DEFAULTS.get(key) for key in postinst["defaults"]} == \
        {key: fact["value"] for key, fact in postinst["defaults"].items()}
    assert set(postinst["variables_used_without_default"]["value"]) <= set(SIM_DEFAULTS)
    assert postinst["reads"]["value"] == grafana.DEFAULTS


def test_simulated_postinst_does_what_grafanas_does():
    script = repo.GRAFANA_POSTINST
    postinst = upstream.recorded(POSTINST)
    assert f". {postinst['reads']['value']}" in script
    for variable, fact in postinst["defaults"].items():
        assert f"${{{variable}:-{fact['value']}}}" in script
    assert f"for kind in {' '.join(postinst['provisioning']['value'])}; do" in script
    assert "chmod 755" in script and "chmod 640" in script
    assert "systemctl enable" not in script and "systemctl start" not in script  # a first install starts nothing


def test_password_reset_is_grafanas_cli_command_with_its_flags():
    words = shlex.split(grafana._reset_command(grafana.PASSWORD_FILE))
    program = words.index('$GRAFANA_HOME/bin/grafana')
    assert PurePosixPath(words[program]).name == upstream.recorded(MAIN_GO)["binary"]["value"]
    assert words[program + 1] == "cli" and "cli" in upstream.recorded(MAIN_GO)["commands"]["value"]
    commands = upstream.recorded(COMMANDS_GO)
    admin = words.index(commands["admin_command"]["value"])
    reset = commands["reset_admin_password"]
    assert words[admin + 1] == reset["value"]
    # the global flags before the command, each one Grafana's cli command defines
    global_flags = [w[2:] for w in words[program + 2:admin] if w.startswith("--")]
    assert global_flags == ["homepath", "config", "configOverrides"]
    assert set(global_flags) <= set(upstream.recorded(CLI_GO)["flags"])
    # --password-from-stdin is a boolean flag (no value): the password is stdin's first line, from the file
    assert words[admin + 2:] == ["--password-from-stdin", "<", grafana.PASSWORD_FILE, ")"]
    assert reset["flags"]["password-from-stdin"]["type"] == "bool"
    assert "first line read from stdin" in upstream.recorded(RESET_GO)["password_from_stdin"]["fact"]
    # Grafana splits --configOverrides on single spaces: each part one cfg:default.* argument
    overrides = words[words.index("--configOverrides") + 1]
    assert all(part.startswith("cfg:default.paths.") for part in overrides.split(" "))
    assert _path_overrides(overrides) == _path_overrides(SIM_EXEC[0])


def test_password_reset_reads_only_variables_of_the_environment_file():
    used = _variables(grafana._reset_command(grafana.PASSWORD_FILE))
    assert used <= set(SIM_DEFAULTS), used - set(SIM_DEFAULTS)
    recorded = (set(upstream.env_file(STALE_DEFAULTS))
                | set(upstream.recorded(POSTINST)["variables_used_without_default"]["value"]))
    assert used <= recorded, used - recorded


def test_a_password_with_a_line_break_is_refused():
    """The CLI takes stdin's first line only; a password with a line break would be cut silently."""
    assert "first line" in upstream.recorded(RESET_GO)["password_from_stdin"]["fact"]
    for password in ("a-long-password\nsecond", "a-long-password\r"):
        errors = config.load_monitoring_settings("mon01", {"gpufleet_monitoring_grafana_admin_password": password})[2]
        assert [str(e) for e in errors] == [
            "mon01: gpufleet_monitoring_grafana_admin_password='***': contains a line break or NUL; allowed: a "
            "password of at least 12 characters that is not a default one"]


def test_key_keyring_and_source_line_as_grafanas_installation_page():
    apt = upstream.recorded(INSTALL_PAGE)["apt"]
    assert apt["key_url"]["value"] == f"https://apt.grafana.com/{monitoring.GRAFANA_KEY_FILE}"
    assert apt["keyring_path"]["value"] == apt["signed_by"]["value"] == grafana.KEYRING
    assert apt["list_file"]["value"] == monitoring.GRAFANA_SOURCE
    assert apt["source_line_stable"]["value"] == f"deb [signed-by={grafana.KEYRING}] {config.DEFAULT_GRAFANA_REPO}"
    oss = next(r for r in apt["repositories"] if r["edition"] == "Grafana OSS")
    assert (oss["package"], oss["suite_line"]) == ("grafana", config.DEFAULT_GRAFANA_REPO)
