"""The GPU exporters and the simulated DCGM held to NVIDIA's upstream files as tests/reference/upstream records them
(facts with provenance; tests/upstream.py serves them under the upstream relpaths): unit names,
ExecStart binary, flags and their units, the counters file's format, field names and types, label shapes,
nv-hostengine's address, the NVML constants the NVML exporter and the simulated NVML use."""

from __future__ import annotations

import csv
import io
import re
import shlex

import pynvml
import pytest

from gpufleet.exporter import gpu_exporter, xid_err_msg
from gpufleet.operations import exporters, mig
from gpufleet.plan import PROFILING_PACKAGE_UP_TO
from gpufleet.probe import probe
from gpufleet.sim import repo
from gpufleet.sim.gpu import dcgm as simdcgm
from tests import upstream

EXPORTER_UNIT = "dcgm-exporter/packaging/config-files/systemd/nvidia-dcgm-exporter.service"
DCGM_UNIT = "dcgm/config-files/systemd/nvidia-dcgm.service.in"
VERSION = simdcgm.EXPORTER_VERSION  # the release the simulator claims, whose files are kept upstream


def drop_in_sections() -> dict[str, list[tuple[str, str]]]:
    sections: dict[str, list[tuple[str, str]]] = {}
    current = ""
    for line in exporters.dcgm_drop_in_text("0.0.0.0:9400", 15000).splitlines():
        if line.startswith("["):
            current = line.strip("[]")
            sections[current] = []
        elif line and not line.startswith("#"):
            key, value = line.split("=", 1)
            sections[current].append((key, value))
    return sections


# ------------------------------------------------------------------------------------------------ units


def test_the_exporter_unit_is_the_one_nvidias_package_installs():
    assert exporters.DCGM_EXPORTER_UNIT == EXPORTER_UNIT.rsplit("/", 1)[1]
    assert exporters.DCGM_DROP_IN == f"/etc/systemd/system/{exporters.DCGM_EXPORTER_UNIT}.d/gpufleet.conf"
    assert upstream.provenance(EXPORTER_UNIT)["tag"] == VERSION


def test_the_drop_in_replaces_the_packaged_exec_start_with_the_same_binary():
    [packaged] = upstream.unit_values(EXPORTER_UNIT, "Service", "ExecStart")
    binary, *args = shlex.split(packaged)
    assert binary == exporters.DCGM_EXPORTER_BINARY
    service = drop_in_sections()["Service"]
    assert [v for k, v in service if k == "ExecStart"][0] == ""  # the packaged ExecStart reset first
    ours = shlex.split([v for k, v in service if k == "ExecStart"][1])
    assert ours[0] == binary
    # the packaged unit restarts only on abort: ours after any failure
    assert upstream.unit_values(EXPORTER_UNIT, "Service", "Restart") == ["on-abort"]
    assert ("Restart", "on-failure") in service


def test_the_host_engine_unit_is_dcgms_and_the_exporter_is_ordered_after_it():
    dcgm_unit = DCGM_UNIT.rsplit("/", 1)[1].removesuffix(".in")
    assert exporters.DCGM_UNIT == dcgm_unit
    assert upstream.unit_values(EXPORTER_UNIT, "Unit", "After") == [dcgm_unit]
    unit = drop_in_sections()["Unit"]
    assert ("Requires", dcgm_unit) in unit and ("After", dcgm_unit) in unit
    # the MIG stage stops the same units (and DCGM's alias of its unit) before a MIG mode change
    assert {exporters.DCGM_EXPORTER_UNIT, dcgm_unit, *upstream.unit_values(DCGM_UNIT, "Install", "Alias")} <= set(
        mig.DEFAULT_HOLDER_SERVICES)
    assert {exporters.DCGM_EXPORTER_UNIT, dcgm_unit} <= set(mig.UNIT_BEFORE)


def test_the_probe_asks_for_the_real_exporter_unit():
    assert exporters.DCGM_EXPORTER_UNIT.removesuffix(".service") in probe.DEFAULT_SERVICES


# ------------------------------------------------------------------------------------------------ flags


def drop_in_argv() -> list[str]:
    return shlex.split([v for k, v in drop_in_sections()["Service"] if k == "ExecStart"][1])


def flag_of(flags: dict, alias: str) -> str:
    """The long name of a short flag in the recorded facts (aliases as Go source: []string{"f"})."""
    return next(name for name, f in flags.items() if f["aliases"] and f'"{alias}"' in f["aliases"])


