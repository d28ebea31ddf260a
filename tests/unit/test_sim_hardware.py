"""Simulated hardware profiles (gpufleet/sim/hardware.py): the initial GPU state of a simulated host."""

from __future__ import annotations

import re
import uuid

import pytest

from gpufleet.catalog import load_catalog
from gpufleet.sim.gpu import state as simstate
from gpufleet.sim.hardware import PROFILES, Profile, UnknownProfile, build_state

REQUIRED = {
    "h100-sxm-8": ("h100-sxm", 8, 4),
    "h200-8": ("h200", 8, 4),
    "a100-80gb-8": ("a100-sxm4-80gb", 8, 6),
    "a100-40gb-1": ("a100-sxm4-40gb", 1, 0),
    "l40s-4": ("l40s", 4, 0),
    "rtx4090-1": ("rtx4090", 1, 0),
    "v100-16gb-8": ("v100-sxm2-16gb", 8, 0),  # pre-Turing: the real V100 server's boards
    "l4-1": ("l4", 1, 0),  # MIG Mode N/A
}
HOST_KEYS = {"schema", "profile", "hostname", "nvswitch.count", "driver.loaded", "driver.version",
             "driver.cuda_version", "fabric.state", "gpu.count"}  # fmt: skip
# STATE.md per-GPU fields every GPU must have
GPU_FIELDS = {
    "model", "name", "brand", "architecture", "compute_cap", "uuid", "serial", "vbios", "minor", "pci.bus_id",
    "pci.device_id", "pci.sub_device_id", "pcie.gen_current", "pcie.gen_max", "pcie.width_current",
    "pcie.width_max", "memory.total_mib", "memory.reserved_mib", "memory.used_mib", "power.default_mw",
    "power.min_mw", "power.max_mw", "power.limit_mw", "power.draw_mw", "persistence", "persistence.supported",
    "temp.gpu", "temp.memory", "temp.slowdown", "temp.shutdown", "temp.max_operating", "temp.target", "fan",
    "pstate", "util.gpu", "util.memory", "clocks.graphics", "clocks.sm", "clocks.mem", "clocks.video",
    "clocks.max.graphics", "clocks.max.sm", "clocks.max.mem", "clocks.max.video", "clocks.locked.min",
    "clocks.locked.max", "clocks.event_reasons", "compute_mode", "ecc.supported", "ecc.current", "ecc.pending",
    "ecc.volatile.corrected", "ecc.volatile.uncorrected", "ecc.aggregate.corrected", "ecc.aggregate.uncorrected",
    "remap.supported", "remap.correctable", "remap.uncorrectable", "remap.pending", "remap.failure", "nvlink.count",
    "nvlink.down", "nvlink.speed_gbps", "mig.supported", "mig.current", "mig.pending", "lost",
}  # fmt: skip
# STATE.md example row for H100 1g.10gb, which matches the real -lgip / -lgipp
H100_1G_ROW = "1g.10gb,0,7,9984,9.75,1,1,16,1,1,0,1,0,0,0:1;1:1;2:1;3:1;4:1;5:1;6:1"


def gpu(state: dict[str, str], index: int) -> dict[str, str]:
    return simstate.gpu(state, index)


def test_required_profiles():
    for name, (model, count, switches) in REQUIRED.items():
        prof = PROFILES[name]
        assert isinstance(prof, Profile)
        assert (prof.name, prof.model_key, prof.gpu_count, prof.nvswitch_count) == (name, model, count, switches)
        assert prof.description
    if "b200" in load_catalog():
        assert PROFILES["b200-8"].model_key == "b200" and PROFILES["b200-8"].gpu_count == 8
    for prof in PROFILES.values():
        assert prof.model_key in load_catalog(), prof


