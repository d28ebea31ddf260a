"""`gpufleet verify inventories/sim.py` end to end on three simulated servers (node03 on Debian 13, the others on
Debian 12) converged by deploys/gpu_node.py:
a converged fleet verifies clean, and each injected fault is reported as exactly that fault on exactly that host and
GPU while nothing else fails; an unreachable host is reported as such while the others are verified; every node
gets its Prometheus textfile; `pyinfra INVENTORY verify/gpu_node.py` writes the same report."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import BIN, REPO, bring_up, check_path, gpufleet, save_deb_cache, ssh

from gpufleet import web_auth
from gpufleet.sim import hosts

INVENTORY = "inventories/sim.py"
PROFILES = ["h100-sxm-8", "a100-40gb-1", "rtx4090-1@debian13"]
NODES = ("node01", "node02", "node03")
TEXTFILE = "/var/lib/prometheus/node-exporter/gpufleet_verify.prom"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = bring_up(tmp_path_factory, PROFILES)
    converge = subprocess.run([str(BIN / "pyinfra"), "-y", INVENTORY, "deploys/gpu_node.py"], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert converge.returncode == 0, converge.stdout[-3000:]
    check_path(converge.stdout, "GPUFLEET_FACT_MEMO")
    fleet.out = tmp_path_factory.mktemp("verify")
    yield fleet
    save_deb_cache(fleet)
    hosts.down(log=lambda *_: None)


class Verify:
    def __init__(self, proc: subprocess.CompletedProcess, out: Path):
        self.rc = proc.returncode
        self.stdout, self.stderr = proc.stdout, proc.stderr
        self.report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else None
        self.out = out

    @property
    def checks(self) -> list[dict]:
        return [c for h in self.report["hosts"] for c in h["checks"]]

    def failing(self) -> set[tuple[str, str, int | None]]:
        return {(c["host"], c["check"], c["gpu_index"]) for c in self.checks if c["verdict"] in ("fail", "unreachable")}

    def host(self, name: str) -> dict:
        return next(h for h in self.report["hosts"] if h["host"] == name)


def verify(fleet, *extra: str) -> Verify:
    proc = subprocess.run([str(BIN / "gpufleet"), "verify", INVENTORY, "--out", str(fleet.out), *extra], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    return Verify(proc, fleet.out)


def test_converged_fleet_verifies_clean(fleet):
    result = verify(fleet)
    assert result.rc == 0, result.stdout + result.stderr
    assert [h["host"] for h in result.report["hosts"]] == list(NODES)
    assert all(h["status"] == "ok" for h in result.report["hosts"])
    verdicts = {c["verdict"] for c in result.checks}
    assert verdicts <= {"pass", "skip"}, [c for c in result.checks if c["verdict"] not in ("pass", "skip")]
    assert all("not supported" in c["message"] for c in result.checks if c["verdict"] == "skip")
    by_host = {name: {c["check"] for c in result.host(name)["checks"]} for name in NODES}
    # The expected state is the deploy's configuration: MIG layout on the HGX node, power caps on the A100 (80 %)
    # and the workstation (350 W), fabric manager where NVSwitches are, the NCCL file and the driver everywhere.
    assert {"config.mig", "config.service.nvidia-fabricmanager"} <= by_host["node01"]
    assert "config.power_limit" not in by_host["node01"]
    for name in ("node02", "node03"):
        assert "config.power_limit" in by_host[name] and "config.service.nvidia-fabricmanager" not in by_host[name]
    for name in NODES:
        assert {"config.driver_branch", "config.persistence", "config.nccl", "config.service.nvidia-persistenced",
                "health.gpu_count"} <= by_host[name]
    mig = [c for c in result.host("node01")["checks"] if c["check"] == "config.mig"]
    assert [c["expected"] for c in mig[:2]] == [{"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}] * 2
    assert "result: PASS (exit code 0)" in result.stdout
    assert f"report: {fleet.out / 'report.html'}" in result.stdout


def test_junit_parses_back(fleet):
    root = ET.parse(fleet.out / "junit.xml").getroot()
    report = json.loads((fleet.out / "report.json").read_text())
    cases = root.findall(".//testcase")
    assert len(cases) == sum(len(h["checks"]) for h in report["hosts"])
    assert sorted({s.get("name") for s in root.findall("testsuite")}) == list(NODES)
    assert root.findall(".//failure") == [] and root.findall(".//error") == []


def test_every_node_has_its_textfile_and_the_probe_installed(fleet):
    for name in NODES:
        text = ssh(fleet, name, f"cat {TEXTFILE}").stdout
        assert f'gpufleet_verify_host_up{{hostname="{name}"}} 1' in text
        assert not any(f'hostname="{other}"' in text for other in NODES if other != name)  # the node's own results
        assert ssh(fleet, name, f"stat -c %a {TEXTFILE}").stdout.strip() == "644"
        # verify's file, written atomically (no temporary left), beside the converge's desired-state textfile
        listing = set(ssh(fleet, name, f"ls -A $(dirname {TEXTFILE})").stdout.split())
        assert listing - {"gpufleet_desired.prom"} == {"gpufleet_verify.prom"}, listing
        installed = ssh(fleet, name, "ls /opt/gpufleet/probe").stdout.split()
        assert {"probe.py", "bench.py", "pynvml.py"} <= set(installed)
    # the probe ran with each node's own python3: Debian 13's is 3.13 (no crypt, cgi, pipes, telnetlib...)
    assert ssh(fleet, "node03", "python3 -c 'import sys; print(*sys.version_info[:2])'").stdout.split() == ["3", "13"]


def test_second_run_uploads_nothing(fleet):
    result = verify(fleet)
    assert result.rc == 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("[")]
    assert len(lines) == 3 and not any("probe updated" in line for line in lines), result.stderr
    assert (fleet.out / "report.previous.json").exists()


FAULTS = {
    "overheat": (["node01", "overheat", "--gpu", "3"], None,
                 {("node01", "health.temperature", 3), ("node01", "health.clock_events", 3)}),
    "ecc": (["node01", "ecc", "--gpu", "2"], None, {("node01", "health.ecc", 2), ("node01", "health.row_remap", 2)}),
    "lost": (["node01", "lost", "--gpu", "5"], None,
             {("node01", "health.gpu_status", 5), ("node01", "health.gpu_count", None)}),
    "power limit behind our back": (("node02", "nvidia-smi -i 0 -pl 250"), ("node02", "nvidia-smi -i 0 -pl 320"),
                                    {("node02", "config.power_limit", 0)}),
    "persistence off": (("node03", "systemctl stop nvidia-persistenced"),
                        ("node03", "systemctl start nvidia-persistenced"),
                        {("node03", "config.persistence", 0), ("node03", "config.service.nvidia-persistenced", None)}),
}


def exported_gpus(fleet, name: str) -> int:
    """The GPUs of DCGM_FI_DEV_GPU_TEMP on the node's GPU exporter, scraped as Prometheus does (its listen address,
    the exporters account's basic auth)."""
    token = base64.b64encode(f"{web_auth.USER}:{web_auth.password('exporters')}".encode()).decode()
    request = urllib.request.Request(f"http://{fleet.host(name).address}:9400/metrics",
                                     headers={"Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        text = response.read().decode()
    return len(set(re.findall(r'^DCGM_FI_DEV_GPU_TEMP[{][^}]*\bgpu="(\d+)"', text, re.M)))


def wait_until_the_gpu_exporter_exports_every_gpu(fleet, name: str, timeout_s: float = 60) -> None:
    """dcgm-exporter answers with the collection it made up to -c ms ago (15 s here): a GPU back from a fault is
    missing from it until the next collection, which the next test's verify would rightly report."""
    gpus = int(ssh(fleet, name, "nvidia-smi -L | grep -c '^GPU'").stdout.strip())
    deadline = time.monotonic() + timeout_s
    while (seen := exported_gpus(fleet, name)) != gpus:
        assert time.monotonic() < deadline, f"{name}: the GPU exporter exports {seen} of {gpus} GPUs ({timeout_s} s)"
        time.sleep(0.5)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_is_reported_exactly_where_it_is(fleet, fault):
    inject, undo, expected = FAULTS[fault]
    if isinstance(inject, list):
        gpufleet("sim", "fault", *inject)
    else:
        ssh(fleet, *inject)
    try:
        result = verify(fleet)
    finally:
        if isinstance(inject, list):
            gpufleet("sim", "fault", inject[0], "clear")
            wait_until_the_gpu_exporter_exports_every_gpu(fleet, inject[0])
        else:
            ssh(fleet, *undo)
    assert result.rc == 1, result.stdout + result.stderr
    assert result.failing() == expected, result.stdout
    assert all(h["status"] == "ok" for h in result.report["hosts"])
    for host, check, gpu in expected:
        where = f"{host} gpu{gpu}" if gpu is not None else host
        assert f"  {where}  {check}: " in result.stdout


def test_unreachable_host_while_the_others_are_verified(fleet):
    gpufleet("sim", "fault", "node03", "host-down")
    try:
        result = verify(fleet)
    finally:
        gpufleet("sim", "fault", "node03", "clear")
    assert result.rc == 1
    assert result.failing() == {("node03", "host.reachable", None)}
    assert [c["verdict"] for c in result.host("node03")["checks"]] == ["unreachable"]
    assert result.host("node03")["status"] == "unreachable"
    for name in ("node01", "node02"):
        assert result.host(name)["status"] == "ok" and result.host(name)["verdict"] == "pass"
    assert "UNREACHABLE" in result.stderr and "node03" in result.stderr


def test_limit_and_clean_again_after_the_faults_are_cleared(fleet):
    result = verify(fleet, "--limit", "node02,node03")
    assert result.rc == 0, result.stdout
    assert [h["host"] for h in result.report["hosts"]] == ["node02", "node03"]
    assert verify(fleet).rc == 0


def test_pyinfra_entry_writes_the_same_report(fleet, tmp_path):
    out = tmp_path / "pyinfra-verify"
    proc = subprocess.run([str(BIN / "pyinfra"), "-y", INVENTORY, "verify/gpu_node.py", "--data",
                           f"gpufleet_verify_out={out}"], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert [h["host"] for h in report["hosts"]] == list(NODES)
    assert report["summary"]["verdict"] == "pass" and report["summary"]["checks"]["fail"] == 0
    assert "result: PASS (exit code 0)" in proc.stdout
    # both entry points: the same report shape (keys, meta keys, hosts and checks), only the entry differs
    cli_out = tmp_path / "cli-verify"  # a fresh directory for both: no previous report to compare with
    proc = subprocess.run([str(BIN / "gpufleet"), "verify", INVENTORY, "--out", str(cli_out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout
    cli = json.loads((cli_out / "report.json").read_text())
    assert set(report) == set(cli) and set(report["meta"]) == set(cli["meta"]), (report["meta"], cli["meta"])
    assert (report["meta"]["entry"], cli["meta"]["entry"]) == ("pyinfra verify/gpu_node.py", "gpufleet verify")
    assert report["meta"]["probe_bundle"] == cli["meta"]["probe_bundle"]

    def shape(doc):
        return [(h["host"], sorted(h), sorted((c["check"], c["gpu_index"] if c["gpu_index"] is not None else -1)
                                              for c in h["checks"])) for h in doc["hosts"]]

    assert shape(report) == shape(cli)
