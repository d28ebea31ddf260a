"""gpufleet.operations._repo_keys: a repository key installed only when its fingerprint is the expected one; the
command run by a real sh with the control machine's gpg and curl (file:// URL), on a key made for this test
(tests/fixtures/keys/test-repo-key.asc, generated with gpg --quick-gen-key, fingerprint below)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpufleet.operations import _repo_keys

KEY = Path(__file__).resolve().parents[1] / "fixtures" / "keys" / "test-repo-key.asc"
KEY_FINGERPRINT = "54A216CD8049E7B421E56C90C64957E802A72660"
needs_tools = pytest.mark.skipif(not (shutil.which("gpg") and shutil.which("curl")), reason="gpg and curl needed")


def run(command) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("given", "expected"), [
    ("EB69 3B30 35CD 5710 E231 E123 A4B4 6996 3BF8 63CC", _repo_keys.NVIDIA_APT_KEY_FINGERPRINT),
    ("0xeb693b3035cd5710e231e123a4b469963bf863cc", _repo_keys.NVIDIA_APT_KEY_FINGERPRINT),
    ("3BF863CC", None), ("A4B469963BF863CC", None), ("EB69;reboot", None), (None, None),
])
def test_only_full_fingerprints_are_accepted(given, expected):
    assert _repo_keys.normalise_fingerprint(given) == expected


@needs_tools
def test_a_key_with_the_expected_fingerprint_is_installed(tmp_path):
    dest = tmp_path / "keyrings" / "vendor.asc"
    result = run(_repo_keys.fetch_checked_key(KEY.as_uri(), str(dest), KEY_FINGERPRINT))
    assert result.returncode == 0, result.stderr
    assert dest.read_bytes() == KEY.read_bytes() and dest.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in dest.parent.iterdir()] == ["vendor.asc"]  # no temporary file left
    found = subprocess.run(["sh", "-c", _repo_keys.fingerprints_script(str(dest))], capture_output=True, text=True)
    assert found.stdout.split() == [KEY_FINGERPRINT]


@needs_tools
def test_a_key_with_another_fingerprint_is_refused_and_not_installed(tmp_path):
    dest = tmp_path / "vendor.asc"
    dest.write_text("the key that was there\n")
    result = run(_repo_keys.fetch_checked_key(KEY.as_uri(), str(dest), _repo_keys.NVIDIA_APT_KEY_FINGERPRINT,
                                              setting="gpufleet_driver_repo_key_fingerprint"))
    assert result.returncode == 1
    assert (f"has the fingerprint(s) {KEY_FINGERPRINT}, not {_repo_keys.NVIDIA_APT_KEY_FINGERPRINT} "
            "(gpufleet_driver_repo_key_fingerprint): not installed") in result.stderr
    assert dest.read_text() == "the key that was there\n"
    assert [p.name for p in tmp_path.iterdir()] == ["vendor.asc"]


def test_a_present_key_is_kept_only_with_the_fingerprint():
    assert _repo_keys.key_is_trusted({"fingerprints": [KEY_FINGERPRINT]}, KEY_FINGERPRINT)
    assert not _repo_keys.key_is_trusted({"fingerprints": [KEY_FINGERPRINT]}, _repo_keys.NVIDIA_APT_KEY_FINGERPRINT)
    assert not _repo_keys.key_is_trusted(None, KEY_FINGERPRINT)


def test_the_setting_is_normalised_and_a_short_key_id_refused():
    from gpufleet.config import ConfigErrors, load_node_config

    config = load_node_config("n1", {"gpufleet_driver_repo_key_fingerprint":
                                     "EB69 3B30 35CD 5710 E231 E123 A4B4 6996 3BF8 63CC"})
    assert config.driver.repo_key_fingerprint == _repo_keys.NVIDIA_APT_KEY_FINGERPRINT
    with pytest.raises(ConfigErrors, match="n1: gpufleet_driver_repo_key_fingerprint='3BF863CC': "
                                           "not a key fingerprint"):
        load_node_config("n1", {"gpufleet_driver_repo_key_fingerprint": "3BF863CC"})


def test_nvidias_fingerprints_are_the_ones_nvidia_documents():
    from tests import upstream

    facts = upstream.recorded("nvidia-cuda-repo-management/SIGNATURES.md")["statements"]
    assert _repo_keys.normalise_fingerprint(facts["apt_key_fingerprint"]["value"]) == \
        _repo_keys.NVIDIA_APT_KEY_FINGERPRINT
    assert _repo_keys.normalise_fingerprint(facts["rpm_key_fingerprint"]["value"]) == \
        _repo_keys.NVIDIA_RPM_KEY_FINGERPRINT
    assert facts["apt_key_file"]["value"] == "3bf863cc.pub"  # the default key URL's file (operations/_packaging.py)
