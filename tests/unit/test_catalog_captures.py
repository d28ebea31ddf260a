"""The catalog against real output: GB200 / GB300 entries against real ``nvidia-smi -q -x``, and every MIG table
against the real MIG captures (driver 590.48.01) and the real ``-lgip`` samples of reference/nvidia_ground_truth.md.

Sources (copies in tests/fixtures/reference, see its README): qx-gb200.xml / qx-gb300.xml (NVIDIA/k8s-test-infra,
driver 580.173.02), the H100 / H200 MIG captures (utkuozdemir/nvidia_gpu_exporter, 590.48.01) and
reference/lgip_samples.txt (verbatim -lgip rows from public issues, each block named by its source).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from reference import CAPTURES, REFERENCE

from gpufleet.catalog import load_catalog

GB_XML = {"gb200": "qx-gb200.xml", "gb300": "qx-gb300.xml"}


def _xml_gpus(name: str) -> list[ET.Element]:
    return ET.parse(CAPTURES / name).getroot().findall("gpu")


def _number(text: str) -> float:
    return float(text.split()[0])


@pytest.mark.parametrize("key", sorted(GB_XML))
def test_grace_blackwell_entries_are_what_real_nvidia_smi_printed(key):
    model = load_catalog().get(key)
    gpus = _xml_gpus(GB_XML[key])
    assert len(gpus) == 4
    for gpu in gpus:  # every GPU of the real tray agrees with the one catalog entry
        assert gpu.findtext("product_name") == model.name
        assert gpu.findtext("product_brand") == model.brand
        assert gpu.findtext("product_architecture") == model.architecture
        assert int(gpu.findtext("pci/pci_device_id"), 16) == model.pci_device_id
        assert _number(gpu.findtext("fb_memory_usage/total")) == model.memory_mib
        assert _number(gpu.findtext("fb_memory_usage/reserved")) == model.memory_reserved_mib
        power = gpu.find("gpu_power_readings")
        assert (_number(power.findtext("default_power_limit")), _number(power.findtext("min_power_limit")),
                _number(power.findtext("max_power_limit"))) == (model.power_default_w, model.power_min_w,
                                                                 model.power_max_w)
        clocks = gpu.find("max_clocks")
        assert (_number(clocks.findtext("sm_clock")), _number(clocks.findtext("graphics_clock")),
                _number(clocks.findtext("mem_clock")), _number(clocks.findtext("video_clock"))) == (
            model.clocks_max_sm_mhz, model.clocks_max_graphics_mhz, model.clocks_max_mem_mhz,
            model.clocks_max_video_mhz)
        assert int(gpu.findtext("pci/pci_gpu_link_info/pcie_gen/max_link_gen")) == model.pcie_gen_max
        assert gpu.findtext("pci/pci_gpu_link_info/link_widths/max_link_width") == f"{model.pcie_width_max}x"
        temps = gpu.find("temperature")
        assert (_number(temps.findtext("gpu_temp_max_tlimit_threshold")),
                _number(temps.findtext("gpu_temp_slow_tlimit_threshold")),
                _number(temps.findtext("gpu_temp_max_gpu_tlimit_threshold"))) == (
            model.temp_shutdown_tlimit_c, model.temp_slowdown_tlimit_c, model.temp_max_operating_tlimit_c)
        assert gpu.findtext("ecc_mode/current_ecc") == "Enabled" and model.ecc_supported
        assert gpu.findtext("persistence_mode") == "Enabled" and model.persistence_supported
        assert gpu.find("remapped_rows/remapped_row_corr") is not None and model.row_remap_supported
    assert {g.findtext("vbios_version") for g in gpus} == {model.vbios_example}
    assert int(gpus[0].findtext("pci/pci_sub_system_id"), 16) == model.pci_sub_device_id_example


def test_grace_blackwell_lookups():
    catalog = load_catalog()
    assert catalog.by_name("NVIDIA GB200").key == "gb200" and catalog.by_name("NVIDIA GB300").key == "gb300"
    assert catalog.by_pci_device_id("0x294110DE").key == "gb200"
    assert catalog.by_pci_device_id(0x31C2).key == "gb300"
    assert catalog.by_pci_device_id("0x31C310DE").key == "gb300"  # the second GB300 id of the 610 README
    for key in ("gb200", "gb300"):
        model = catalog.get(key)
        # never printed by a real source: left unknown instead of copied from B200
        assert model.sm_count is None, key
        assert model.source_tag("sm_count") == "unverified"
        assert model.mig.profile("7g.186gb" if key == "gb200" else "7g.278gb").memory_mib is None


# ------------------------------------------------------------------------------------ MIG: real 590 captures


def _section(capture: str, title: str) -> list[str]:
    lines = (CAPTURES / capture).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"# {title}"))
    body = []
    for line in lines[start + 3:]:
        if line.startswith("####"):
            break
        body.append(line)
    return body


_L_RE = re.compile(r"^\s+MIG (?:(\d+)c\.)?(\S+)\s+Device\s+(\d+):")
_TABLE_RE = re.compile(r"^\|\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\|\s+\d+MiB /\s*(\d+)MiB\s+\|\s+(\d+)\s+\S+\s+\|"
                       r"\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\|$")


def mig_devices(capture: str) -> list[dict]:
    """The MIG devices of a real capture: profile (from -L) + memory, SM and engines (default table)."""
    profiles = {}
    for line in _section(capture, "capabilities :: list (-L)"):
        match = _L_RE.match(line)
        if match:
            profiles[int(match.group(3))] = (match.group(2), int(match.group(1)) if match.group(1) else None)
    devices = []
    for line in _section(capture, "idle :: nvidia-smi (default table)"):
        match = _TABLE_RE.match(line)
        if match:
            gpu, gi, ci, dev, mem, sm, ce, enc, dec, ofa, jpg = map(int, match.groups())
            name, ci_slices = profiles[dev]
            devices.append({"profile": name, "ci_slices": ci_slices, "memory_mib": mem, "sm": sm, "ce": ce,
                            "enc": enc, "dec": dec, "ofa": ofa, "jpeg": jpg})
    assert devices and len(devices) == len(profiles)
    return devices


MIG_CAPTURES = {
    "h100-sxm": "linux-x86_64__nvidia-h100-mig__590.48.01.txt",
    "h200": "linux-x86_64__nvidia-h200-mig__590.48.01.txt",
}


@pytest.mark.parametrize("key", sorted(MIG_CAPTURES))
def test_mig_table_matches_the_real_590_capture(key):
    mig = load_catalog().get(key).mig
    devices = mig_devices(MIG_CAPTURES[key])
    seen = set()
    for dev in devices:
        prof = mig.profile(dev["profile"])
        # memory and engines belong to the GPU instance, shared by its compute instances
        assert (prof.memory_mib, prof.copy_engines, prof.decoders, prof.jpeg, prof.ofa, prof.encoders) == (
            dev["memory_mib"], dev["ce"], dev["dec"], dev["jpeg"], dev["ofa"], dev["enc"]), dev
        assert prof.memory_gib_printed == f"{prof.memory_mib / 1024:.2f}", prof.name
        if dev["ci_slices"] is None:  # a whole-GI compute instance has the GI's SMs
            assert prof.sm_count == dev["sm"], dev
        else:  # a 1c / 2c compute instance of a larger GI has fewer SMs than the GI
            assert dev["sm"] < prof.sm_count, dev
        seen.add(prof.name)
    expected = {"h100-sxm": {"1g.10gb", "2g.20gb", "3g.40gb"}, "h200": {"1g.18gb", "2g.35gb", "3g.71gb"}}[key]
    assert seen == expected


def test_h200_memory_is_driver_590s_not_the_older_drivers():
    mig = load_catalog().get("h200").mig
    printed = {p.name: p.memory_gib_printed for p in mig.gpu_instance_profiles}
    assert printed == {"1g.18gb": "16.00", "1g.18gb+me": "16.00", "1g.35gb": "32.50", "2g.35gb": "32.50",
                       "3g.71gb": "69.75", "4g.71gb": "69.75", "7g.141gb": "140.00"}


# ----------------------------------------------------------------------------- MIG: real -lgip samples


_LGIP_ROW = re.compile(r"^\|\s+\d+\s+MIG (\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s+(No|Yes)"
                       r"\s+(\d+)\s+(\d+)\s+(\d+)\s+\|$")
_LGIP_ROW2 = re.compile(r"^\|\s+(\d+)\s+(\d+)\s+(\d+)\s+\|$")


def lgip_samples() -> dict[str, list[dict]]:
    """reference/lgip_samples.txt: ``## <catalog key> <memory|no-memory>[ <tag>]: <source>`` then verbatim rows."""
    samples: dict[str, list[dict]] = {}
    current = None
    lines = (REFERENCE / "lgip_samples.txt").read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("## "):
            key, _, rest = line[3:].partition(" ")
            current = f"{key} {rest.split(':')[0]}"
            samples[current] = []
            continue
        match = _LGIP_ROW.match(line)
        if match and current:
            second = _LGIP_ROW2.match(lines[i + 1])
            assert second, lines[i + 1]
            name, pid, _free, total, gib, p2p, sm, dec, enc = match.groups()
            ce, jpeg, ofa = map(int, second.groups())
            samples[current].append({"name": name, "id": int(pid), "total": int(total), "gib": gib,
                                     "p2p": p2p == "Yes", "sm": int(sm), "dec": int(dec), "enc": int(enc),
                                     "ce": ce, "jpeg": jpeg, "ofa": ofa})
    return samples


def test_lgip_samples_cover_the_published_tables():
    keys = {k.split()[0] for k in lgip_samples()}
    assert {"a30", "a100-pcie-40gb", "h100-nvl", "h100-sxm", "h200", "b200", "gb200"} <= keys


@pytest.mark.parametrize("sample", sorted(lgip_samples()))
def test_mig_table_matches_real_lgip(sample):
    key, memory = sample.split()[:2]
    mig = load_catalog().get(key).mig
    rows = lgip_samples()[sample]
    assert rows
    for row in rows:
        prof = mig.profile(row["name"])
        assert (prof.id, prof.max_instances, prof.p2p, prof.sm_count, prof.decoders, prof.encoders,
                prof.copy_engines, prof.jpeg, prof.ofa) == (
            row["id"], row["total"], row["p2p"], row["sm"], row["dec"], row["enc"], row["ce"], row["jpeg"],
            row["ofa"]), (sample, row)
        if memory == "memory":  # same driver generation as the catalog's memory figures
            assert prof.memory_gib_printed == row["gib"], (sample, row)
