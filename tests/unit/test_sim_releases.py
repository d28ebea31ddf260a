"""Debian 12 and Debian 13 simulated hosts: the --os / PROFILE@OS options, one base image and one .deb cache per
release, each release's apt sources (no containers needed)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra.facts.apt import AptSourcesFile
from pyinfra_cli.inventory import make_inventory

from gpufleet.cli import main as gpufleet_cli
from gpufleet.sim import hosts, image

MIRROR = "http://deb.debian.org/debian"


# ------------------------------------------------------------------------------------------ options


def test_profiles_take_the_default_os_unless_they_name_one():
    assert hosts.parse_host_specs(["h100-sxm-8", "a100-40gb-1@debian13"]) == [
        ("h100-sxm-8", "debian12"), ("a100-40gb-1", "debian13")]
    assert hosts.parse_host_specs(["h100-sxm-8", "rtx4090-1@debian12"], "debian13") == [
        ("h100-sxm-8", "debian13"), ("rtx4090-1", "debian12")]


@pytest.mark.parametrize("specs, default, message", [
    (["h100-sxm-8@debian11"], "debian12", "--profile 'h100-sxm-8@debian11': unknown OS 'debian11'; allowed: "
                                          "debian12, debian13"),
    (["h100-sxm-8@"], "debian12", "--profile 'h100-sxm-8@': unknown OS ''; allowed: debian12, debian13"),
    (["h100-sxm-8"], "trixie", "--os: unknown OS 'trixie'; allowed: debian12, debian13"),
    (["h100@debian13"], "debian12", "unknown hardware profile 'h100'"),
])
def test_bad_os_or_profile_names_the_entry_and_the_allowed(specs, default, message):
    with pytest.raises(ValueError) as error:
        hosts.parse_host_specs(specs, default)
    assert message in str(error.value)


def test_bad_os_is_refused_before_anything_is_checked_or_created(monkeypatch, tmp_path):
    """Bad input: the message and nothing else (no root check, no state directory)."""
    monkeypatch.setenv("GPUFLEET_SIM_DIR", str(tmp_path / "sim"))
    monkeypatch.setattr(hosts, "check_requirements", lambda: pytest.fail("checked requirements before the input"))
    with pytest.raises(ValueError, match="unknown OS 'debian11'"):
        hosts.up(2, ["h100-sxm-8", "rtx4090-1@debian11"])
    assert not (tmp_path / "sim").exists()


def test_cli_os_option_lists_the_releases(monkeypatch):
    result = CliRunner().invoke(gpufleet_cli, ["sim", "up", "--os", "debian11"])
    assert result.exit_code == 2
    assert "'debian11' is not one of 'debian12', 'debian13'" in result.output
    monkeypatch.setattr(hosts, "check_requirements", lambda: pytest.fail("checked requirements before the input"))
    result = CliRunner().invoke(gpufleet_cli, ["sim", "up", "--profile", "h100-sxm-8@sid"])
    assert result.exit_code == 2
    assert "gpufleet sim: --profile 'h100-sxm-8@sid': unknown OS 'sid'; allowed: debian12, debian13" in result.output


def test_hosts_get_profile_and_os_round_robin(monkeypatch, tmp_path):
    """``up`` assigns (profile, os) pairs round-robin, as it did profiles; stopped before any container starts."""
    monkeypatch.setenv("GPUFLEET_SIM_DIR", str(tmp_path))
    monkeypatch.setattr(hosts, "check_requirements", lambda: None)

    class Stop(Exception):
        pass

    def stop(fleet, log):
        raise Stop(fleet)

    monkeypatch.setattr(hosts, "_prepare_control", stop)
    monkeypatch.setattr(hosts, "down", lambda log: [])
    with pytest.raises(Stop) as stopped:
        hosts.up(3, ["h100-sxm-8@debian13", "rtx4090-1"], net="10.77.250", log=lambda *_: None)
    fleet = stopped.value.args[0]
    assert [(h.name, h.profile, h.os) for h in fleet.hosts] == [
        ("node01", "h100-sxm-8", "debian13"), ("node02", "rtx4090-1", "debian12"), ("node03", "h100-sxm-8", "debian13")]
    saved = json.loads((tmp_path / "fleet.json").read_text())
    assert [h["os"] for h in saved["hosts"]] == ["debian13", "debian12", "debian13"]


def test_a_fleet_saved_before_releases_existed_is_debian_12(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUFLEET_SIM_DIR", str(tmp_path))
    (tmp_path / "fleet.json").write_text(json.dumps({
        "hosts": [{"name": "node01", "index": 0, "address": "10.77.0.11", "profile": "h100-sxm-8"}],
        "net": "10.77.0", "repo_url": "http://10.77.0.1:8731", "driver": None}))
    assert hosts.Fleet.load().hosts[0].os == "debian12"


def test_inventory_names_each_hosts_os_in_its_data(tmp_path, monkeypatch):
    """Host data, not groups: every ``sim_*`` group stays a list of (host, data), as inventories that read the
    generated one expect (tests/sim/test_monitoring.py does)."""
    monkeypatch.setenv("GPUFLEET_SIM_DIR", str(tmp_path))
    fleet = hosts.Fleet(
        hosts=[hosts.Host("node01", 0, "10.77.0.11", "h100-sxm-8", "debian13"),
               hosts.Host("node02", 1, "10.77.0.12", "rtx4090-1")],
        net="10.77.0", repo_url="http://10.77.0.1:8731", driver=None)
    path = tmp_path / "inventory.py"
    hosts.write_inventory(fleet, path)
    with ctx_state.use(State()):
        inventory = make_inventory(str(path), cwd=str(tmp_path))
    assert inventory.get_host("node01").data.gpufleet_sim_os == "debian13"
    assert inventory.get_host("node02").data.gpufleet_sim_os == "debian12"
    namespace: dict = {}
    exec(path.read_text(), namespace)
    assert all(len(entry) == 2 for key, group in namespace.items() if key.startswith("sim_") for entry in group)


# ------------------------------------------------------------------------------------------- caches


def test_each_release_has_its_own_base_image_and_deb_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUFLEET_SIM_CACHE", str(tmp_path))
    bookworm, trixie = image.base_tar("debian12"), image.base_tar("debian13")
    assert bookworm.parent == trixie.parent == tmp_path
    assert bookworm.name.startswith("base-bookworm-") and trixie.name.startswith("base-trixie-")
    assert image.cache_key("debian12") != image.cache_key("debian13")
    assert image.deb_cache_dir("debian12") == tmp_path / "debs-bookworm"
    assert image.deb_cache_dir("debian13") == tmp_path / "debs-trixie"
    assert hosts.base_dir("debian12") != hosts.base_dir("debian13")


def test_a_cached_release_is_not_built_again_and_the_other_is_built_once(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUFLEET_SIM_CACHE", str(tmp_path))
    image.base_tar("debian12").write_bytes(b"cached")
    built = []

    def debootstrap(rel, target, log):
        built.append(rel.suite)
        target.write_bytes(b"built")

    monkeypatch.setattr(image, "_debootstrap", debootstrap)
    assert image.build("debian12", log=lambda *_: None).read_bytes() == b"cached"
    assert image.build("debian13", log=lambda *_: None) == image.base_tar("debian13")
    assert image.build("debian13", log=lambda *_: None).read_bytes() == b"built"
    assert built == ["trixie"]


# ---------------------------------------------------------------------------------------- the images


def test_debian_12_keeps_one_line_sources():
    sources = image.apt_sources(image.release("debian12"), MIRROR)
    assert sources == {"etc/apt/sources.list": (
        "deb http://deb.debian.org/debian bookworm main\n"
        "deb http://deb.debian.org/debian bookworm-updates main\n"
        "deb http://deb.debian.org/debian-security bookworm-security main\n")}


def test_debian_13_lists_its_archive_in_deb822_sources_as_its_images_do():
    sources = image.apt_sources(image.release("debian13"), MIRROR)
    assert sources["etc/apt/sources.list"] is None  # debootstrap's one-line file goes
    text = sources["etc/apt/sources.list.d/debian.sources"]
    # read back by pyinfra's own deb822 parser (what apt.repo and the AptSources fact use)
    stanzas = [AptSourcesFile.from_deb822_lines(block.splitlines()) for block in text.split("\n\n")]
    assert [(s.types, s.uris, s.suites, s.components, s.signed_by) for s in stanzas] == [
        (["deb"], [MIRROR], ["trixie", "trixie-updates"], ["main"], [image.ARCHIVE_KEYRING]),
        (["deb"], ["http://deb.debian.org/debian-security"], ["trixie-security"], ["main"], [image.ARCHIVE_KEYRING]),
    ]


def test_debootstrap_script_falls_back_to_sid_for_a_release_it_does_not_know(tmp_path):
    (tmp_path / "sid").write_text("# the script of every release since etch\n")
    (tmp_path / "bookworm").symlink_to("sid")
    assert image.debootstrap_script("bookworm", tmp_path) == []
    assert image.debootstrap_script("trixie", tmp_path) == [str(tmp_path / "sid")]
    (tmp_path / "sid").unlink()
    with pytest.raises(FileNotFoundError, match="debootstrap has no script for 'trixie'"):
        image.debootstrap_script("trixie", tmp_path)
