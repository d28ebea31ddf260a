"""Preflight of the driver repository (issue 7 item 3): the repository answers from the node and offers the branch
(and the fabric manager of the driver's exact version on NVSwitch systems), asked only when something is to be
installed."""

from __future__ import annotations

from pyinfra.facts.server import Arch
from pyinfra_harness import FakeHost, wrap
from test_preflight import hgx_h100_no_driver, rtx4090_no_driver

from gpufleet.config import load_node_config
from gpufleet.facts.repository import AptRepositoryIndex, parse_index
from gpufleet.facts.system import Distribution
from gpufleet.preflight import HostFacts
from gpufleet.preflight_repository import branch_versions, check_driver_repository

URL = "http://10.77.23.1:8731/"
DEBIAN = {"name": "Debian", "major": 12, "release_meta": {"ID": "debian", "VERSION_ID": "12"}}
# a repository index as apt-helper fetches it on a host (Package/Version lines), named as NVIDIA's CUDA repository
# names its packages: the driver metapackages and pinning packages as NVIDIA's guide installs them, the fabric
# manager with the branch up to 575, plain nvidia-fabricmanager from 580 on
SIM_INDEX = """\
Package: cuda-drivers
Version: 570.172.08-1
Package: cuda-drivers
Version: 580.95.05-1
Package: nvidia-fabricmanager-570
Version: 570.172.08-1
Package: nvidia-fabricmanager
Version: 580.95.05-1
Package: nvidia-open
Version: 570.172.08-1
Package: nvidia-open
Version: 580.95.05-1
Package: nvidia-driver-pinning-570
Version: 570.172.08-1
Package: nvidia-driver-pinning-580
Version: 580.95.05-1
"""


def index(text: str = SIM_INDEX, rc: int = 0) -> dict:
    return AptRepositoryIndex().process(wrap("index", text, rc=rc))


def check(facts: HostFacts, repo: dict, **data) -> tuple[list[str], FakeHost]:
    config = load_node_config("node01", {"gpufleet_driver_repo_url": URL, **data})
    host = FakeHost("node01", {Distribution: DEBIAN, Arch: "x86_64",
                               (AptRepositoryIndex, frozenset({"url": URL}.items())): repo})
    return [e.message for e in check_driver_repository(host, config, facts)], host


def test_index_lines_parse_to_versions_per_package():
    assert parse_index(SIM_INDEX.splitlines())["nvidia-open"] == ["570.172.08-1", "580.95.05-1"]
    assert branch_versions({"nvidia-open-580": ["580.65.06-1", "580.95.05-1", "570.1-1"]}, "nvidia-open-580",
                           "580") == ["580.95.05-1", "580.65.06-1"]


def test_repository_offering_the_branch_and_fabric_manager_passes():
    assert check(hgx_h100_no_driver(), index())[0] == []


def test_repository_that_does_not_answer_is_an_error_naming_the_url():
    failed = index("E: Failed to fetch http://10.77.23.1:8731/Packages  Could not connect to 10.77.23.1:8731", rc=100)
    assert check(rtx4090_no_driver(), failed)[0] == [
        f"node01: gpufleet_driver_repo_url={URL!r}: the driver repository {URL} does not answer from the node: "
        "E: Failed to fetch http://10.77.23.1:8731/Packages  Could not connect to 10.77.23.1:8731; allowed: a "
        "repository this node can download from (NVIDIA's or a mirror)"]


def test_branch_not_offered_names_the_branches_that_are():
    assert check(rtx4090_no_driver(), index(), gpufleet_driver_branch="590")[0] == [
        f"node01: gpufleet_driver_branch='590': the driver repository {URL} offers no nvidia-open of branch 590; "
        "allowed: a branch the repository offers (570, 580)"]


def test_nvswitch_system_needs_the_fabric_manager_of_the_drivers_version():
    text = SIM_INDEX.replace("nvidia-fabricmanager\nVersion: 580.95.05-1", "nvidia-fabricmanager\nVersion: "
                             "580.65.06-1")
    assert check(hgx_h100_no_driver(), index(text))[0] == [
        "node01: gpufleet_driver_branch='580': the driver repository http://10.77.23.1:8731/ offers nvidia-open "
        "580.95.05 but no nvidia-fabricmanager of that version (NVSwitch system); allowed: a repository with "
        "nvidia-fabricmanager 580.95.05 (the fabric manager must be exactly the driver's version)"]
    assert check(rtx4090_no_driver(), index(text))[0] == []  # no NVSwitch: no fabric manager


