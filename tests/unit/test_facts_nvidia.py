"""GpuInventory and MigState against real nvidia-smi output (tests/fixtures/facts, sources in its README)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pyinfra_harness import FACT_FIXTURES, fixture, wrap

from gpufleet.facts import GpuInventory, MigState, instances_by_gpu
from gpufleet.facts.nvidia import gpu_query_fields, parse_gpu_query
from gpufleet.facts.sections import parse_sections, section


def inventory(text: str | None, rc: int = 0) -> dict:
    return GpuInventory().process(wrap("query", text, rc))


# --------------------------------------------------------------------------------------------- sections


def test_section_protocol_runs_in_a_shell():
    command = "; ".join([
        section("a", "echo hello; sh -c 'exit 3'"),
        section("b", "echo to-stderr >&2; true"),
        section("c", "echo never", requires="no-such-program-gpufleet"),
    ])
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    sections = parse_sections(out.stdout)
    assert (sections["a"].lines, sections["a"].rc) == (["hello"], 3)
    assert (sections["b"].lines, sections["b"].rc) == (["to-stderr"], 0)
    assert sections["c"].present is False and sections["c"].lines == []


def test_commands_always_exit_zero_without_nvidia_smi(tmp_path):
    env = {"PATH": str(tmp_path)}  # nothing on PATH: not even nvidia-smi
    for fact in (GpuInventory(), MigState()):
        out = subprocess.run(["/bin/sh", "-c", fact.command()], capture_output=True, text=True, env=env)
        assert out.returncode == 0
        assert fact.process(out.stdout.splitlines())["status"] == "absent"


# --------------------------------------------------------------------------------------------- GpuInventory


def test_command_queries_all_fields_at_once():
    # the query and its fallback (a driver that rejects driver_version); the stand-in tests below count the calls
    command = GpuInventory().command()
    query = "nvidia-smi --query-gpu=" + ",".join(gpu_query_fields("$version_field")) + " --format=csv"
    assert command.count("nvidia-smi --") == command.count(query) == 2


def test_query_fixtures_are_the_captures_columns():
    """The query_gpu fixtures are exactly the capture's cells for GpuInventory's fields (no hand edits)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("extract_query_gpu", FACT_FIXTURES / "extract_query_gpu.py")
    extract = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extract)
    checked = 0
    for key, name in extract.CAPTURES.items():
        for phase in ("idle", "load"):
            assert fixture(f"query_gpu_{key}_{phase}.txt") == extract.extract(extract.DEFAULT_CAPTURES / name, phase)
            checked += 1
    assert checked == 16


# -------------------------------------------------------------- driver_version (590) / kmd_version (595, 610)


def run_command_against(tmp_path, query_fixture: str, answers: tuple[str, ...]) -> tuple[dict, list[str]]:
    """GpuInventory's own shell command run by bash against an nvidia-smi stand-in; returns the fact and the
    nvidia-smi calls it made. The stand-in answers a query whose driver version field is one of ``answers`` with
    the real fixture's rows (its header naming that field: real 595+ drivers print the same cells for both), and
    rejects any other field as nvidia-smi rejects a field it does not know."""
    header, body = fixture(query_fixture).split("\n", 1)
    names = [c.split(" [")[0] for c in header.split(", ")]
    version = next(n for n in names if n in ("driver_version", "kmd_version"))
    stub = tmp_path / "nvidia-smi"
    cases = ""
    for field in answers:
        (tmp_path / f"{field}.txt").write_text(header.replace(version, field) + "\n" + body)
        asked = ",".join(field if n == version else n for n in names)
        cases += f"  --query-gpu={asked}) cat {tmp_path}/{field}.txt ;;\n"
    rejected = next(f for f in ("driver_version", "kmd_version") if f not in answers) if len(answers) < 2 else ""
    stub.write_text(f"""#!/bin/sh
echo "$*" >> {tmp_path}/calls
case "$1" in
{cases}  *) echo 'Field "{rejected}" is not a valid field to query.'; echo; exit 2 ;;
esac
""")
    stub.chmod(0o755)
    out = subprocess.run(["bash", "-c", GpuInventory().command()], capture_output=True, text=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=30)
    calls = (tmp_path / "calls").read_text().splitlines()
    return GpuInventory().process(out.stdout.splitlines()), calls


