# ruff: noqa: F811 - the fixtures imported from test_sim_nvidia_smi are parameters of the tests here
"""Simulated nvidia-smi against real H200 output (driver 590.48.01) and the real 610.57.04 tool (issue 11).

Each test pins one former difference to the real capture it must match (tests/fixtures/reference/captures:
H200 and H200 in MIG mode 590.48.01, H100 590.48.01, RTX 2080 SUPER 610.57.04).
"""

from __future__ import annotations

import re

import pytest
from test_sim_nvidia_smi import Smi, capture_section, holder, make_smi, shape  # noqa: F401 - fixtures
from test_sim_nvml import libdir, sim  # noqa: F401 - fixtures

H200 = "linux-x86_64__nvidia-h200__590.48.01.txt"
H200_MIG = "linux-x86_64__nvidia-h200-mig__590.48.01.txt"
H100 = "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
R610 = "linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04.txt"
DRIVER_610 = "610.57.04"


def real_row(capture: str, phase: str = "idle") -> dict[str, str]:
    """The real --query-gpu CSV row of a capture, by field name (units stripped from the header)."""
    body = [line for line in capture_section(capture, f"{phase} :: query-gpu (csv") if line.strip()]
    names = [re.sub(r"\s*\[[^\]]*\]$", "", c) for c in body[0].split(", ")]
    return dict(zip(names, body[1].split(", "), strict=True))


def sim_row(smi: Smi, fields: list[str]) -> dict[str, str]:
    out, rc = smi("-i", "0", f"--query-gpu={','.join(fields)}", "--format=csv,noheader")
    assert rc == 0, out
    return dict(zip(fields, out.strip().split(", "), strict=True))


def h200_capture_mig_layout(make_smi) -> Smi:
    """An H200 with the MIG capture's devices: 3g.71gb holding a 1c and a 2c compute instance, 2g.35gb, 2x 1g.18gb."""
    smi = make_smi("h200-8")
    assert smi("-i", "0", "-mig", "1")[1] == 0
    out, rc = smi("mig", "-i", "0", "-cgi", "9,14,19,19")
    assert rc == 0, out
    listing, _ = smi("mig", "-i", "0", "-lgi")
    created = re.findall(r"MIG (\S+)\s+\d+\s+(\d+)\s+\d+:\d+", listing)
    assert sorted(name for name, _ in created) == ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"], listing
    for name, gi in created:
        profiles = {"3g.71gb": "0,1", "2g.35gb": "1", "1g.18gb": "0"}[name]  # CI profile 0 = 1c, 1 = 2c
        out, rc = smi("mig", "-i", "0", "-gi", gi, "-cci", profiles)
        assert rc == 0, out
    return smi


# -------------------------------------------------------------------------------------------- MIG in -q


def _q_mig_devices(lines: list[str]) -> list[tuple]:
    devices, current = [], None
    for line in lines:
        label, _, value = line.partition(" : ")
        label = label.strip()
        if line.strip() == "MIG Device":
            current = {}
            devices.append(current)
        elif current is not None and label in ("Multiprocessor count", "Copy Engine count", "Encoder count",
                                                "Decoder count", "OFA count", "JPG count"):
            current[label] = int(value)
        elif current is not None and label == "Total" and "FB" not in current:
            current["FB"] = value.strip()
        elif line.startswith("    Accounting Mode"):
            break
    return sorted(tuple(sorted(d.items())) for d in devices)


def test_mig_q_reports_each_compute_instance_sms(make_smi):
    smi = h200_capture_mig_layout(make_smi)
    out, rc = smi("-q", "-i", "0")
    assert rc == 0
    real = _q_mig_devices(capture_section(H200_MIG, "idle :: query (-q)"))
    assert _q_mig_devices(out.splitlines()) == real
    sms = sorted(dict(d)["Multiprocessor count"] for d in real)
    assert sms == [16, 16, 16, 32, 32]  # 1c.3g 16, 2c.3g 32, 2g.35gb 32, 1g.18gb 16 twice


def test_mig_table_rows_match_the_real_h200_mig_table(make_smi):
    smi = h200_capture_mig_layout(make_smi)
    out, _ = smi("-i", "0")
    cells = re.compile(r"^\|\s+\d+\s+\d+\s+\d+\s+\d+\s+\|\s+\d+MiB /\s*(\d+MiB)\s+\|\s+(\d+)\s+\d+\s+\|(.*)\|$")
    rows = lambda text: sorted(m.groups() for m in map(cells.match, text.splitlines()) if m)  # noqa: E731
    assert rows(out) == rows("\n".join(capture_section(H200_MIG, "idle :: nvidia-smi (default table)")))


# ------------------------------------------------------------------------------------ --query-gpu values

