"""The Grafana stage's decisions: the repository key (fingerprints parsed from the key's bytes, checked before the
key is trusted), the packaged /etc/default/grafana-server left alone or restored, the admin password written and
applied without ever being in a command, GF_* overrides in a drop-in, and the gpu_model label from the node."""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess

import pytest
from pyinfra.api import OperationError
from pyinfra.facts.deb import DebPackages
from pyinfra_harness import run_operation, wrap

from gpufleet.deploys.monitoring import gpu_model_of, grafana_dropin
from gpufleet.facts.grafana import GrafanaHostState, RepositoryKeyFingerprints, openpgp_fingerprints
from gpufleet.facts.nvidia import GpuInventory
from gpufleet.monitoring.config import MonitoringSettings, load_monitoring_settings
from gpufleet.operations import grafana

STATE_KEY = (GrafanaHostState, frozenset({"keyring": grafana.KEYRING, "defaults": grafana.DEFAULTS,
                                          "password_file": grafana.PASSWORD_FILE,
                                          "marker": grafana.PASSWORD_MARKER}.items()))
FPR = "B53AE77BADB630A683046005963FA27710458545"
OTHER = "0" * 40
URL = "https://apt.grafana.com/gpg-full.key"
PASSWORD = "a-long-enough-secret"


def host_state(**values) -> dict:
    return {**GrafanaHostState.default(), **values}


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    """(binary key, armored key, fingerprint gpg prints) of a fresh key."""
    if not shutil.which("gpg"):
        pytest.fail("gpg is needed to make a test key")
    home = tmp_path_factory.mktemp("gnupg")
    gpg = ["gpg", "--homedir", str(home), "--batch", "--quiet"]
    subprocess.run([*gpg, "--passphrase", "", "--quick-gen-key", "test <t@example.invalid>", "ed25519", "sign",
                    "never"], check=True)
    binary = subprocess.run([*gpg, "--export", "test"], check=True, capture_output=True).stdout
    armored = subprocess.run([*gpg, "--armor", "--export", "test"], check=True, capture_output=True).stdout
    listing = subprocess.run([*gpg, "--with-colons", "--fingerprint", "test"], check=True, capture_output=True,
                             text=True).stdout
    fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr"))
    return binary, armored, fingerprint


def test_fingerprints_computed_from_the_key_as_gpg_does(key):
    binary, armored, fingerprint = key
    assert openpgp_fingerprints(binary) == [fingerprint]
    assert openpgp_fingerprints(armored) == [fingerprint]


def test_repository_key_fact_fingerprints_and_hashes_what_the_node_downloaded(key):
    _binary, armored, fingerprint = key
    output = wrap("key", base64.encodebytes(armored).decode())
    assert RepositoryKeyFingerprints().process(output) == {
        "fingerprints": [fingerprint], "sha256": hashlib.sha256(armored).hexdigest(), "error": None}
    failed = wrap("key", "E: Failed to fetch https://apt.grafana.com/gpg-full.key  404  Not Found", rc=1)
    assert RepositoryKeyFingerprints().process(failed) == {
        "fingerprints": [], "sha256": None,
        "error": "E: Failed to fetch https://apt.grafana.com/gpg-full.key  404  Not Found"}


def test_host_state_fact_reads_the_keyring_without_gpg(key):
    binary, _armored, fingerprint = key
    output = [*wrap("keyring", base64.encodebytes(binary).decode()), *wrap("defaults", "GRAFANA_USER=grafana\n"),
              *wrap("password", "640 root grafana 20"), *wrap("marker", "pbkdf2_sha256$1$2$3")]
    assert GrafanaHostState().process(output) == {
        "keyring_fingerprints": [fingerprint], "defaults_first_line": "GRAFANA_USER=grafana",
        "password_file": {"mode": "640", "user": "root", "group": "grafana", "size": 20},
        "password_marker": "pbkdf2_sha256$1$2$3"}
    absent = [*wrap("keyring", "", rc=1), *wrap("defaults", "", rc=1), *wrap("password", "", rc=1),
              *wrap("marker", "", rc=1)]
    assert GrafanaHostState().process(absent) == GrafanaHostState.default()


