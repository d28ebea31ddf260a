"""A V100 host (pre-Turing: closed kernel modules) and an L4 host (MIG Mode N/A), new to the catalog, on the
simulated fleet: deploys/gpu_node.py converges both, a second run changes nothing, and `gpufleet verify` passes,
judged by the simulator's own state (the hosts' nvidia-smi and its packages). `gpufleet catalog learn` reads both
hosts into model files the strict loader accepts, and with those as the user's models (gpufleet_catalog_dir) the
converge changes nothing and verify passes: the learned models decide the hosts as the packaged ones do."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import BIN, REPO, bring_up, check_path, grand_total, save_deb_cache, ssh

from gpufleet.catalog import Catalog, load_package_catalog
from gpufleet.sim import hosts

INVENTORY = "inventories/sim.py"
PROFILES = ["v100-16gb-8", "l4-1"]
V100, L4 = "node01", "node02"


def converge(*extra: str) -> subprocess.CompletedProcess:
    result = subprocess.run([str(BIN / "pyinfra"), "-y", *extra, INVENTORY, "deploys/gpu_node.py"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]
    check_path(result.stdout, "GPUFLEET_FACT_MEMO")
    return result


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = bring_up(tmp_path_factory, PROFILES)
    fleet.first = converge()
    fleet.out = tmp_path_factory.mktemp("verify")
    yield fleet
    save_deb_cache(fleet)
    hosts.down(log=lambda *_: None)


def test_both_hosts_converge_with_the_driver_their_gpus_need(fleet):
    total = grand_total(fleet.first.stdout)
    assert total["error"] == "-" and total["success"] != "-", fleet.first.stdout[-4000:]
    listing = ssh(fleet, V100, "nvidia-smi -L").stdout.splitlines()
    assert len(listing) == 8 and all("Tesla V100-SXM2-16GB" in line for line in listing)
    assert "NVIDIA L4" in ssh(fleet, L4, "nvidia-smi -L").stdout
    held = {name: ssh(fleet, name, "apt-mark showhold").stdout.split() for name in (V100, L4)}
    # auto flavour: the closed modules on Volta (the open ones cannot drive it), the open ones on Ada (NVIDIA's
    # Debian package names: cuda-drivers-580 / nvidia-open-580)
    assert held == {V100: ["cuda-drivers-580"], L4: ["nvidia-open-580"]}
    mig = ssh(fleet, L4, "nvidia-smi --query-gpu=mig.mode.current --format=csv,noheader").stdout.strip()
    assert mig == "[N/A]"


def test_second_run_changes_nothing(fleet):
    output = converge().stdout
    total = grand_total(output)
    assert (total["success"], total["error"]) == ("-", "-"), output[-4000:]


def verify_passes(fleet, *extra: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / "gpufleet"), "verify", INVENTORY, "--out", str(fleet.out), *extra], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((fleet.out / "report.json").read_text())
    assert [h["host"] for h in report["hosts"]] == [V100, L4]
    checks = [c for h in report["hosts"] for c in h["checks"]]
    assert {c["verdict"] for c in checks} <= {"pass", "skip"}, [c for c in checks if c["verdict"] not in
                                                                ("pass", "skip")]
    models = {c["host"]: c["message"] for c in checks if c["check"] == "health.gpu_model"}
    assert models == {V100: "8x Tesla V100-SXM2-16GB", L4: "1x NVIDIA L4"}
    return proc


def test_verify_passes(fleet):
    verify_passes(fleet)


def test_learned_models_load_and_decide_the_hosts_as_the_packaged_ones(fleet, tmp_path):
    learned = tmp_path / "gpufleet_catalog"
    for host, key in ((V100, "v100-sxm2-16gb"), (L4, "l4")):
        proc = subprocess.run([str(BIN / "gpufleet"), "catalog", "learn", INVENTORY, host, "--dir", str(learned)],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"-> {learned / (key + '.json')} (key {key}, replaces the packaged model)" in proc.stdout
    user = Catalog.from_directory(learned)  # the strict loader
    assert sorted(user.keys()) == ["l4", "v100-sxm2-16gb"]
    packaged = load_package_catalog()
    for key in user.keys():
        mine, theirs = user.get(key), packaged.get(key)
        assert all(s.startswith("real: nvidia-smi ") and " (gpufleet catalog learn)" in s
                   for f, s in mine.sources.items() if f in ("name", "memory_mib", "power_limits_w"))
        assert (mine.architecture, mine.datacenter, mine.mig, mine.compute_capability) == (
            theirs.architecture, theirs.datacenter, theirs.mig, theirs.compute_capability)
    # the simulated V100 server's boards as the real one's: both power variants read from the host
    assert {(v.default_w, v.min_w, v.max_w) for v in user.get("v100-sxm2-16gb").power_limits_w} == {
        (300.0, 150.0, 300.0), (300.0, 100.0, 300.0)}
    # with the learned models as the user's, the converge changes nothing and verify passes
    setting = f"gpufleet_catalog_dir={learned}"
    output = converge("--data", setting).stdout
    total = grand_total(output)
    assert (total["success"], total["error"]) == ("-", "-"), output[-4000:]
    assert f"gpufleet: catalog: {learned}/l4.json replaces the packaged model 'l4'" in output
    proc = verify_passes(fleet, "--data", setting)
    assert f"{learned}/v100-sxm2-16gb.json replaces the packaged model 'v100-sxm2-16gb'" in proc.stderr
