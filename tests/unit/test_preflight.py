"""gpufleet.preflight: fact-dependent checks, from facts parsed out of real outputs (tests/fixtures/facts)."""

from __future__ import annotations

import dataclasses

import pytest
from pyinfra_harness import fixture, wrap

from gpufleet.catalog import load_catalog
from gpufleet.config import load_node_config
from gpufleet.facts import GpuInventory, NvidiaPciDevices, OsInfo, SecureBoot
from gpufleet.plan.mig import _placement_fits
from gpufleet.preflight import (
    HostFacts,
    PreflightError,
    PreflightFailed,
    check_inventory,
    choose_kernel_flavour,
    dkms_needed,
    gather_facts,
    host_gpus,
    preflight,
    required_kernel_flavour,
    run_preflight,
)

H100 = "NVIDIA H100 80GB HBM3"


def os_fact(name: str = "os_release_ubuntu_2204.txt") -> dict:
    return OsInfo().process(wrap("os-release", fixture(name)) + wrap("kernel", "5.15.0-185-generic"))


def pci_fact(text: str) -> dict:
    return NvidiaPciDevices().process(wrap("lspci", text))


def sb_fact(state_line: str) -> dict:
    return SecureBoot().process(wrap("mokutil", state_line) + wrap("efi", "uefi"))


def h100_inventory() -> dict:
    """The real H100 capture (one GPU, driver 590.48.01)."""
    return GpuInventory().process(wrap("query", fixture("query_gpu_h100-80gb-hbm3_590.48.01_idle.txt")))


def h100_with_driver(**kwargs) -> HostFacts:
    return HostFacts(os=os_fact(), secure_boot=sb_fact("SecureBoot disabled"), gpu_inventory=h100_inventory(),
                     pci=pci_fact(fixture("lspci_hgx_h100.txt")), **kwargs)


def hgx_h100_no_driver() -> HostFacts:
    """A bare HGX H100 (no driver): GPUs known from lspci only."""
    return HostFacts(os=os_fact(), secure_boot=sb_fact("SecureBoot disabled"),
                     pci=pci_fact(fixture("lspci_hgx_h100.txt")))


def rtx4090_no_driver() -> HostFacts:
    return HostFacts(os=os_fact(), secure_boot=sb_fact("SecureBoot disabled"),
                     pci=pci_fact(fixture("lspci_rtx4090_workstation.txt")))


def b200_no_driver() -> HostFacts:
    lines = "\n".join(f"0000:{bus}:00.0 0302: 10de:2901 (rev a1)" for bus in ("1b", "43", "52", "61"))
    return HostFacts(os=os_fact(), secure_boot=sb_fact("SecureBoot disabled"), pci=pci_fact(lines))


def messages(data: dict, facts: HostFacts, host: str = "node01") -> list[str]:
    errors = preflight(host, load_node_config(host, data), facts)
    assert all(isinstance(e, PreflightError) and e.host == host for e in errors)
    return [e.message for e in errors]


# ----------------------------------------------------------------------------------------------------- GPUs


def test_gpus_from_nvidia_smi_when_driver_answers():
    gpus = host_gpus(h100_with_driver())
    assert [(g.index, g.source, g.model.key, g.power_max_w) for g in gpus] == [(0, "nvidia-smi", "h100-sxm", 700.0)]


def test_gpus_from_pci_without_driver():
    gpus = host_gpus(hgx_h100_no_driver())
    assert [g.index for g in gpus] == list(range(8))
    assert {(g.source, g.model.key, g.pci_device_id) for g in gpus} == {("pci", "h100-sxm", "0x233010DE")}
    assert gpus[0].pci_bus_id == "0000:18:00.0"


# ---------------------------------------------------------------------------------------------------- power


def test_power_above_max_from_nvml():
    assert messages({"gpufleet_power_limit": 800}, h100_with_driver()) == [
        f"node01: gpufleet_power_limit=800 W on GPU 0 ({H100}): outside this GPU's power limit range; allowed: "
        "200-700 W"]


def test_power_percent_out_of_range_from_catalog_without_driver():
    assert messages({"gpufleet_power_limit": "120%"}, hgx_h100_no_driver()) == [
        f"node01: gpufleet_power_limit=120% on GPUs 0-7 ({H100}): outside this GPU's power limit range (120% of "
        "the default limit is 840 W); allowed: 200-700 W"]