def test_key_installed_armored_as_grafana_instructs():
    commands, _ = run_operation(grafana.repository_key, {STATE_KEY: host_state()}, url=URL)
    assert len(commands) == 1
    assert "/usr/lib/apt/apt-helper download-file https://apt.grafana.com/gpg-full.key" in commands[0]
    assert "grep -q -- '-----BEGIN PGP PUBLIC KEY BLOCK-----'" in commands[0]  # an .asc file must be armored
    assert commands[0].endswith('install -D -m 0644 -o root -g root "$t/key" /etc/apt/keyrings/grafana.asc)')
    assert "sha256sum" not in commands[0]


def test_key_present_is_a_noop_and_a_fingerprint_is_checked_before_trust():
    commands, noops = run_operation(grafana.repository_key, {STATE_KEY: host_state(keyring_fingerprints=[FPR])},
                                    url=URL, fingerprint=FPR)
    assert commands == [] and noops == [f"/etc/apt/keyrings/grafana.asc holds the repository key {FPR}"]
    remote = (RepositoryKeyFingerprints, frozenset({"url": URL}.items()))
    commands, _ = run_operation(grafana.repository_key, {STATE_KEY: host_state(),
                                                         remote: {"fingerprints": [FPR], "sha256": "ab" * 32,
                                                                  "error": None}},
                                url=URL, fingerprint=FPR)
    # exactly the bytes whose fingerprint was checked are installed
    assert f'echo "{"ab" * 32}  $t/key" | sha256sum -c --quiet' in commands[0]


def test_key_with_another_fingerprint_is_refused_naming_host_setting_and_value():
    remote = (RepositoryKeyFingerprints, frozenset({"url": URL}.items()))
    with pytest.raises(OperationError) as error:
        run_operation(grafana.repository_key, {STATE_KEY: host_state(keyring_fingerprints=[OTHER]),
                                               remote: {"fingerprints": [OTHER], "sha256": "x", "error": None}},
                      url=URL, fingerprint=FPR, setting="gpufleet_monitoring_grafana_repo_key_fingerprint")
    assert str(error.value) == (
        f"testhost: gpufleet_monitoring_grafana_repo_key_fingerprint='{FPR}': the key at {URL} has fingerprint "
        f"{OTHER}; not trusted, nothing was changed")