REMAP_FIELDS = ["remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending",
                "remapped_rows.failure", "remapped_rows.histogram.max", "remapped_rows.histogram.high",
                "remapped_rows.histogram.partial", "remapped_rows.histogram.low", "remapped_rows.histogram.none"]
IDENTITY_FIELDS = ["name", "pci.device_id", "pci.sub_device_id", "vbios_version", "inforom.img", "inforom.oem",
                   "inforom.ecc", "inforom.pwr", "display_attached", "memory.total", "memory.reserved"]


def test_mig_mode_prints_the_remap_histogram(make_smi):
    smi = make_smi("h200-8")
    assert smi("-i", "0", "-mig", "1")[1] == 0
    real = real_row(H200_MIG)
    assert sim_row(smi, REMAP_FIELDS) == {f: real[f] for f in REMAP_FIELDS}
    assert real["remapped_rows.histogram.max"] == "3072" and real["remapped_rows.correctable"] == "[N/A]"


@pytest.mark.parametrize(("profile", "capture"), [("h200-8", H200), ("h100-sxm-8", H100)])
def test_identity_and_remap_constants_are_the_models_own(make_smi, profile, capture):
    smi = make_smi(profile)
    real = real_row(capture)
    fields = IDENTITY_FIELDS + REMAP_FIELDS
    assert sim_row(smi, fields) == {f: real[f] for f in fields}


Q_LABELS = ("Display Attached", "Board Part Number", "GPU Part Number", "FRU Part Number", "Image Version",
            "OEM Object", "ECC Object", "Power Management Object", "Histogram Max")


def q_values(lines: list[str]) -> dict[str, str]:
    """Values of Q_LABELS in -q output; the histogram's "Max" (a label used elsewhere too) by its section."""
    values: dict[str, str] = {}
    histogram = False
    for line in lines:
        label, _, value = line.partition(" : ")
        label = label.strip()
        histogram = histogram or label == "Bank Remap Availability Histogram"
        if histogram and label == "Max":
            label, histogram = "Histogram Max", False
        if label in Q_LABELS and label not in values:
            values[label] = value.strip()
    return values


@pytest.mark.parametrize(("profile", "capture"), [("h200-8", H200), ("h100-sxm-8", H100)])
def test_q_agrees_with_its_query_gpu_and_the_real_board(make_smi, profile, capture):
    smi = make_smi(profile)
    out, rc = smi("-q", "-i", "0")
    assert rc == 0
    sim = q_values(out.splitlines())
    assert sim == q_values(capture_section(capture, "idle :: query (-q)"))
    assert len(sim) == len(Q_LABELS)
    query = sim_row(smi, ["display_attached", "inforom.img", "remapped_rows.histogram.max"])
    assert (sim["Display Attached"], sim["Image Version"], sim["Histogram Max"]) == (
        query["display_attached"], query["inforom.img"], query["remapped_rows.histogram.max"] + " bank(s)")


# ------------------------------------------------------------------------- commands the -h text lists


@pytest.mark.parametrize(("option", "title"), [
    ("--help-query-gpu", "capabilities :: help-query-gpu"),
    ("--help-query-compute-apps", "capabilities :: help-query-compute-apps"),
    ("--help-query-accounted-apps", "capabilities :: help-query-accounted-apps"),
    ("--help-query-retired-pages", "capabilities :: help-query-retired-pages"),
])
@pytest.mark.parametrize(("driver", "capture"), [("590.48.01", H100), (DRIVER_610, R610)])
def test_help_query_texts_are_the_real_ones(make_smi, option, title, driver, capture):
    smi = make_smi("h200-8", driver=driver)
    out, rc = smi(option)
    assert rc == 0
    assert out.rstrip("\n").split("\n") == capture_section(capture, title)


def test_help_query_gpu_needs_no_driver(make_smi):
    out, rc = make_smi("h200-8", loaded=False)("--help-query-gpu")
    assert rc == 0 and '"driver_version"' in out and '"kmd_version"' not in out


def test_query_retired_pages_and_accounted_apps(make_smi):
    smi = make_smi("h200-8")
    spec = ("timestamp,gpu_name,gpu_bus_id,gpu_serial,gpu_uuid,retired_pages.address,retired_pages.timestamp,"
            "retired_pages.cause")
    out, rc = smi("-i", "0", f"--query-retired-pages={spec}", "--format=csv")
    real = capture_section(H200, "idle :: query-retired-pages")
    assert rc == 0 and out.splitlines()[0] == real[0]
    assert [row.split(", ")[5:] for row in out.splitlines()[1:]] == [row.split(", ")[5:] for row in real[1:]]
    assert [row.split(", ")[1] for row in out.splitlines()[1:]] == ["NVIDIA H200"] * 2
    accounted = ("timestamp,gpu_name,gpu_bus_id,gpu_serial,gpu_uuid,pid,gpu_util,mem_util,max_memory_usage,time")
    out, rc = smi(f"--query-accounted-apps={accounted}", "--format=csv")
    # the real H100 (accounting disabled, like every simulated GPU) prints the header only
    assert (rc, out.splitlines()) == (0, capture_section(H100, "load :: query-accounted-apps"))
    out, rc = smi("--query-accounted-apps=pid,bogus", "--format=csv")
    assert rc == 2 and 'Field "bogus" is not a valid field to query.' in out