def test_every_flag_the_drop_in_passes_is_one_dcgm_exporter_knows():
    flags = upstream.dcgm_exporter_label_facts(VERSION)["flags"]
    argv = drop_in_argv()
    options = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert {flag_of(flags, o.lstrip("-")) for o in options} == {
        "collectors", "address", "collect-interval", "remote-hostengine-info"}
    assert options["-f"] == exporters.DCGM_COUNTERS


def test_collect_interval_is_in_milliseconds_and_the_remote_engine_is_nv_hostengines_address():
    facts = upstream.dcgm_exporter_label_facts(VERSION)
    flags = facts["flags"]
    assert "Unit is milliseconds (ms)" in flags["collect-interval"]["usage"]
    assert flags["collect-interval"]["value"] == "30000"  # what a unit without -c collects at
    argv = drop_in_argv()
    assert argv[argv.index("-c") + 1] == "15000"
    # -r makes dcgm-exporter use a host engine instead of embedding one only when the flag is given
    assert facts["remote_hostengine_only_when_flag_set"]
    host, port = exporters.DCGM_HOSTENGINE.split(":")
    assert argv[argv.index("-r") + 1] == exporters.DCGM_HOSTENGINE
    hostengine = upstream.facts("dcgm")["nv_hostengine"]["options"]
    assert port == hostengine["port"]["default"] == "5555"
    assert hostengine["bind-interface"]["default"] == '"127.0.0.1"' and host == "localhost"


def test_the_simulated_exporter_knows_the_real_flags_names_aliases_and_defaults():
    flags = upstream.dcgm_exporter_label_facts(VERSION)["flags"]
    for name, fact in flags.items():
        aliases, _kind, default = simdcgm.EXPORTER_FLAGS[name]
        assert set(aliases) == set(re.findall(r'"([^"]+)"', fact["aliases"] or "")), name
        if fact["value"].startswith('"'):
            assert default == fact["value"].strip('"'), name
        elif fact["value"].isdigit():
            assert default == fact["value"], name
    hostengine = upstream.facts("dcgm")["nv_hostengine"]["options"]
    assert set(simdcgm.HOSTENGINE_OPTIONS) == set(hostengine)
    for name, fact in hostengine.items():
        assert simdcgm.HOSTENGINE_OPTIONS[name][0] == ((fact["short"],) if fact["short"] else ()), name


# ------------------------------------------------------------------------------------------------ counters


UPSTREAM_COUNTERS = {**upstream.dcgm_exporter_counters("dcgm-exporter/etc/dcp-metrics-included.csv"),
                     **upstream.dcgm_exporter_counters()}


COUNTER_FILES = ("dcgm-exporter/etc/default-counters.csv", "dcgm-exporter/etc/dcp-metrics-included.csv")


def all_upstream_counters() -> dict[str, str]:
    """Every field the upstream counter files name, commented out or not, with its type (where a file names a field
    twice, the enabled row's type)."""
    rows = [row for relpath in COUNTER_FILES for row in upstream.dcgm_exporter_counter_rows(relpath)]
    return {row["field"]: row["type"] for row in sorted(rows, key=lambda row: row["enabled"])}


def test_every_counter_is_a_dcgm_field_with_dcgm_exporters_type():
    known = all_upstream_counters()
    ids = upstream.dcgm_field_ids("v4.5.0")
    for profiling in (False, True):
        for field, kind, _help in csv.reader(io.StringIO(exporters.counters_csv(profiling)[0])):
            if field.startswith("#"):
                continue
            kind = kind.strip()
            assert field in ids or field in known, f"{field}: not a DCGM field"
            if field in known:
                assert kind == known[field], field


def test_thresholds_and_recovery_action_are_dcgm_fields_158_159_1523():
    ids = upstream.dcgm_field_ids("v4.5.0")
    assert (ids["DCGM_FI_DEV_SLOWDOWN_TEMP"], ids["DCGM_FI_DEV_SHUTDOWN_TEMP"],
            ids["DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"]) == (158, 159, 1523)
    fields = [row[0] for row in csv.reader(io.StringIO(exporters.counters_csv(False)[0])) if not row[0].startswith("#")]
    assert {"DCGM_FI_DEV_SLOWDOWN_TEMP", "DCGM_FI_DEV_SHUTDOWN_TEMP", "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"} <= set(
        fields)


