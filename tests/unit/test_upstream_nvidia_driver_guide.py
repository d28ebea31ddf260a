"""NVIDIA's driver install method (tests/reference/upstream/nvidia-driver-guide/facts.json) held to the product's
naming rules, its default key file and the simulator's repository: a product that renames NVIDIA's driver
metapackage, its pinning package or the repository key file fails here (and on the simulated fleet, whose repository
publishes only the recorded names)."""

from __future__ import annotations

import pytest

from gpufleet.operations import _packaging as pkg
from gpufleet.sim import nvidia_record, repo
from tests.upstream import facts

GUIDE = facts("nvidia-driver-guide")
INSTALL = GUIDE["apt_driver_install"]
BRANCHES = ["535", "570", "580", "590", "610"]


def distro(os_id: str, version: str) -> dict:
    return {"name": os_id.capitalize(), "major": int(version.split(".")[0]),
            "release_meta": {"ID": os_id, "VERSION_ID": version}}


@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("flavour", pkg.FLAVOURS)
def test_nvidias_naming_installs_the_guides_metapackage_and_pinning_package(branch, flavour):
    assert pkg.driver_package(branch, flavour, "nvidia") == INSTALL["metapackage"][flavour]
    assert pkg.pinning_package(branch, "nvidia") == INSTALL["pinning_package"].format(branch=branch)
    assert pkg.pinning_package(branch, "ubuntu") is None  # Ubuntu's archive names carry the branch


def test_the_guides_statements_back_the_derived_rule():
    recent = " ".join(GUIDE["documents"]["recent_updates"]["statements"])
    assert "Driver pinning packages have been introduced for Debian and Ubuntu" in recent
    container = GUIDE["gpu_driver_container"]
    assert container["pinning_package"]["value"] == INSTALL["pinning_package"].replace("{branch}", "${DRIVER_VERSION}")
    assert INSTALL["metapackage"]["open"] in container["open_names"]["value"].split()
    assert INSTALL["metapackage"]["proprietary"] in container["proprietary_names"]["value"].split()
    assert INSTALL["keyring_package"] in container["keyring_package"]["value"]
    renames = GUIDE["documents"]["recent_updates"]["ubuntu_590_renames"]
    assert INSTALL["metapackage"]["proprietary"] in renames["no_change"]
    assert "cuda-drivers-580" in renames["removed"]


def test_the_ubuntu_590_names_are_under_the_branch_pin():
    """From 590 NVIDIA's Ubuntu packages carry no branch: the pin (the second guard) must name each of them."""
    renamed = set(GUIDE["documents"]["recent_updates"]["ubuntu_590_renames"]["renamed"].values())
    names = set(pkg.apt_pin("590").split("Package: ", 1)[1].split("\n", 1)[0].split())
    assert renamed <= names


def test_the_older_names_are_recognised_and_replaced():
    """Hosts converged with gpufleet's earlier names (nvidia-open-<branch>, cuda-drivers-<branch>) and NVIDIA's
    pinning packages of other branches are found for removal in the driver's transaction."""
    for name in ("nvidia-open-580", "cuda-drivers-580", *INSTALL["metapackage"].values()):
        assert pkg.is_apt_driver_selector(name)
    assert pkg.is_apt_pinning(INSTALL["pinning_package"].format(branch="570"))
    assert pkg.selector_flavour(INSTALL["metapackage"]["open"]) == "open"
    assert pkg.selector_flavour(INSTALL["metapackage"]["proprietary"]) == "proprietary"


@pytest.mark.parametrize("os_id, version, key", [("debian", "12", "default"), ("ubuntu", "24.04", "default"),
                                                  ("debian", "13", "debian13")])
def test_the_default_key_file_is_the_recorded_one(os_id, version, key):
    url = pkg.default_keyring_url("https://mirror.example/x86_64/", pkg.APT, distro(os_id, version))
    assert url == "https://mirror.example/x86_64/" + GUIDE["apt_key_files"][key]["value"]


def test_the_simulated_repository_publishes_the_records_names_per_branch():
    offered = {(name, version.split(".")[0]) for name, version, _rev, _kind in repo.packages()}
    for branch in repo.BRANCHES:
        for flavour in pkg.FLAVOURS:
            assert (INSTALL["metapackage"][flavour], branch) in offered
            assert (nvidia_record.kernel_module_package(branch, flavour), branch) in offered
        assert (INSTALL["pinning_package"].format(branch=branch), branch) in offered
    assert not any(name.startswith("nvidia-open-") for name, _ in offered)  # no NVIDIA source names it
    assert nvidia_record.key_files() == sorted(v["value"] for v in GUIDE["apt_key_files"].values())


@pytest.mark.parametrize("branch, flavour, module", [("580", "open", "nvidia-dkms-580-open"),
                                                     ("580", "proprietary", "nvidia-dkms-580"),
                                                     ("610", "open", "nvidia-dkms-open"),
                                                     ("610", "proprietary", "nvidia-dkms")])
def test_the_simulated_kernel_module_package_follows_the_590_renames(branch, flavour, module):
    renames = GUIDE["documents"]["recent_updates"]["ubuntu_590_renames"]["renamed"]
    assert module in {*renames, *renames.values()} or module.replace(branch, "580") in renames
    assert nvidia_record.kernel_module_package(branch, flavour) == module