def test_590_query_uses_driver_version_in_one_call(tmp_path):
    fact, calls = run_command_against(tmp_path, "query_gpu_h200_590.48.01_idle.txt", answers=("driver_version",))
    assert (fact["status"], fact["driver_version_field"], fact["driver_version"]) == (
        "ok", "driver_version", "590.48.01")
    assert fact["gpus"][0]["driver_version"] == "590.48.01"
    assert len(calls) == 1


def test_610_answers_the_deprecated_driver_version_in_one_call(tmp_path):
    # real 595+ drivers answer both fields with the same value (test_sim_fidelity checks it on a real capture)
    fact, calls = run_command_against(tmp_path, "query_gpu_rtx2080-super_610.57.04_idle.txt",
                                      answers=("driver_version", "kmd_version"))
    assert (fact["status"], fact["driver_version_field"], fact["driver_version"]) == (
        "ok", "driver_version", "610.57.04")
    assert fact["gpus"][0]["name"] == "NVIDIA GeForce RTX 2080 SUPER"
    assert len(calls) == 1


def test_a_driver_without_driver_version_is_asked_again_for_kmd_version(tmp_path):
    fact, calls = run_command_against(tmp_path, "query_gpu_l40s_595.80_idle.txt", answers=("kmd_version",))
    assert (fact["status"], fact["driver_version_field"], fact["driver_version"]) == ("ok", "kmd_version", "595.80")
    assert fact["gpus"][0]["driver_version"] == "595.80"
    assert [("driver_version" in c, "kmd_version" in c) for c in calls] == [(True, False), (False, True)]


@pytest.mark.parametrize("failure, rc, status", [
    ("smi_driver_not_loaded.txt", 9, "driver_not_loaded"),
    # the rows of the GPUs that answered, under a header naming driver_version, then the lost one's error
    ("query_gpu_h100-80gb-hbm3_590.48.01_idle.txt+smi_gpu_fallen_off_bus.txt", 15, "gpu_lost"),
])
def test_a_failed_query_is_not_asked_again(tmp_path, failure, rc, status):
    stub = tmp_path / "nvidia-smi"
    output = " ".join(str(FACT_FIXTURES / name) for name in failure.split("+"))
    stub.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/calls\ncat {output}\nexit {rc}\n")
    stub.chmod(0o755)
    out = subprocess.run(["bash", "-c", GpuInventory().command()], capture_output=True, text=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=30)
    fact = GpuInventory().process(out.stdout.splitlines())
    assert (fact["status"], fact["exit_code"], fact["driver_version_field"]) == (status, rc, "driver_version")
    assert len((tmp_path / "calls").read_text().splitlines()) == 1


def test_version_field_marker_and_header():
    marker = ["gpufleet-version-field: kmd_version"]
    fact = GpuInventory().process(wrap("query", "\n".join(marker) + "\n"
                                       + fixture("query_gpu_rtx2080-super_610.57.04_load.txt")))
    assert (fact["driver_version_field"], fact["driver_version"], fact["status"]) == ("kmd_version", "610.57.04", "ok")
    # a bare query's output (no marker): the header says which field was asked
    bare = inventory(fixture("query_gpu_h200-mig_590.48.01_idle.txt"))
    assert (bare["driver_version_field"], bare["driver_version"]) == ("driver_version", "590.48.01")
    assert bare["gpus"][0]["mig_current"] == "Enabled"
    # driver not loaded: the field asked for is still reported, no GPUs
    failed = GpuInventory().process(wrap("query", "gpufleet-version-field: driver_version\n"
                                         + fixture("smi_driver_not_loaded.txt"), rc=9))
    assert (failed["status"], failed["driver_version_field"], failed["gpus"]) == (
        "driver_not_loaded", "driver_version", [])


