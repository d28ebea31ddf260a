"""dcgm-exporter only where apt has it for the host (issue 29 item 2): ``auto`` chooses it where the exporter is
installed, apt's candidate, or in the NVIDIA repository the stage configures for the host's OS, and says why not
otherwise; preflight refuses an explicit ``dcgm`` (or a pinned release) where apt has none, before any change."""

from __future__ import annotations

from pyinfra.facts.server import Arch
from pyinfra_harness import FakeHost, wrap

from gpufleet.config import load_node_config
from gpufleet.facts.exporters import AptCandidate
from gpufleet.facts.packages import DebSelections
from gpufleet.facts.repository import AptRepositoryIndex
from gpufleet.facts.system import Distribution
from gpufleet.preflight_repository import check_dcgm_exporter, dcgm_exporter_offer

EXPORTER = "datacenter-gpu-manager-exporter"
TRIXIE = {"name": "Debian", "major": 13, "release_meta": {"ID": "debian", "VERSION_ID": "13"}}
NVIDIA = "https://developer.download.nvidia.com/compute/cuda/repos/debian13/x86_64/"
WITH_DCGM = "Package: nvidia-open\nVersion: 590.48.01-1\nPackage: datacenter-gpu-manager-exporter\n" \
            "Version: 1:4.2.3-4.1.3-1\nPackage: datacenter-gpu-manager-exporter\nVersion: 1:4.5.3-4.8.2-1\n"
WITHOUT_DCGM = "Package: nvidia-open\nVersion: 590.48.01-1\n"


def host(index: str, candidate: str | None = None, installed: str | None = None) -> FakeHost:
    return FakeHost("gpu13", {
        Distribution: TRIXIE, Arch: "x86_64",
        (AptCandidate, frozenset({"package": EXPORTER}.items())): candidate,
        (DebSelections, frozenset({"packages": ("datacenter-gpu-manager-4-core", EXPORTER)}.items())):
            {EXPORTER: {"version": installed, "held": False}} if installed else {},
        (AptRepositoryIndex, frozenset({"url": NVIDIA}.items())): AptRepositoryIndex().process(wrap("index", index)),
    })


def messages(data: dict, fake: FakeHost) -> list[str]:
    return [e.message for e in check_dcgm_exporter(fake, load_node_config("gpu13", data))]


def test_a_debian_13_host_whose_repository_has_no_dcgm_exporter_gets_none_and_the_reason():
    config = load_node_config("gpu13", {})
    assert dcgm_exporter_offer(host(WITHOUT_DCGM), config) == (
        None, f"the NVIDIA repository {NVIDIA} has no {EXPORTER}")
    assert dcgm_exporter_offer(host(WITH_DCGM), config) == ("1:4.2.3-4.1.3-1", "")
    # apt's candidate (a repository already configured) and an installed exporter answer without the index
    assert dcgm_exporter_offer(host(WITHOUT_DCGM, candidate="1:4.5.3-4.8.2-1"), config)[0] == "1:4.5.3-4.8.2-1"
    assert dcgm_exporter_offer(host(WITHOUT_DCGM, installed="1:4.5.3-4.8.2-1"), config)[0] == "1:4.5.3-4.8.2-1"


def test_explicit_dcgm_without_a_dcgm_exporter_is_refused_naming_host_key_value_and_why():
    assert messages({"gpufleet_exporters_gpu": "dcgm"}, host(WITHOUT_DCGM)) == [
        "gpu13: gpufleet_exporters_gpu='dcgm': no dcgm-exporter for this host: the NVIDIA repository "
        f"{NVIDIA} has no {EXPORTER}; allowed: auto or nvml (gpufleet's NVML exporter) where apt has no "
        "dcgm-exporter for the host"]
    assert messages({"gpufleet_exporters_gpu": "dcgm"}, host(WITH_DCGM)) == []
    assert messages({}, host(WITHOUT_DCGM)) == []  # auto: the NVML exporter, no error
    assert messages({"gpufleet_exporters_gpu": "dcgm", "gpufleet_stages": ["driver"]}, host(WITHOUT_DCGM)) == []


def test_a_pinned_release_the_repository_lacks_is_refused():
    data = {"gpufleet_dcgm_exporter_version": "4.2.0-4.1.0"}
    assert messages(data, host(WITH_DCGM)) == [
        "gpu13: gpufleet_dcgm_exporter_version='4.2.0-4.1.0': no dcgm-exporter of that release for this host: the "
        f"NVIDIA repository {NVIDIA} has {EXPORTER} 1:4.2.3-4.1.3-1, 1:4.5.3-4.8.2-1, not release 4.2.0-4.1.0; "
        "allowed: a release the repository offers, or unset"]
    assert messages({"gpufleet_dcgm_exporter_version": "4.2.3-4.1.3"}, host(WITH_DCGM)) == []
    assert messages(data, host(WITHOUT_DCGM)) == []  # auto, and no dcgm-exporter at all: the NVML exporter