def test_unknown_profile_lists_known_ones():
    with pytest.raises(UnknownProfile) as err:
        build_state("h100-sxm-16", "node1")
    assert isinstance(err.value, ValueError)
    for name in PROFILES:
        assert name in str(err.value)
    assert "h100-sxm-16" in str(err.value)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_state_has_every_key_and_no_driver(profile):
    state = build_state(profile, "node1")
    prof = PROFILES[profile]
    model = load_catalog().get(prof.model_key)
    assert HOST_KEYS <= set(state)
    assert state["schema"] == "1" and state["profile"] == profile and state["hostname"] == "node1"
    assert state["driver.loaded"] == "0" and state["driver.version"] == "" and state["driver.cuda_version"] == ""
    assert state["gpu.count"] == str(prof.gpu_count) and state["nvswitch.count"] == str(prof.nvswitch_count)
    assert state["fabric.state"] == ("not_started" if prof.nvswitch_count else "none")
    for i in range(prof.gpu_count):
        g = gpu(state, i)
        assert GPU_FIELDS <= set(g), GPU_FIELDS - set(g)
        assert g["model"] == model.key and g["name"] == model.name and g["architecture"] == model.architecture
        assert g["pci.device_id"] == f"0x{model.pci_device_id:08X}"
        assert int(g["memory.total_mib"]) == model.memory_mib
        power = prof.power_limits(model, i)  # the board variant of this GPU, one of the catalog's
        assert power in model.power_limits_w
        assert int(g["power.default_mw"]) == round(power.default_w * 1000) == int(g["power.limit_mw"])
        assert int(g["power.min_mw"]) == round(power.min_w * 1000)
        assert int(g["power.max_mw"]) == round(power.max_w * 1000)
        assert g["minor"] == str(i) and g["lost"] == "0" and g["persistence"] == "0"
        assert g["mig.supported"] == ("1" if model.mig else "0")
        assert g["mig.current"] == g["mig.pending"] == "0"
        assert not [k for k in g if k.startswith(("mig.gi.", "mig.ci.", "client.", "proc."))]
        # every key is a plain key=value line
        assert all("\n" not in v and "=" not in k for k, v in g.items())


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_idle_readings_are_plausible(profile):
    state = build_state(profile, "node1")
    for i in range(int(state["gpu.count"])):
        g = gpu(state, i)
        draw, limit = int(g["power.draw_mw"]), int(g["power.limit_mw"])
        assert 0.02 * limit < draw < 0.25 * limit
        assert 25 <= int(g["temp.gpu"]) <= 45
        assert int(g["temp.gpu"]) < int(g["temp.max_operating"]) < int(g["temp.slowdown"]) < int(g["temp.shutdown"])
        assert g["util.gpu"] == g["util.memory"] == "0"
        assert g["clocks.event_reasons"] == "0x0000000000000001"  # idle, like every real idle capture
        assert g["pstate"] in ("P0", "P8")
        assert int(g["clocks.sm"]) < int(g["clocks.max.sm"])
        assert int(g["clocks.mem"]) <= int(g["clocks.max.mem"])
        assert g["clocks.locked.min"] == g["clocks.locked.max"] == "0"
        assert int(g["memory.reserved_mib"]) < int(g["memory.total_mib"]) // 40  # a real L4: 556 of 23034 MiB


def test_h100_matches_the_real_idle_capture():
    g = gpu(build_state("h100-sxm-8", "node1"), 0)
    # captures/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt (idle)
    assert g["name"] == "NVIDIA H100 80GB HBM3" and g["brand"] == "NVIDIA" and g["architecture"] == "Hopper"
    assert (g["pci.device_id"], g["pci.sub_device_id"], g["vbios"]) == ("0x233010DE", "0x16C110DE", "96.00.A5.00.01")
    assert (g["memory.total_mib"], g["memory.reserved_mib"], g["memory.used_mib"]) == ("81559", "479", "0")
    assert (g["pstate"], g["clocks.sm"], g["clocks.graphics"], g["clocks.mem"], g["clocks.video"]) == (
        "P0", "345", "345", "2619", "765")  # fmt: skip
    assert (g["clocks.max.sm"], g["clocks.max.mem"], g["clocks.max.video"]) == ("1980", "2619", "1545")
    assert (g["pcie.gen_current"], g["pcie.gen_max"], g["pcie.width_current"]) == ("5", "5", "16")
    assert g["fan"] == "" and g["serial"] and g["temp.memory"] != ""
    assert 60_000 < int(g["power.draw_mw"]) < 80_000  # real 69.85 W
    # -q temperature: T.Limit thresholds -8 / -2 / 0 relative to max operating
    assert int(g["temp.shutdown"]) - int(g["temp.max_operating"]) == 8
    assert int(g["temp.slowdown"]) - int(g["temp.max_operating"]) == 2
    assert (g["nvlink.count"], g["nvlink.speed_gbps"]) == ("18", "26.562")
    assert (g["ecc.supported"], g["ecc.current"], g["remap.supported"]) == ("1", "1", "1")
    assert g["bar1.total_mib"] == "131072"


def test_geforce_and_pcie_cards():
    g = gpu(build_state("rtx4090-1", "ws"), 0)
    assert g["brand"] == "GeForce" and g["serial"] == ""  # nvidia-smi prints [N/A]
    assert g["fan"] != "" and g["temp.memory"] == "" and g["pstate"] == "P8"
    assert g["nvlink.count"] == "0" and g["mig.supported"] == "0" and g["remap.supported"] == "0"
    assert g["ecc.current"] == "0"
    l40s = build_state("l40s-4", "inf1")
    assert [gpu(l40s, i)["pci.bus_id"] for i in range(4)] == [
        "00000000:17:00.0", "00000000:65:00.0", "00000000:CA:00.0", "00000000:E3:00.0"]  # fmt: skip
    assert gpu(l40s, 0)["temp.memory"] == "" and gpu(l40s, 0)["nvlink.count"] == "0"