def test_h100_capture():
    fact = inventory(fixture("query_gpu_h100-80gb-hbm3_590.48.01_idle.txt"))
    assert fact["status"] == "ok" and fact["error"] is None and fact["exit_code"] == 0
    assert fact["driver_version"] == "590.48.01"
    assert fact["gpus"] == [{
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "serial": "0000000000000",
        "pci_bus_id": "00000000:00:09.0",
        "pci_device_id": "0x233010DE",
        "driver_version": "590.48.01",
        "vbios_version": "96.00.A5.00.01",
        "compute_cap": "9.0",
        "memory_total_mib": 81559,
        "persistence_mode": "Enabled",
        "power_limit_w": 700.0,
        "power_enforced_w": 700.0,
        "power_default_w": 700.0,
        "power_min_w": 200.0,
        "power_max_w": 700.0,
        "temperature_c": 41,
        "mig_current": "Disabled",
        "mig_pending": "Disabled",
        "ecc_current": "Enabled",
        "clocks_max_sm_mhz": 1980,
    }]


def test_h100_in_mig_mode_capture():
    (gpu,) = inventory(fixture("query_gpu_h100-mig_590.48.01_idle.txt"))["gpus"]
    assert (gpu["mig_current"], gpu["mig_pending"]) == ("Enabled", "Enabled")


@pytest.mark.parametrize(("name", "expected"), [
    ("query_gpu_l40s_595.80_idle.txt",
     {"name": "NVIDIA L40S", "persistence_mode": "Disabled", "power_min_w": 100.0, "power_max_w": 350.0,
      "mig_current": None, "serial": "0000000000000", "compute_cap": "8.9"}),
    ("query_gpu_rtx4080-super_595.71.05_idle.txt",
     {"name": "NVIDIA GeForce RTX 4080 SUPER", "power_default_w": 320.0, "power_min_w": 150.0,
      "power_max_w": 400.0, "mig_current": None, "mig_pending": None, "ecc_current": None, "serial": None}),
    ("query_gpu_rtx2080-super_595.71.05_idle.txt",
     {"name": "NVIDIA GeForce RTX 2080 SUPER", "power_limit_w": 250.0, "power_min_w": 105.0, "power_max_w": 350.0,
      "pci_bus_id": "00000000:0C:00.0", "pci_device_id": "0x1E8110DE", "compute_cap": "7.5"}),
])
def test_other_captures(name, expected):
    fact = inventory(fixture(name))
    assert fact["status"] == "ok"
    (gpu,) = fact["gpus"]
    assert {k: gpu[k] for k in expected} == expected


def test_load_capture_differs_only_in_live_values():
    idle = inventory(fixture("query_gpu_h100-80gb-hbm3_590.48.01_idle.txt"))["gpus"][0]
    load = inventory(fixture("query_gpu_h100-80gb-hbm3_590.48.01_load.txt"))["gpus"][0]
    assert {k for k in idle if idle[k] != load[k]} <= {"temperature_c"}


def test_header_must_match_query():
    text = fixture("query_gpu_h100-80gb-hbm3_590.48.01_idle.txt").replace("power.limit [W]", "power.draw [W]")
    fact = inventory(text)
    assert fact["status"] == "error" and fact["gpus"] == []
    assert fact["error"].startswith("nvidia-smi header does not match the query:")


def test_nounits_output_parses_too():
    header, row = fixture("query_gpu_h100-80gb-hbm3_590.48.01_idle.txt").splitlines()
    row = row.replace(" MiB", "").replace(" W", "").replace(" MHz", "")
    gpus, other = parse_gpu_query([header.replace(" [MiB]", "").replace(" [W]", "").replace(" [MHz]", ""), row])
    assert other == [] and gpus[0]["memory_total_mib"] == 81559 and gpus[0]["power_min_w"] == 200.0


def test_absent():
    assert inventory(None) == GpuInventory.default()
    assert GpuInventory.default()["error"] == "nvidia-smi not found" and GpuInventory.default()["gpus"] == []