@pytest.mark.parametrize("mig", [False, True])
def test_dmon_layout(make_smi, mig):
    smi = make_smi("h200-8")
    if mig:
        assert smi("-i", "0", "-mig", "1")[1] == 0
    out, rc = smi("dmon", "-c", "2", "-i", "0")
    real = capture_section(H200_MIG if mig else H200, "idle :: dmon")
    assert rc == 0
    assert out.splitlines()[:2] == real[:2]
    assert [shape(line) for line in out.splitlines()[2:]] == [shape(line) for line in real[2:4]]


def test_pmon_layout(make_smi, holder):
    smi = make_smi("h200-8")
    out, rc = smi("pmon", "-c", "1", "-i", "0")
    real = capture_section(H100, "idle :: pmon")
    assert rc == 0 and out.splitlines() == real[:3]
    smi.set(f"gpu.0.proc.{holder}", "/root/tools/memhog,1542,,,C")
    out, _ = smi("pmon", "-c", "1", "-i", "0")
    busy = capture_section(H100, "load :: pmon")
    assert shape(out.splitlines()[2]) == shape(busy[2].replace("11327", str(holder).rjust(5)))


# ------------------------------------------------------------------------------------ driver generations


def test_590_rejects_kmd_version_and_610_answers_both(make_smi):
    out, rc = make_smi("h200-8")("--query-gpu=kmd_version", "--format=csv")
    assert rc == 2 and 'Field "kmd_version" is not a valid field to query.' in out
    smi = make_smi("h200-8", driver=DRIVER_610)
    assert sim_row(smi, ["kmd_version", "driver_version"]) == {"kmd_version": DRIVER_610, "driver_version": DRIVER_610}
    real = real_row(R610)  # the real 610 answers both, driver_version only deprecated
    assert real["kmd_version"] == real["driver_version"] == DRIVER_610


@pytest.mark.parametrize(("driver", "capture"), [("590.48.01", H100), (DRIVER_610, R610)])
def test_help_is_the_real_one_of_each_generation(make_smi, driver, capture):
    out, rc = make_smi("h200-8", driver=driver)("-h")
    assert rc == 0 and out.rstrip("\n").split("\n") == capture_section(capture, "capabilities :: help (-h)")


def test_610_version_and_q_header_are_the_real_ones(make_smi):
    smi = make_smi("h200-8", driver=DRIVER_610)
    out, rc = smi("--version")
    assert rc == 0 and out.rstrip("\n").split("\n") == capture_section(R610, "capabilities :: version")
    out, _ = smi("-q", "-i", "0")
    real = capture_section(R610, "idle :: query (-q)")
    assert real[3].startswith("Timestamp") and real[4].startswith("Driver Version")
    assert [shape(line) for line in out.splitlines()[4:8]] == [shape(line) for line in real[4:8]]


# ------------------------------------------------------------------------------------- NVML field values


def test_nvml_field_value_memory_temperature(sim):  # the sim fixture of test_sim_nvml: the built library
    from test_sim_nvml import make_state

    state = make_state("h200-8")
    state["gpu.0.temp.memory"] = real_row(H200)["temperature.memory"]  # 32, the real H200's
    l40s = make_state("l40s-4")
    sim.write(state)
    out = sim.run('''
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(0)
        v = nvmlDeviceGetFieldValues(h, [NVML_FI_DEV_MEMORY_TEMP, NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION])
        out["mem"] = [v[0].nvmlReturn, v[0].valueType, v[0].value.uiVal, v[0].fieldId, v[0].timestamp > 0]
        out["other"] = v[1].nvmlReturn
    ''')
    assert out["mem"] == [0, 1, 32, 82, True]
    assert out["other"] == 3  # NVML_ERROR_NOT_SUPPORTED, per value
    sim.write(l40s)  # GDDR: nvidia-smi prints N/A for the memory temperature (real L40S capture)
    assert real_row("linux-x86_64__nvidia-l40s__595.80.txt")["temperature.memory"] == "N/A"
    out = sim.run('''
        nvmlInit()
        v = nvmlDeviceGetFieldValues(nvmlDeviceGetHandleByIndex(0), [NVML_FI_DEV_MEMORY_TEMP])
        out["ret"] = v[0].nvmlReturn
    ''')
    assert out["ret"] == 3