def test_power_below_min_per_model():
    data = {"gpufleet_power_limit_by_model": {"h100-sxm": 150}}
    assert messages(data, h100_with_driver()) == [
        f"node01: gpufleet_power_limit_by_model['h100-sxm']=150 W on GPU 0 ({H100}): outside this GPU's power "
        "limit range; allowed: 200-700 W"]


def test_power_per_uuid_wins_and_is_checked():
    data = {"gpufleet_power_limit": 500,
            "gpufleet_power_limit_by_uuid": {"GPU-00000000-0000-0000-0000-000000000000": 900}}
    assert messages(data, h100_with_driver()) == [
        f"node01: gpufleet_power_limit_by_uuid['GPU-00000000-0000-0000-0000-000000000000']=900 W on GPU 0 ({H100}): "
        "outside this GPU's power limit range; allowed: 200-700 W"]


def test_power_in_range_passes():
    assert messages({"gpufleet_power_limit": "80%"}, h100_with_driver()) == []
    assert messages({"gpufleet_power_limit": 200}, hgx_h100_no_driver()) == []
    assert messages({"gpufleet_power_limit": "default"}, rtx4090_no_driver()) == []


def test_power_nvml_range_beats_catalog():
    inventory = h100_inventory()
    inventory["gpus"][0]["power_max_w"] = 500.0  # e.g. a board capped lower than the catalog's 700 W
    facts = dataclasses.replace(h100_with_driver(), gpu_inventory=inventory)
    assert messages({"gpufleet_power_limit": 600}, facts)[0].endswith("allowed: 200-500 W")


def test_power_unknown_default_for_relative_limit():
    facts = HostFacts(pci=pci_fact("0000:01:00.0 0302: 10de:ffff (rev a1)"))
    assert messages({"gpufleet_power_limit": "80%", "gpufleet_stages": ["power"]}, facts) == [
        "node01: gpufleet_power_limit=80% on GPU 0 (unknown NVIDIA GPU 0xFFFF10DE): cannot resolve a relative power "
        "limit; allowed: a limit in watts (this GPU's default power limit is unknown)"]


def test_power_relative_limit_waits_for_the_driver_where_boards_differ():
    """A bare A100-SXM4-80GB host: its boards default to 400 W or 500 W (real), so 80 % is resolved from the
    driver's own default once it answers; an absolute limit is still checked against every board's range."""
    bare = HostFacts(os=os_fact(), secure_boot=sb_fact("SecureBoot disabled"),
                     pci=pci_fact("0000:07:00.0 0302: 10de:20b2 (rev a1)"))
    config = load_node_config("node01", {"gpufleet_power_limit": "80%"})
    result = run_preflight("node01", config, bare)
    assert result.errors == []
    assert ("gpufleet_power_limit: GPU 0 (NVIDIA A100-SXM4-80GB): boards of this model default to 400 W or 500 W; "
            "80% is resolved once the driver answers (this run, after the driver stage)") in result.notes
    assert messages({"gpufleet_power_limit": 550}, bare) == [
        "node01: gpufleet_power_limit=550 W on GPU 0 (NVIDIA A100-SXM4-80GB): outside this GPU's power limit range; "
        "allowed: 100-500 W"]


def test_power_stage_off_skips_check():
    assert messages({"gpufleet_power_limit": 800, "gpufleet_stages": ["driver"]}, h100_with_driver()) == []


# ------------------------------------------------------------------------------------------------------ MIG


def mig(layout, **entry) -> dict:
    return {"gpufleet_mig": [{"devices": entry.pop("devices", "all"), "mig-enabled": entry.pop("enabled", True),
                              "mig-devices": layout, **entry}]}


def test_mig_profile_unknown_for_model():
    assert messages(mig({"1g.5gb": 7}), h100_with_driver()) == [
        f"node01: gpufleet_mig[0].mig-devices['1g.5gb']='1g.5gb' on GPU 0 ({H100}): unknown MIG profile for this "
        f"GPU model; allowed: a MIG profile of {H100}: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, "
        "7g.80gb (did you mean '1g.20gb'?)"]


def test_mig_too_many_instances():
    assert messages(mig({"1g.10gb": 8}), hgx_h100_no_driver()) == [
        f"node01: gpufleet_mig[0].mig-devices['1g.10gb']=8 on GPUs 0-7 ({H100}): too many instances; allowed: at "
        f"most 7 instance(s) of 1g.10gb on {H100}"]
    assert messages(mig({"1g.10gb+me": 2}), h100_with_driver()) == [
        f"node01: gpufleet_mig[0].mig-devices['1g.10gb+me']=2 on GPU 0 ({H100}): too many instances; allowed: at "
        f"most 1 instance(s) of 1g.10gb+me on {H100}"]


