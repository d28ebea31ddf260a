"""NVIDIA's packaging held to tests/reference/upstream: nvidia-persistenced's unit and user per packaging source
(Debian's package verbatim, NVIDIA's own init template and Ubuntu driver packaging as recorded facts) in the
persistence stage's drop-in and the simulator's driver packages; the fabric manager's package name by branch and
naming style in the product's naming rules and the simulator's repository."""

from __future__ import annotations

import re
import shlex

import pytest

from gpufleet.operations import _packaging as pkg
from gpufleet.operations import persistence
from gpufleet.sim import repo
from tests.upstream import debian_unit_path, facts, read, recorded, systemd_unit

NVIDIA_TEMPLATE = "nvidia-packaging/nvidia-persistenced/init/systemd/nvidia-persistenced.service.template"
UBUNTU_PACKAGING = ("nvidia-packaging/ubuntu-packaging-nvidia-driver/debian/templates/"
                    "nvidia-compute-utils-flavour.nvidia-persistenced.service.in")
PACKAGING = facts("nvidia-packaging")


def unit_text(sections: dict[str, list[tuple[str, str]]]) -> str:
    """A unit file with these directives (a recorded unit as it would be installed)."""
    return "".join(f"[{name}]\n" + "".join(f"{key}={value}\n" for key, value in items) + "\n"
                   for name, items in sections.items())


def nvidia_template_installed() -> str:
    """NVIDIA's template as its install.sh installs it: ``__USER__`` replaced by the user it creates by default."""
    placeholder = PACKAGING["persistenced_unit_user_placeholder"]["value"]
    user = PACKAGING["persistenced_default_user"]["value"]
    return unit_text(systemd_unit(NVIDIA_TEMPLATE)).replace(placeholder, user)


def debian_postinst_user(suite: str) -> str:
    """The system user Debian's postinst creates (``adduser --system ... NAME``)."""
    postinst = read(f"debian/{suite}/nvidia-persistenced/DEBIAN/postinst")
    return re.search(r"adduser --system .*?\\?\n(?:\s+--[^\n]*\n)*\s+(\S+)\n", postinst).group(1)


def drop_in_command(unit: str | None, persistence_mode: bool = True) -> list[str]:
    lines = persistence.drop_in_text(unit, persistence_mode).splitlines()
    assert lines[lines.index("[Service]") + 1] == "ExecStart="  # clears the packaged command first
    return shlex.split(lines[lines.index("ExecStart=") + 1].partition("=")[2])


# ---------------------------------------------------------------------------------------- nvidia-persistenced


@pytest.mark.parametrize("suite", ["bookworm", "trixie"])
def test_drop_in_on_debian_keeps_the_nvpd_user_its_postinst_creates(suite):
    unit = read(debian_unit_path(suite, "nvidia-persistenced", "nvidia-persistenced.service"))
    user = debian_postinst_user(suite)
    assert user == "nvpd"
    assert drop_in_command(unit) == ["/usr/bin/nvidia-persistenced", "--user", user, "--persistence-mode"]
    assert drop_in_command(unit, False) == ["/usr/bin/nvidia-persistenced", "--user", user, "--no-persistence-mode"]


def test_drop_in_with_nvidias_template_keeps_the_user_install_sh_substitutes():
    assert drop_in_command(nvidia_template_installed()) == [
        "/usr/bin/nvidia-persistenced", "--user", "nvidia-persistenced", "--persistence-mode"]


def test_drop_in_with_ubuntu_packaging_names_no_user_as_the_packaged_unit():
    command = drop_in_command(unit_text(systemd_unit(UBUNTU_PACKAGING)))
    assert command == ["/usr/bin/nvidia-persistenced", "--verbose", "--persistence-mode"]
    assert "--user" not in command


def test_drop_in_replaces_a_packaged_persistence_flag():
    unit = "[Service]\nExecStart=/usr/bin/nvidia-persistenced --user x --no-persistence-mode --verbose\n"
    assert drop_in_command(unit) == ["/usr/bin/nvidia-persistenced", "--user", "x", "--verbose", "--persistence-mode"]


@pytest.mark.parametrize("flag", ["--user", "--group", "--persistence-mode", "--no-persistence-mode", "--verbose"])
def test_flags_the_drop_in_may_carry_are_the_packaged_binarys(flag):
    help_text = read("debian/trixie/nvidia-persistenced/help.txt")
    assert re.search(rf"(^|[\s,]){re.escape(flag)}([\s,=]|$)", help_text, re.M)