def test_packaged_defaults_left_alone_and_a_gpufleet_replacement_restored_from_the_package():
    facts = {DebPackages: {"grafana": ["11.6.0"]}}
    commands, noops = run_operation(grafana.packaged_defaults,
                                    {**facts, STATE_KEY: host_state(defaults_first_line="GRAFANA_USER=grafana")})
    assert commands == [] and noops
    commands, _ = run_operation(grafana.packaged_defaults,
                                {**facts, STATE_KEY: host_state(defaults_first_line="# Managed by gpufleet")})
    assert commands == ["rm -f /etc/default/grafana-server && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                        "--reinstall -o Dpkg::Options::=--force-confmiss -o Dpkg::Options::=--force-confold grafana"]
    commands, _ = run_operation(grafana.packaged_defaults, {DebPackages: {}})
    assert commands == []


def test_admin_password_written_at_0640_from_creation_applied_on_stdin_never_in_a_command():
    commands, _ = run_operation(grafana.admin_password, {STATE_KEY: host_state()}, password=PASSWORD)
    tmp = f"{grafana.PASSWORD_FILE}.gpufleet-new"
    assert commands[0] == f"umask 0137 && rm -f {tmp} && : > {tmp} && chgrp grafana {tmp}"
    assert commands[1].startswith(f"upload {tmp}\n")  # the only place the password goes: an upload
    assert "reset-admin-password --password-from-stdin < /etc/grafana/gpufleet-admin-password" in commands[3]
    assert "runuser -u \"$GRAFANA_USER\"" in commands[3] and ". /etc/default/grafana-server" in commands[3]
    for command in (commands[0], *commands[2:]):
        assert PASSWORD not in command


def test_admin_password_noop_only_when_the_marker_matches_and_the_file_is_right():
    marker = grafana.password_marker(PASSWORD)
    good_file = {"mode": "640", "user": "root", "group": "grafana", "size": len(PASSWORD)}
    commands, noops = run_operation(grafana.admin_password,
                                    {STATE_KEY: host_state(password_file=good_file, password_marker=marker)},
                                    password=PASSWORD)
    assert commands == [] and noops == ["the Grafana admin password is applied"]
    for changed in ({"password_marker": grafana.password_marker("another-password-1")},
                    {"password_file": {**good_file, "mode": "644"}}):
        commands, _ = run_operation(grafana.admin_password,
                                    {STATE_KEY: host_state(**{"password_file": good_file, "password_marker": marker,
                                                              **changed})}, password=PASSWORD)
        assert any("reset-admin-password" in c for c in commands)


def test_marker_is_salted_and_never_the_password():
    a, b = grafana.password_marker(PASSWORD), grafana.password_marker(PASSWORD)
    assert a != b and PASSWORD not in a
    assert grafana.marker_matches(a, PASSWORD) and not grafana.marker_matches(a, PASSWORD + "x")
    assert not grafana.marker_matches(None, PASSWORD)


def test_dropin_overrides_grafana_ini_with_gf_variables_and_holds_no_secret():
    text = grafana_dropin(MonitoringSettings(grafana_admin_password=PASSWORD, grafana_listen="10.0.0.5:3001"))
    assert text.splitlines()[1:] == [
        "[Service]",
        'Environment="GF_SERVER_HTTP_ADDR=10.0.0.5"',
        'Environment="GF_SERVER_HTTP_PORT=3001"',
        'Environment="GF_SECURITY_ADMIN_PASSWORD=$__file{/etc/grafana/gpufleet-admin-password}"',
    ]


@pytest.mark.parametrize(("raw", "expected"), [
    ("b53a e77b adb6 30a6 8304 6005 963f a277 1045 8545", FPR),
    (FPR, FPR),
])
def test_fingerprint_setting(raw, expected):
    settings, _, errors = load_monitoring_settings(
        "mon1", {"gpufleet_monitoring_grafana_repo_key_fingerprint": raw})
    assert errors == [] and settings.grafana_repo_key_fingerprint == expected


def test_bad_fingerprint_and_a_password_with_a_line_break_are_refused():
    _, _, errors = load_monitoring_settings("mon1", {"gpufleet_monitoring_grafana_repo_key_fingerprint": "abc",
                                                     "gpufleet_monitoring_grafana_admin_password": "long-enough\nx"})
    assert [str(e).split(";")[0] for e in errors] == [
        "mon1: gpufleet_monitoring_grafana_admin_password='***': contains a line break or NUL",
        "mon1: gpufleet_monitoring_grafana_repo_key_fingerprint='abc': not a key fingerprint"]


class _Node:
    def __init__(self, names):
        self.names = names

    def get_fact(self, fact):
        assert fact is GpuInventory
        return {"gpus": [{"name": n} for n in self.names]}


@pytest.mark.parametrize(("names", "expected"), [
    (["NVIDIA H100 80GB HBM3"] * 8, "h100-sxm"),
    (["NVIDIA GeForce RTX 4090"], "rtx4090"),
    ([], ""),
    (["NVIDIA H100 80GB HBM3", "Some Unknown GPU"], ""),
])
def test_gpu_model_label_from_the_gpus_the_node_reports(names, expected):
    assert gpu_model_of(_Node(names)) == expected