def test_mig_slices_over_capacity():
    assert messages(mig({"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1}), h100_with_driver()) == [
        f"node01: gpufleet_mig[0].mig-devices={{'4g.40gb': 1, '3g.40gb': 1, '1g.10gb': 1}} on GPU 0 ({H100}): the "
        "instances need 9 memory slices and 8 compute slices; allowed: at most 8 memory slices and 7 compute "
        f"slices in total on {H100}"]


def test_mig_compute_slices_over_capacity():
    # 2 x 4g would fit the 8 memory slices but needs 8 of 7 compute slices (and 4g.40gb allows one instance)
    assert messages(mig({"3g.40gb": 2, "1g.10gb": 2}), h100_with_driver()) == [
        f"node01: gpufleet_mig[0].mig-devices={{'3g.40gb': 2, '1g.10gb': 2}} on GPU 0 ({H100}): the instances "
        "need 10 memory slices and 8 compute slices; allowed: at most 8 memory slices and 7 compute slices in "
        f"total on {H100}"]


def test_mig_valid_layouts_pass():
    for layout in ({"1g.10gb": 7}, {"3g.40gb": 2}, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, {"7g.80gb": 1},
                   {"4g.40gb": 1, "3g.40gb": 1}, {"1g.20gb": 4}, {"2g.20gb": 3, "1g.10gb": 1}, {}):
        assert messages(mig(layout), hgx_h100_no_driver()) == [], layout


def test_mig_on_rtx4090():
    assert messages(mig({"1g.10gb": 7}), rtx4090_no_driver()) == [
        "node01: gpufleet_mig[0].mig-enabled=True on GPU 0 (NVIDIA GeForce RTX 4090): MIG requested on a GPU "
        "without MIG; allowed: false, or a devices / device-filter selection without this GPU (NVIDIA GeForce RTX "
        "4090 has no MIG)"]


def test_mig_disabled_or_filtered_out_on_rtx4090_passes():
    assert messages(mig({}, enabled=False), rtx4090_no_driver()) == []
    assert messages(mig({"1g.10gb": 7}, **{"device-filter": ["0x233010DE"]}), rtx4090_no_driver()) == []


def test_mig_device_index_does_not_exist():
    assert messages(mig({"1g.10gb": 7}, devices=[0, 8, 9]), hgx_h100_no_driver()) == [
        "node01: gpufleet_mig[0].devices=[0, 8, 9]: device index 8, 9 does not exist on this host; allowed: GPU "
        "indices 0-7 (this host has 8 GPUs)"]
    assert messages(mig({"1g.10gb": 7}, devices=[1]), h100_with_driver()) == [
        "node01: gpufleet_mig[0].devices=[1]: device index 1 does not exist on this host; allowed: GPU index 0 "
        "(this host has 1 GPU)"]


def test_mig_gpu_selected_twice():
    data = {"gpufleet_mig": [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
                             {"devices": "all", "mig-enabled": False}]}
    assert messages(data, h100_with_driver()) == [
        f"node01: gpufleet_mig=entries 0, 1 on GPU 0 ({H100}): GPU selected twice; allowed: each GPU selected by "
        "at most one entry (devices / device-filter)"]


def test_mig_from_file_names_label(tmp_path):
    path = tmp_path / "mig.yaml"
    path.write_text('version: v1\nmig-configs:\n  big:\n    - devices: all\n      mig-enabled: true\n'
                    '      mig-devices:\n        "7g.80gb": 2\n')
    data = {"gpufleet_mig_config_file": str(path), "gpufleet_mig_config": "big"}
    assert messages(data, h100_with_driver()) == [
        f"node01: gpufleet_mig_config['big'][0].mig-devices['7g.80gb']=2 on GPU 0 ({H100}): too many instances; "
        f"allowed: at most 1 instance(s) of 7g.80gb on {H100}"]


def test_placement_search():
    mig_spec = load_catalog().get("h100-sxm").mig
    p = {prof.name: prof for prof in mig_spec.gpu_instance_profiles}
    assert _placement_fits([p["3g.40gb"], p["2g.20gb"], p["1g.10gb"], p["1g.10gb"]], 8)
    assert _placement_fits([p["1g.10gb"]] * 7, 8)
    assert not _placement_fits([p["4g.40gb"], p["4g.40gb"]], 8)  # both only fit at slice 0
    assert not _placement_fits([p["1g.10gb"]] * 8, 8)  # 1g never starts at slice 7


# --------------------------------------------------------------------------------------------------- driver


def test_proprietary_on_b200():
    assert messages({"gpufleet_driver_flavour": "proprietary"}, b200_no_driver()) == [
        "node01: gpufleet_driver_flavour='proprietary' on GPUs 0-3 (NVIDIA B200): proprietary kernel modules "
        "requested; allowed: open or auto (Blackwell GPUs work only with NVIDIA's open kernel modules)"]
    assert messages({"gpufleet_driver_flavour": "auto"}, b200_no_driver()) == []


def test_kernel_flavour_choice():
    catalog = load_catalog()
    b200, h100, t4 = catalog.get("b200"), catalog.get("h100-sxm"), catalog.get("t4")
    volta = dataclasses.replace(h100, key="v100", name="Tesla V100-SXM2-16GB", architecture="Volta")
    assert required_kernel_flavour([h100, t4, None]) is None
    assert required_kernel_flavour([b200, h100]) == "open"
    assert required_kernel_flavour([volta]) == "proprietary"
    assert choose_kernel_flavour("auto", [h100]) == "open"
    assert choose_kernel_flavour("auto", [volta]) == "proprietary"
    assert choose_kernel_flavour("proprietary", [h100]) == "proprietary"


def test_open_on_pre_turing():
    volta = dataclasses.replace(load_catalog().get("h100-sxm"), architecture="Volta")
    facts = hgx_h100_no_driver()
    from gpufleet import preflight as module

    errors = module.PreflightResult()
    gpus = [dataclasses.replace(g, model=volta) for g in host_gpus(facts)][:1]
    config = load_node_config("node01", {"gpufleet_driver_flavour": "open"})
    module._check_driver("node01", config, facts, gpus, errors)
    assert [e.message for e in errors.errors] == [
        f"node01: gpufleet_driver_flavour='open' on GPU 0 ({H100}): open kernel modules requested; allowed: "
        "proprietary or auto (the open kernel modules support Turing and newer GPUs only)"]


SB_MESSAGE = (
    "node01: gpufleet_driver_secure_boot_signing=False: Secure Boot is enabled and the NVIDIA kernel modules would "
    "be built by DKMS, unsigned: they would not load; allowed: true once a Machine Owner Key is enrolled (mokutil "
    "--import) and DKMS signs modules with it, or gpufleet_driver_packages_style: ubuntu on Ubuntu "
    "(Canonical-signed precompiled modules)")


def test_secure_boot_with_dkms_and_no_signing():
    facts = dataclasses.replace(hgx_h100_no_driver(), secure_boot=sb_fact("SecureBoot enabled"))
    assert messages({"gpufleet_driver_packages_style": "nvidia"}, facts) == [SB_MESSAGE]
    debian = dataclasses.replace(facts, os=os_fact("os_release_rocky_9.txt"))
    assert messages({}, debian) == [SB_MESSAGE]


def test_secure_boot_fine_cases():
    facts = dataclasses.replace(hgx_h100_no_driver(), secure_boot=sb_fact("SecureBoot enabled"))
    assert messages({}, facts) == []  # Ubuntu-style packages on Ubuntu: Canonical-signed precompiled modules
    assert messages({"gpufleet_driver_packages_style": "nvidia", "gpufleet_driver_secure_boot_signing": True},
                    facts) == []
    assert messages({"gpufleet_driver_packages_style": "nvidia", "gpufleet_driver_branch": "590"},
                    dataclasses.replace(h100_with_driver(), secure_boot=sb_fact("SecureBoot enabled"))) == []
    assert messages({"gpufleet_driver_packages_style": "nvidia", "gpufleet_stages": ["power"]}, facts) == []


def test_dkms_needed():
    ubuntu, rocky = os_fact(), os_fact("os_release_rocky_9.txt")
    assert not dkms_needed(load_node_config("n", {}), ubuntu)
    assert dkms_needed(load_node_config("n", {"gpufleet_driver_packages_style": "nvidia"}), ubuntu)
    assert dkms_needed(load_node_config("n", {}), rocky)


@pytest.mark.parametrize("release", ["debian_12", "debian_13"])
def test_debian_12_and_13_are_supported(release):
    facts = dataclasses.replace(hgx_h100_no_driver(), os=os_fact(f"os_release_{release}.txt"))
    assert messages({"gpufleet_driver_packages_style": "nvidia"}, facts) == []


def test_unsupported_os():
    centos7 = OsInfo().process(wrap("os-release", 'ID="centos"\nVERSION_ID="7"\nPRETTY_NAME="CentOS Linux 7 (Core)"'))
    facts = dataclasses.replace(hgx_h100_no_driver(), os=centos7)
    assert messages({}, facts) == [
        "node01: gpufleet_stages=['driver', 'persistence', 'power', 'mig', 'nccl', 'exporters']: the driver stage "
        "does not "
        "support CentOS Linux 7 (Core); allowed: the driver stage on Ubuntu 22.04 / 24.04, Debian 12 / 13, RHEL / "
        "Rocky / AlmaLinux 9, or gpufleet_stages without 'driver'"]
    assert messages({"gpufleet_stages": ["power"]}, facts) == []


# ---------------------------------------------------------------------------------------------------- clocks


def test_clock_lock_above_max():
    data = {"gpufleet_stages": ["clocks"], "gpufleet_clocks": {"lock_gpu_mhz": [2100, 2200]}}
    assert messages(data, h100_with_driver()) == [
        f"node01: gpufleet_clocks.lock_gpu_mhz=[2100, 2200] on GPU 0 ({H100}): locked clock range above the GPU's "
        "maximum; allowed: a minimum at most 1980 MHz (this GPU's max SM clock)"]
    assert messages({**data, "gpufleet_clocks": {"lock_gpu_mhz": [1980, 1980]}}, h100_with_driver()) == []


# ------------------------------------------------------------------------------------------- notes, inventory


def test_no_gpu_detected_is_not_an_error():
    result = run_preflight("node01", load_node_config("node01", {"gpufleet_power_limit": "80%", **mig({})}),
                           HostFacts(os=os_fact()))
    assert result.errors == []
    assert any("no NVIDIA GPU detected" in note for note in result.notes)


def test_check_inventory_fails_whole_run_with_every_host():
    good = ("node01", load_node_config("node01", {"gpufleet_power_limit": 600}), hgx_h100_no_driver())
    bad_power = ("node02", load_node_config("node02", {"gpufleet_power_limit": 800}), h100_with_driver())
    bad_mig = ("node03", load_node_config("node03", mig({"1g.10gb": 7})), rtx4090_no_driver())
    with pytest.raises(PreflightFailed) as info:
        check_inventory([good, bad_power, bad_mig])
    assert [(e.host, e.key) for e in info.value.errors] == [
        ("node02", "gpufleet_power_limit"), ("node03", "gpufleet_mig[0].mig-enabled")]
    assert str(info.value).splitlines()[0] == (
        "preflight failed: 2 error(s) on 2 host(s) (node02, node03); no host was changed:")
    assert set(check_inventory([good])) == {"node01"}


def test_gather_facts_reads_each_fact_once():
    class FakeHost:
        def __init__(self):
            self.asked = []

        def get_fact(self, cls):
            self.asked.append(cls.__name__)
            return cls.default()

    host = FakeHost()
    facts = gather_facts(host)
    assert sorted(host.asked) == ["GpuInventory", "NvidiaPackages", "NvidiaPciDevices", "OsInfo", "SecureBoot"]
    assert facts.gpu_inventory["status"] == "absent"


def test_an_exporter_listen_address_not_on_the_host_is_refused():
    facts = HostFacts(os={**os_fact(), "addresses": ["10.0.0.5", "fd00::5"]},
                      secure_boot=sb_fact("SecureBoot disabled"), gpu_inventory=h100_inventory())
    config = load_node_config("n1", {"ssh_hostname": "203.0.113.7", "gpufleet_stages": ["exporters"],
                                     "gpufleet_exporters_gpu_listen": "10.0.0.6:9400"})
    errors = preflight("n1", config, facts)
    assert [e.message.split("; allowed")[0] for e in errors] == [
        "n1: gpufleet_exporters_node_listen='203.0.113.7:9100': not an address of this host",
        "n1: gpufleet_exporters_gpu_listen='10.0.0.6:9400': not an address of this host"]
    assert "(10.0.0.5, fd00::5), 0.0.0.0" in errors[0].allowed
    for ok in ({"ssh_hostname": "10.0.0.5"}, {"gpufleet_exporters_node_listen": "127.0.0.1:9100",
                                              "gpufleet_exporters_gpu_listen": "[fd00::5]:9400"}):
        assert preflight("n1", load_node_config("n1", {"gpufleet_stages": ["exporters"], **ok}), facts) == []
    # addresses unknown (an old fact, hostname -I missing): not checked
    assert preflight("n1", config, HostFacts(os=os_fact(), gpu_inventory=h100_inventory())) == []