def test_the_simulated_fields_have_dcgms_ids():
    ids = upstream.dcgm_field_ids("v4.5.0")
    for name, (field_id, _kind) in simdcgm.FIELDS.items():
        if name in ids:
            assert field_id == ids[name], name


def test_the_nvml_exporter_types_counters_as_dcgm_exporter_does():
    for name, (kind, _help) in gpu_exporter.METRICS.items():
        if name in UPSTREAM_COUNTERS:
            assert kind == UPSTREAM_COUNTERS[name], name


def test_profiling_package_rule_is_the_readmes():
    rule = upstream.recorded("dcgm-exporter/README.profiling-metrics.excerpt.md")["statements"][0]
    assert rule["up_to_generation"] == PROFILING_PACKAGE_UP_TO
    assert rule["package"] == exporters.DCGM_PROFILING_PACKAGE == repo.DCGM_PROFILING_PACKAGE


# ------------------------------------------------------------------------------------------------ labels


def test_the_simulator_labels_as_the_version_it_claims():
    facts = upstream.dcgm_exporter_label_facts(VERSION)
    gpus = {"driver.loaded": "1", "driver.version": "580.95.05", "gpu.count": "1", "gpu.0.uuid": "GPU-1",
            "gpu.0.pci.bus_id": "00000000:18:00.0", "gpu.0.name": "NVIDIA H100 80GB HBM3", "gpu.0.temp.gpu": "40",
            "gpu.0.xid.log": "13,79"}
    counters = [("DCGM_FI_DEV_GPU_TEMP", "gauge", "t"), ("DCGM_FI_DEV_XID_ERRORS", "gauge", "x"),
                ("DCGM_FI_DRIVER_VERSION", "label", "d")]
    text = simdcgm.render(counters, gpus, "localhost")
    temp = next(line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{"))
    wanted = [label.replace("<UUID|uuid>", "UUID") for label in facts["gpu_labels"]
              if label not in ("GPU_I_PROFILE", "GPU_I_ID")]  # MIG labels only on MIG instances
    assert re.findall(r'(\w+)="', temp) == [*wanted, "DCGM_FI_DRIVER_VERSION"]
    assert facts["hostname_label"] == "Hostname"
    xid = next(line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_XID_ERRORS{"))
    assert re.findall(r'(\w+)="', xid)[-2:] == facts["xid_err_labels"] == ["err_code", "err_msg"]
    # with -r the hostname label is the host engine's host, as the release does
    assert facts["hostname_from_remote_hostengine_address"]
    assert simdcgm._hostname({"no-hostname": "false", "remote-hostengine-info": "localhost:5555"}, set(), True) == (
        "localhost")


def test_err_msg_has_dcgm_exporters_shape_with_the_xid_catalogs_names():
    """Released dcgm-exporter sets err_msg from its own table of Xid texts (recorded in its facts, not copied);
    gpufleet's exporters and the simulated dcgm-exporter label the same series with the same labels (the test above,
    tests/unit/test_gpu_exporter.py) and take the text from NVIDIA's Xid catalog: the shape matches, the text
    differs."""
    versions = upstream.facts("dcgm-exporter")["versions"]
    for version, fact in versions.items():  # every release with err_code/err_msg takes err_msg from its table
        labelled = upstream.dcgm_exporter_label_facts(version)["xid_err_labels"] == ["err_code", "err_msg"]
        assert fact["xid_err_msg"]["present"] == labelled, version
    theirs = {int(code): fact["value"] for code, fact in versions[VERSION]["xid_err_msg"]["err_msg_of"].items()}
    assert set(theirs) == {0, 13, 79}
    catalog = upstream.xid_catalog()
    assert xid_err_msg.XID_MNEMONICS == {xid: row["mnemonic"] for xid, row in catalog.items() if row["mnemonic"]}
    ours = {code: xid_err_msg.err_msg(code) for code in theirs}
    assert ours == {0: xid_err_msg.NO_XID, 13: catalog[13]["mnemonic"], 79: catalog[79]["mnemonic"]}
    # one non-empty text per code, as dcgm-exporter's; not its text (its table is not shipped)
    assert all(ours.values()) and len(set(ours.values())) == len(set(theirs.values())) == len(theirs)
    assert not set(ours.values()) & set(theirs.values())
    # a code the catalog does not name: a fixed text, as dcgm-exporter's past its table
    assert not catalog[162]["mnemonic"] and xid_err_msg.err_msg(162) == xid_err_msg.UNKNOWN_XID
    assert xid_err_msg.err_msg(max(catalog) + 1) == xid_err_msg.UNKNOWN_XID


# ------------------------------------------------------------------------------------------------ simulator files


SIM_PACKAGES = {EXPORTER_UNIT: ("datacenter-gpu-manager-exporter", repo.DCGM_EXPORTER_VERSION),
                DCGM_UNIT: ("datacenter-gpu-manager-4-core", repo.DCGM_VERSION)}
# CMake's GNUInstallDirs default for @CMAKE_INSTALL_BINDIR@ (as the recorded template_placeholders say): the unit
# DCGM's build configures from its template
CONFIGURED_PLACEHOLDERS = {"@CMAKE_INSTALL_BINDIR@": "bin"}


def sim_package(tmp_path, package: str, version: str):
    """The tree of one simulated DCGM package, as the simulator's repository builds it."""
    return repo._dcgm_tree(tmp_path, package, version, "1")


def upstream_install_path(relpath: str) -> str:
    """Where NVIDIA's package installs the unit: recorded for the exporter; for DCGM, its CMake unit destination
    under the /usr prefix its ExecStart names."""
    unit = upstream.recorded(relpath)
    if "installed_as" in unit:
        return unit["installed_as"]["path"]
    return f"/usr/{upstream.facts('dcgm')['packages']['unit_destination']['value']}/{unit['unit_name']}"


def configured(relpath: str, value: str) -> str:
    assert set(upstream.recorded(relpath).get("template_placeholders", {})) <= set(CONFIGURED_PLACEHOLDERS)
    for placeholder, configured_value in CONFIGURED_PLACEHOLDERS.items():
        value = value.replace(placeholder, configured_value)
    return value


@pytest.mark.parametrize("relpath", list(SIM_PACKAGES))
def test_the_simulators_packages_install_units_with_the_upstream_directives(tmp_path, relpath):
    """The simulator's units are gpufleet's own text; every directive NVIDIA's unit has is in them, with the same
    value(s), under the same unit name and install path."""
    tree = sim_package(tmp_path, *SIM_PACKAGES[relpath])
    path = upstream_install_path(relpath)
    assert path.rsplit("/", 1)[1] == upstream.recorded(relpath)["unit_name"]
    assert (tree / path.lstrip("/")).is_file(), f"{SIM_PACKAGES[relpath][0]} does not install {path}"
    ours = upstream.parse_systemd_unit((tree / path.lstrip("/")).read_text())
    for section, directives in upstream.systemd_unit(relpath).items():
        for key in dict(directives):
            theirs = [configured(relpath, value) for name, value in directives if name == key]
            assert [value for name, value in ours.get(section, []) if name == key] == theirs, f"[{section}] {key}"


def test_the_simulated_exporter_package_installs_the_default_counters_rows_upstream_enables(tmp_path):
    tree = sim_package(tmp_path, *SIM_PACKAGES[EXPORTER_UNIT])
    path = upstream.recorded(EXPORTER_UNIT)["counters_installed_as"]["path"]
    assert shlex.split(upstream.unit_values(EXPORTER_UNIT, "Service", "ExecStart")[0])[-1] == path
    ours = simdcgm.read_counters(str(tree / path.lstrip("/")))  # as the stand-in reads it
    theirs = [(row["field"], row["type"]) for row in upstream.dcgm_exporter_counter_rows() if row["enabled"]]
    assert sorted((field, kind) for field, kind, _help in ours) == sorted(theirs)


# ------------------------------------------------------------------------------------------------ NVML


def test_nvml_constants_the_exporter_and_the_simulated_nvml_use():
    facts = upstream.nvml_facts()
    ids = {name: fact["value"] for name, fact in facts["field_ids"].items()}
    for name in ("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", "NVML_FI_DEV_MEMORY_TEMP",
                 "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                 "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"):
        assert getattr(pynvml, name) == ids[name], name
    source = (repo.SIMGPU_DIR / "libnvidia-ml.c").read_text()
    for name, value in ids.items():
        match = re.search(rf"#define {name} (\d+)", source)
        if match:
            assert int(match.group(1)) == value, name
    thresholds = {name: fact["value"] for name, fact in facts["temperature_thresholds"].items()}
    assert (pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN) == (
        thresholds["NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"], thresholds["NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"])