def test_fabric_manager_name_follows_the_branch_and_naming_style():
    """NVIDIA's repository: ``nvidia-fabricmanager-570`` for 570, plain ``nvidia-fabricmanager`` for 580 (a repository
    offering only ``nvidia-fabricmanager-580`` does not serve NVIDIA's naming); Ubuntu's names keep the branch."""
    assert check(hgx_h100_no_driver(), index(), gpufleet_driver_branch="570")[0] == []
    suffixed_only = SIM_INDEX.replace("nvidia-fabricmanager\n", "nvidia-fabricmanager-580\n")
    assert "no nvidia-fabricmanager of that version" in check(hgx_h100_no_driver(), index(suffixed_only))[0][0]
    ubuntu = suffixed_only + "Package: nvidia-driver-580-server-open\nVersion: 580.95.05-1\n"
    assert check(hgx_h100_no_driver(), index(ubuntu), gpufleet_driver_packages_style="ubuntu")[0] == []
    assert "no nvidia-fabricmanager-580 of that version" in check(
        hgx_h100_no_driver(), index(ubuntu.replace("nvidia-fabricmanager-580\n", "nvidia-fabricmanager\n")),
        gpufleet_driver_packages_style="ubuntu")[0][0]


def test_installed_driver_needs_no_repository_round_trip():
    held = {"version": "580.95.05-1", "status": "hi ", "installed": True, "held": True}
    installed = {"manager": "dpkg", "packages": {"nvidia-open": held, "nvidia-driver-pinning-580": held},
                 "held": ["nvidia-driver-pinning-580", "nvidia-open"], "error": None}
    facts = HostFacts(os=rtx4090_no_driver().os, pci=rtx4090_no_driver().pci, packages=installed)
    errors, host = check(facts, index("E: unreachable", rc=100))
    assert errors == []
    assert not any(isinstance(call, tuple) and call[0] is AptRepositoryIndex for call in host.fact_calls)


def test_driver_stage_off_reads_nothing():
    errors, host = check(rtx4090_no_driver(), index("E: unreachable", rc=100),
                         gpufleet_stages=["persistence", "power"])
    assert errors == [] and host.fact_calls == []


def test_nvidias_naming_needs_the_branchs_pinning_package():
    """NVIDIA's guide tracks a branch with ``nvidia-driver-pinning-<branch>`` (nvidia-driver-guide/facts.json):
    a repository without it is refused before any host changes; Ubuntu's naming does not use it."""
    without = SIM_INDEX.replace("Package: nvidia-driver-pinning-580\nVersion: 580.95.05-1\n", "")
    assert check(rtx4090_no_driver(), index(without))[0] == [
        f"node01: gpufleet_driver_branch='580': the driver repository {URL} offers nvidia-open but not "
        "nvidia-driver-pinning-580, which tracks the branch; allowed: a repository with NVIDIA's pinning package "
        "nvidia-driver-pinning-580 (or gpufleet_driver_packages_style: ubuntu)"]
    ubuntu = without + "Package: nvidia-driver-580-server-open\nVersion: 580.95.05-1\n"
    assert check(rtx4090_no_driver(), index(ubuntu), gpufleet_driver_packages_style="ubuntu")[0] == []


def test_nvidias_unsuffixed_driver_of_another_branch_asks_the_repository():
    held = {"version": "570.172.08-1", "status": "hi ", "installed": True, "held": True}
    installed = {"manager": "dpkg", "packages": {"nvidia-open": held, "nvidia-driver-pinning-570": held},
                 "held": ["nvidia-driver-pinning-570", "nvidia-open"], "error": None}
    facts = HostFacts(os=rtx4090_no_driver().os, pci=rtx4090_no_driver().pci, packages=installed)
    assert "does not answer from the node" in check(facts, index("E: unreachable", rc=100))[0][0]