@pytest.mark.parametrize(("name", "rc", "status"), [
    ("smi_driver_not_loaded.txt", 9, "driver_not_loaded"),
    ("smi_version_mismatch.txt", 18, "version_mismatch"),
    ("smi_no_devices.txt", 6, "no_devices"),
])
def test_failures(name, rc, status):
    fact = inventory(fixture(name), rc)
    assert fact["status"] == status and fact["gpus"] == [] and fact["exit_code"] == rc
    assert fact["error"] == " ".join(fixture(name).split("\n")).strip()


def test_other_failure_is_error_with_message():
    fact = inventory("Unable to determine the device handle for gpu 0000:01:00.0: Unknown Error", 255)
    assert (fact["status"], fact["exit_code"], fact["gpus"]) == ("error", 255, [])
    assert fact["error"] == "Unable to determine the device handle for gpu 0000:01:00.0: Unknown Error"


def test_lost_gpu_between_rows():
    header, row = fixture("query_gpu_h100-80gb-hbm3_590.48.01_idle.txt").splitlines()
    second = row.replace("0, NVIDIA", "2, NVIDIA", 1)
    lost_line = fixture("smi_gpu_fallen_off_bus.txt").strip()
    fact = inventory("\n".join([header, row, lost_line, second]), rc=15)
    assert fact["status"] == "gpu_lost"
    assert [g["index"] for g in fact["gpus"]] == [0, 2]
    assert fact["lost_gpus"] == ["0000:01:00.0"]
    assert fact["error"] == lost_line


def test_cut_short_output():
    fact = GpuInventory().process(["@@gpufleet begin query", "index, name"])
    assert fact["status"] == "error"


# ------------------------------------------------------------------------------------------------ MigState


def mig(lgi: str | None, lci: str | None, lgi_rc: int = 0, lci_rc: int = 0) -> dict:
    return MigState().process(wrap("lgi", lgi, lgi_rc) + wrap("lci", lci, lci_rc))


def test_mig_command_is_one_remote_command():
    command = MigState().command()
    assert "nvidia-smi mig -lgi" in command and "nvidia-smi mig -lci" in command


def test_mig_real_h100_seven_1g():
    state = mig(fixture("mig_lgi_h100_7x1g.txt"), fixture("mig_lci_h100_7x1g_excerpt.txt"))
    assert state["status"] == "ok" and state["error"] is None
    gis = state["gpu_instances"]
    assert [(g["gi_id"], g["placement_start"], g["placement_size"]) for g in gis] == [
        (7, 0, 1), (8, 1, 1), (9, 2, 1), (10, 3, 1), (11, 4, 1), (12, 5, 1), (13, 6, 1)]
    assert {(g["gpu"], g["profile"], g["profile_id"]) for g in gis} == {(0, "1g.10gb", 19)}
    # the excerpt elides GIs 9-12 with "[...]" (see README): three rows remain
    assert state["compute_instances"] == [
        {"gpu": 0, "gi_id": 7, "profile": "1g.10gb", "profile_id": 0, "ci_id": 0,
         "placement_start": 0, "placement_size": 1},
        {"gpu": 0, "gi_id": 8, "profile": "1g.10gb", "profile_id": 0, "ci_id": 0,
         "placement_start": 0, "placement_size": 1},
        {"gpu": 0, "gi_id": 13, "profile": "1g.10gb", "profile_id": 0, "ci_id": 0,
         "placement_start": 0, "placement_size": 1},
    ]
    grouped = instances_by_gpu(state)
    assert sorted(grouped[0]) == [7, 8, 9, 10, 11, 12, 13]
    assert [c["ci_id"] for c in grouped[0][13]["compute_instances"]] == [0]
    assert grouped[0][10]["compute_instances"] == []