def test_identities_are_deterministic_and_unique():
    a1, a2, b = (
        build_state("h100-sxm-8", "node1"),
        build_state("h100-sxm-8", "node1"),
        build_state("h100-sxm-8", "node2"),
    )
    assert a1 == a2
    uuids = [gpu(a1, i)["uuid"] for i in range(8)] + [gpu(b, i)["uuid"] for i in range(8)]
    assert len(set(uuids)) == 16
    for value in uuids:
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", value)
        assert uuid.UUID(value[4:]).version == 5
    serials = [gpu(a1, i)["serial"] for i in range(8)] + [gpu(b, i)["serial"] for i in range(8)]
    assert len(set(serials)) == 16 and all(re.fullmatch(r"\d{13}", s) for s in serials)


def test_hgx_bus_ids():
    state = build_state("h100-sxm-8", "node1")
    assert [gpu(state, i)["pci.bus_id"][9:11] for i in range(8)] == ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
    assert all(re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", gpu(state, i)["pci.bus_id"]) for i in range(8))
    for profile in PROFILES:
        state = build_state(profile, "n")
        buses = [gpu(state, i)["pci.bus_id"] for i in range(int(state["gpu.count"]))]
        assert len(set(buses)) == len(buses) and buses == sorted(buses)


@pytest.mark.parametrize("profile", [p for p in sorted(PROFILES)
                                     if PROFILES[p].gpu_count and load_catalog().get(PROFILES[p].model_key).mig])
def test_mig_profile_table_from_catalog(profile):
    model = load_catalog().get(PROFILES[profile].model_key)
    g = gpu(build_state(profile, "node1"), 0)
    assert g["mig.slices.compute"] == str(model.mig.compute_slices)
    assert g["mig.slices.memory"] == str(model.mig.memory_slices)
    rows = {int(k[8:]): v for k, v in g.items() if k.startswith("mig.gip.")}
    assert set(rows) == {p.id for p in model.mig.gpu_instance_profiles}
    for p in model.mig.gpu_instance_profiles:
        f = rows[p.id].split(",")
        assert len(f) == 15
        assert (f[0], int(f[1]), int(f[2]), int(f[5]), int(f[6])) == (
            p.name, p.nvml_profile_enum, p.max_instances, p.compute_slices, p.memory_slices)  # fmt: skip
        assert re.fullmatch(r"\d+\.\d\d", f[4]) and int(f[3]) > 0 and int(f[7]) > 0
        if p.memory_gib_printed:
            assert f[4] == f"{float(p.memory_gib_printed):.2f}"
        if p.sm_count:
            assert int(f[7]) == p.sm_count
        assert f[14] == ";".join(f"{s}:{z}" for s, z in p.placements)


def test_h100_gip_row_is_the_state_md_example():
    g = gpu(build_state("h100-sxm-8", "node1"), 3)
    assert g["mig.gip.19"] == H100_1G_ROW
    assert g["mig.gip.0"].startswith("7g.80gb,4,1,81152,79.25,7,8,132,8,7,0,7,1,0,0:8")


def test_boot_with_a_driver_loads_it():
    state = build_state("h100-sxm-8", "node1")
    simstate.reset_for_boot(state, "570.172.08")
    assert (state["driver.loaded"], state["driver.version"], state["driver.cuda_version"]) == (
        "1", "570.172.08", "12.8")  # fmt: skip
    assert state["fabric.state"] == "not_started"
    assert gpu(state, 0)["power.limit_mw"] == gpu(state, 0)["power.default_mw"]
    simstate.reset_for_boot(state, "")
    assert (state["driver.loaded"], state["driver.version"]) == ("0", "")


def test_state_round_trips_through_the_file(tmp_path):
    state = build_state("a100-80gb-8", "node1")
    path = tmp_path / "gpus.state"
    simstate.write_state(str(path), state)
    assert simstate.read_state(str(path)) == state


def test_gi_ids_are_buddy_numbers():
    assert [simstate.gi_id(s, 1) for s in range(8)] == list(range(7, 15))
    assert [simstate.gi_id(s, 2) for s in (0, 2, 4, 6)] == [3, 4, 5, 6]
    assert [simstate.gi_id(s, 4) for s in (0, 4)] == [1, 2]
    assert simstate.gi_id(0, 8) == 0
    assert simstate.cuda_version_for("590.48.01") == "13.1"
    assert simstate.cuda_version_for("595.71.05") == "13.2"
    assert simstate.cuda_version_for("garbage") == ""