def test_the_unit_systemd_loads_is_read_in_systemds_order():
    directories = ("/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")
    assert persistence.PACKAGED_UNITS == tuple(f"{d}/nvidia-persistenced.service" for d in directories)
    # Debian 12 ships it under lib/, Debian 13 under usr/lib/: both among the paths read
    for suite in ("bookworm", "trixie"):
        installed = "/" + debian_unit_path(suite, "nvidia-persistenced", "nvidia-persistenced.service").split("/", 3)[3]
        assert installed in persistence.PACKAGED_UNITS


def sim_unit(package: str) -> dict[str, list[tuple[str, str]]]:
    """The simulated driver package's nvidia-persistenced unit, as systemd reads it."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in repo.persistenced_unit(package).splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
        else:
            key, _, value = line.partition("=")
            current.append((key, value))
    return sections


def without_prose(sections: dict) -> dict:
    return {name: [(k, v) for k, v in items if k not in ("Description", "Documentation")]
            for name, items in sections.items()}


@pytest.mark.parametrize("package", ["nvidia-driver-580-server-open", "nvidia-driver-570-server", "nvidia-driver-580"])
def test_simulated_ubuntu_style_driver_carries_ubuntu_packagings_unit(package):
    assert without_prose(sim_unit(package)) == systemd_unit(UBUNTU_PACKAGING)
    assert repo.persistenced_user(package) is None  # runs as root: no user to create


@pytest.mark.parametrize("package", ["nvidia-open", "cuda-drivers"])
def test_simulated_cuda_repository_driver_carries_nvidias_template_and_creates_its_user(package):
    user = PACKAGING["persistenced_default_user"]["value"]
    expected = {name: [(k, v.replace(PACKAGING["persistenced_unit_user_placeholder"]["value"], user))
                       for k, v in items] for name, items in systemd_unit(NVIDIA_TEMPLATE).items()}
    assert without_prose(sim_unit(package)) == expected
    assert repo.persistenced_user(package) == user


# ------------------------------------------------------------------------------------------ fabric manager


def fabricmanager_rule(branch: str, style: str) -> str:
    """The rule as the recorded facts state it: the CUDA repository drops the suffix from branch 580 on (the
    evidence's first value), Ubuntu's archive keeps it (``nvidia-fabricmanager-${DRIVER_BRANCH}``)."""
    evidence = PACKAGING["fabricmanager_package_by_branch"]["evidence"]
    threshold, unsuffixed, suffixed = (int(evidence[0]["value"]), evidence[1]["value"], evidence[2]["value"])
    assert "nvidia-fabricmanager-${DRIVER_BRANCH}" in PACKAGING["ubuntu_archive_names"]["fabric_manager"]
    if style == "nvidia" and int(branch) >= threshold:
        return unsuffixed
    return suffixed.replace("${DRIVER_BRANCH}", branch)


@pytest.mark.parametrize("branch", ["535", "570", "575", "580", "590", "610"])
@pytest.mark.parametrize("style", pkg.STYLES)
def test_fabric_manager_package_follows_the_recorded_rule(branch, style):
    assert pkg.fabricmanager_package(branch, style) == fabricmanager_rule(branch, style)


def test_every_fabric_manager_name_is_recognised_and_the_dev_package_is_not():
    for name in ("nvidia-fabricmanager", "nvidia-fabricmanager-570", "nvidia-fabricmanager-580"):
        assert pkg.is_apt_fabricmanager(name)
    assert not pkg.is_apt_fabricmanager("nvidia-fabricmanager-dev")
    assert not pkg.is_apt_fabricmanager("nvidia-fabricmanager-dev-570")


@pytest.mark.parametrize("branch", ["570", "580"])
def test_the_branch_pin_admits_the_branchs_fabric_manager_under_both_namings(branch):
    names = pkg.apt_pin(branch).split("Package: ", 1)[1].split("\n", 1)[0].split()
    assert {pkg.fabricmanager_package(branch, style) for style in pkg.STYLES} <= set(names)


def test_suffixed_fabric_manager_replaces_the_unsuffixed_name_in_nvidias_template():
    template = recorded("nvidia-packaging/apt-packaging-fabric-manager/debian/templates/control.in")
    package = template["packages"]["nvidia-fabricmanager-#BRANCH#"]
    for field in ("Provides", "Conflicts", "Replaces"):
        assert package[field] == ["nvidia-fabricmanager"]


def test_simulated_repository_names_fabric_managers_as_upstream_does():
    offered = {(name, version.split(".")[0]) for name, version, _rev, kind in repo.packages()
               if kind == "fabricmanager"}
    expected = {(fabricmanager_rule(branch, style), branch) for branch in repo.BRANCHES for style in pkg.STYLES}
    assert offered == expected