def test_mig_mixed_layout_from_simulator():
    state = mig(fixture("sim_mig_lgi_h100_mixed.txt"), fixture("sim_mig_lci_h100_mixed.txt"))
    assert sorted((g["profile"], g["gi_id"], g["placement_start"]) for g in state["gpu_instances"]) == [
        ("1g.10gb", 9, 2), ("1g.10gb", 10, 3), ("2g.20gb", 3, 0), ("3g.40gb", 2, 4)]
    assert sorted((c["gi_id"], c["profile_id"], c["placement_size"]) for c in state["compute_instances"]) == [
        (2, 2, 3), (3, 1, 2), (9, 0, 1), (10, 0, 1)]


def test_mig_partial_compute_instance_and_old_layout():
    lci = "\n".join([
        "| GPU     GPU       Name             Profile   Instance |",
        "|   0      1       MIG 1c.3g.40gb       0         0    |",
        "|   0      1       MIG 2c.3g.40gb       1         1    |",
    ])
    state = mig("|   0  MIG 3g.40gb          9        1          4:4     |", lci)
    assert [(c["profile"], c["ci_id"], c["placement_start"]) for c in state["compute_instances"]] == [
        ("1c.3g.40gb", 0, None), ("2c.3g.40gb", 1, None)]


def test_mig_none_found_is_ok_and_empty():
    state = mig("No GPU instances found: Not Found", "No compute instances found: Not Found", 6, 6)
    assert state == {"status": "ok", "error": None, "gpu_instances": [], "compute_instances": []}


def test_mig_not_supported_and_not_enabled():
    text = fixture("mig_lgip_not_supported.txt")
    assert mig(text, text, 6, 6)["status"] == "not_supported"
    assert mig("No MIG-enabled devices found.", "No MIG-enabled devices found.", 6, 6)["status"] == "not_enabled"


def test_mig_driver_not_loaded_and_absent():
    text = fixture("smi_driver_not_loaded.txt")
    state = mig(text, text, 9, 9)
    assert state["status"] == "driver_not_loaded" and state["error"] == text.strip()
    assert mig(None, None) == MigState.default()


# ------------------------------------------------------------- the fact commands against the simulated nvidia-smi


@pytest.fixture
def sim_smi(tmp_path):
    """``nvidia-smi`` on PATH = gpufleet's simulated one over a fresh 8x H100 state (driver loaded)."""
    import sys

    from gpufleet.sim.hardware import build_state

    state = dict(build_state("h100-sxm-8", "node1"))
    state.update({"driver.loaded": "1", "driver.version": "580.95.05", "driver.cuda_version": "13.0"})
    for key in [k for k in state if ".client." in k or ".proc." in k]:
        del state[key]
    state_file = tmp_path / "gpus.state"
    state_file.write_text("".join(f"{k}={state[k]}\n" for k in sorted(state)))
    version = tmp_path / "driver-version"
    version.write_text("580.95.05\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "nvidia-smi"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"export GPUFLEET_SIM_STATE={state_file} GPUFLEET_SIM_DRIVER_VERSION_FILE={version}\n"
        f'exec {sys.executable} -c "import sys; from gpufleet.sim.gpu.nvidia_smi import main; '
        'sys.exit(main(sys.argv[1:]))" "$@"\n')
    wrapper.chmod(0o755)

    def run(fact):
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parents[2])}
        out = subprocess.run(["/bin/sh", "-c", fact.command()], capture_output=True, text=True, env=env,
                             check=True)
        return fact.process(out.stdout.splitlines())

    return run


def test_gpu_inventory_command_against_simulator(sim_smi):
    fact = sim_smi(GpuInventory())
    assert fact["status"] == "ok" and len(fact["gpus"]) == 8 and fact["driver_version"] == "580.95.05"
    assert {(g["name"], g["pci_device_id"], g["power_max_w"]) for g in fact["gpus"]} == {
        ("NVIDIA H100 80GB HBM3", "0x233010DE", 700.0)}
    assert [g["index"] for g in fact["gpus"]] == list(range(8))


def test_mig_command_against_simulator(sim_smi):
    fact = sim_smi(MigState())
    assert fact["status"] == "not_enabled" and fact["gpu_instances"] == []
