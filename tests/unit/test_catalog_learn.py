"""`gpufleet catalog learn`'s parsing and model building on real output: every GPU of the real `nvidia-smi -q`
captures (captures/public) and the real `mig -lgip` sessions becomes a model the strict loader accepts and that
decides as the packaged model of the same board does."""

from __future__ import annotations

import datetime

import pytest
from reference import CAPTURES

from gpufleet import catalog_command
from gpufleet.catalog import Catalog, load_catalog, parse_model
from gpufleet.catalog.learn import LearnError, learn_model, model_key
from gpufleet.facts.mig_profiles import parse_lgip, parse_lgipp
from gpufleet.facts.nvidia_q import NvidiaSmiReport, parse_q
from gpufleet.plan.driver import required_kernel_flavour

PUBLIC = CAPTURES / "public"
CATALOGUED = ["a100-sxm4-80gb-x4_555.42.02.q.txt", "a10_550.90.12.q.txt", "h100-nvl-x2_550.54.14.q.txt",
              "h200_550.90.12.q.txt", "l4_550.90.07.q.txt", "rtx4090-x8_550.127.05.q.txt",
              "rtx6000ada-x8_550.127.05.q.txt", "rtxa6000-x9_550.127.05.q.txt",
              "v100-sxm2-16gb-x8_550.127.05.q.txt", "gh200-480gb_550.127.05.q.txt"]


def _gpus(name: str) -> list[dict]:
    return parse_q((PUBLIC / name).read_text(encoding="utf-8"))[1]


def test_lgip_of_the_real_sessions():
    gh200 = parse_lgip((PUBLIC / "gh200-480gb_550.54.15.mig-session.txt").read_text(encoding="utf-8"))
    assert [(p["name"], p["id"], p["total"], p["memory_gib"], p["sm"]) for p in gh200[0]] == [
        ("1g.12gb", 19, 7, "11.00", 16), ("1g.12gb+me", 20, 1, "11.00", 16), ("1g.24gb", 15, 4, "23.00", 26),
        ("2g.24gb", 14, 3, "23.00", 32), ("3g.48gb", 9, 2, "46.50", 60), ("4g.48gb", 5, 1, "46.50", 64),
        ("7g.96gb", 0, 1, "93.00", 132)]
    assert gh200[0][1] | {} == {"name": "1g.12gb+me", "id": 20, "free": 1, "total": 1, "memory_gib": "11.00",
                                "p2p": False, "sm": 16, "dec": 1, "enc": 0, "ce": 1, "jpeg": 1, "ofa": 1}
    a100 = parse_lgip((PUBLIC / "a100-pcie-40gb_510.47.03_esxi.mig-session.txt").read_text(encoding="utf-8"))
    assert [p["name"] for p in a100[0]] == ["1g.5gb", "1g.5gb+me", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]


def test_lgipp_placements():
    text = "GPU  0 Profile ID 14 Placements: {0,1,2,3}:1\nGPU  0 Profile ID  6 Placements: {0,2}:2\n" \
           "GPU  1 Profile ID  0 Placement : {0}:4\n"
    assert parse_lgipp(text) == {0: {14: [(0, 1), (1, 1), (2, 1), (3, 1)], 6: [(0, 2), (2, 2)]}, 1: {0: [(0, 4)]}}


@pytest.mark.parametrize("capture", CATALOGUED)
def test_learned_model_decides_as_the_packaged_one(capture):
    gpus = _gpus(capture)
    packaged = load_catalog().by_name(gpus[0]["Product Name"])
    doc = learn_model(gpus[0], origin=f"{capture}, 2026-12-08", boards=gpus, compute_cap=packaged.compute_capability,
                      known=packaged if packaged.mig is not None else None,
                      mig_profiles=(), mig_placements={})
    learned = parse_model(doc, origin=capture)
    assert (learned.name, learned.pci_device_id, learned.architecture, learned.memory_mib) == (
        packaged.name, packaged.pci_device_id, packaged.architecture, packaged.memory_mib)
    assert required_kernel_flavour([learned]) == required_kernel_flavour([packaged])
    assert learned.datacenter == packaged.datacenter and learned.ecc_supported == packaged.ecc_supported
    assert (learned.mig is None) == (packaged.mig is None)
    if learned.mig is not None:
        assert [(p.name, p.id) for p in learned.mig.gpu_instance_profiles] == [
            (p.name, p.id) for p in packaged.mig.gpu_instance_profiles]
    assert set(learned.power_limits_w) <= set(packaged.power_limits_w)  # each board read is a packaged variant
    assert all(learned.sources[f].startswith(f"real: {capture}") for f in ("name", "memory_mib", "architecture"))


def test_learned_mig_profiles_from_lgip():
    gpus = _gpus("gh200-480gb_550.127.05.q.txt")
    session = (PUBLIC / "gh200-480gb_550.54.15.mig-session.txt").read_text(encoding="utf-8")
    placements = {19: [(i, 1) for i in range(7)], 0: [(0, 8)]}
    doc = learn_model(gpus[0], origin="node01, 2026-12-08", compute_cap="9.0",
                      mig_profiles=parse_lgip(session)[0], mig_placements=placements)
    mig = parse_model(doc).mig
    assert (mig.compute_slices, mig.memory_slices) == (7, 8)
    assert mig.profile("7g.96gb").sm_count == 132 and mig.profile(19).placements == tuple((i, 1) for i in range(7))
    assert [p.nvml_profile_enum for p in mig.gpu_instance_profiles] == [0, 7, 9, 1, 2, 3, 4]


def test_learn_refuses_what_it_cannot_tell():
    gpus = _gpus("gh200-480gb_550.127.05.q.txt")
    with pytest.raises(LearnError, match="listed only in MIG mode"):
        learn_model(gpus[0], origin="node01", compute_cap="9.0")  # MIG Disabled: no -lgip, nothing catalogued
    with pytest.raises(LearnError, match="architecture None"):
        learn_model(_gpus("gtx680_470.256.02.q.txt")[0], origin="node01", compute_cap="3.0")


def test_model_keys():
    assert [model_key(n) for n in ("NVIDIA GH200 480GB", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090",
                                   "NVIDIA RTX 6000 Ada Generation")] == [
        "gh200-480gb", "v100-sxm2-16gb", "rtx-4090", "rtx-6000-ada-generation"]


def _report(q_text: str, **sections: str) -> list[str]:
    """NvidiaSmiReport's remote output: each program's output between the section markers."""
    texts = {"q": q_text, "compute_cap": "0, 8.9", "nvlink": "GPU 0: NVIDIA L4 (UUID: GPU-x)\n"
             "Device does not have or support Nvlink", "lgip": "No MIG-enabled devices found.", "lgipp": "", **sections}
    out = []
    for name, text in texts.items():
        rc = 6 if name.startswith("lgip") else 0  # nvidia-smi mig's exit status without MIG
        out += [f"@@gpufleet begin {name}", *text.splitlines(), f"@@gpufleet end {name} rc={rc}"]
    return out


def test_report_fact_and_learn_command_write_a_model_the_loader_accepts(tmp_path):
    l4 = (PUBLIC / "l4_550.90.07.q.txt").read_text(encoding="utf-8")
    report = NvidiaSmiReport().process(_report(l4))
    assert report["status"] == "ok" and report["lgip"] == "" and report["compute_cap"] == "0, 8.9"
    doc = catalog_command.learn(report, "node02", load_catalog(), today=datetime.date(2026, 12, 8))
    assert doc["key"] == "l4"  # the catalogued name keeps its key: the file replaces the packaged model
    assert doc["memory_mib"] == {"value": 23034, "source": "real: nvidia-smi 550.90.07 on node02, 2026-12-08 "
                                 "(gpufleet catalog learn): FB Memory Usage Total"}
    assert doc["nvlink_count"]["value"] == 0 and doc["mig"]["value"] is None
    path = catalog_command.write_model(doc, tmp_path)
    assert Catalog.from_directory(tmp_path).get("l4").power_limits_w == load_catalog().get("l4").power_limits_w
    with pytest.raises(catalog_command.CommandError, match="exists"):
        catalog_command.write_model(doc, tmp_path)
    assert path.name == "l4.json"


def test_report_fact_without_a_driver():
    absent = ["@@gpufleet absent q", "@@gpufleet absent compute_cap"]
    assert NvidiaSmiReport().process(absent)["status"] == "absent"
    failed = ["@@gpufleet begin q", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
              "@@gpufleet end q rc=9"]
    assert NvidiaSmiReport().process(failed) == {
        "status": "error", "error": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."}


def test_list_marks_the_users_models(tmp_path, monkeypatch):
    import gpufleet.catalog as catalog_module

    monkeypatch.setattr(catalog_module, "_USER_DIRECTORY", [])
    gpus = _gpus("rtx5090_570.124.06.q.txt")  # a GPU the catalog lacks
    doc = learn_model(gpus[0], origin="ws1, 2026-12-08", compute_cap="12.0")
    catalog_command.write_model(doc, tmp_path / "gpufleet_catalog")
    (tmp_path / "inv.py").write_text("hosts = []\n")
    found = catalog_command.user_directory(str(tmp_path / "inv.py"), None)
    lines = catalog_command.list_lines(catalog_command.catalog_with(found))
    assert [line.split()[-1] for line in lines if line.startswith("rtx-5090 ")] == ["user"]
    assert "rtx4090 " in "\n".join(lines)
    shown = catalog_command.show_text(load_catalog().get("rtx-5090"))
    assert "pci_device_id: 0x2B8510DE" in shown and "real: ws1, 2026-12-08: PCI Device Id" in shown
