"""dcgm-exporter releases end to end (issue 29): on Debian 13 hosts with datacenter GPUs, one whose repository has
dcgm-exporter (the simulator's, which publishes 4.2.3-4.1.3 and 4.5.3-4.8.2 with their recorded field maps) and one
whose repository has none.

With the older release pinned, the exporter is installed at that release and held, starts, and answers with every
field of its counters file, which holds exactly the fields gpufleet wants that the release's field map (the record)
knows; a second run changes nothing; with the newest release pinned, the full set. The host without dcgm-exporter
gets the NVML exporter and a line saying why; an explicit ``dcgm`` there is refused before any host changes.

Judged by the record (tests/reference/upstream/go-dcgm), the packages dpkg has, and what the exporter answers.
"""

from __future__ import annotations

import base64
import gzip
import json
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import BIN, REPO, bring_up, grand_total, ssh

from gpufleet import web_auth
from gpufleet.operations import exporters
from gpufleet.sim import hosts, network
from gpufleet.sim.gpu import dcgm as simdcgm
from gpufleet.sim.gpu import state as simstate
from tests import upstream

PROFILES = ["h100-sxm-8@debian13", "a100-40gb-1@debian13"]
DCGM_HOST, BARE_HOST = "node01", "node02"
OLD, NEW = "4.2.3-4.1.3", "4.5.3-4.8.2"
EXPORTER = "datacenter-gpu-manager-exporter"
COMMON = {"gpufleet_stages": ["exporters"], "gpufleet_exporters_node": False,
          "gpufleet_exporters_collect_interval": "1s"}

INVENTORY = '''\
import runpy
_sim = runpy.run_path({sim!r})
_hosts = {{name: data for key, group in _sim.items() if key.startswith("sim_") for name, data in group}}
gpu_nodes = [({dcgm!r}, {{**_hosts[{dcgm!r}], **{dcgm_data}}}),
             ({bare!r}, {{**_hosts[{bare!r}], **{bare_data}}})]
'''


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = bring_up(tmp_path_factory, PROFILES, driver="preinstalled")
    # a repository without dcgm-exporter, as NVIDIA's for Debian 13 (an index with one driver package only)
    empty = tmp_path_factory.mktemp("repo-without-dcgm")
    index = b"Package: nvidia-open\nVersion: 590.48.01-1\nArchitecture: amd64\n\n"
    (empty / "Packages").write_bytes(index)
    (empty / "Packages.gz").write_bytes(gzip.compress(index))
    address = network.bridge_address(fleet.net)
    server = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "--bind", address, "--directory", str(empty),
                               "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = _served_port(server)
        fleet.bare_repo = f"http://{address}:{port}/"
        yield fleet
    finally:
        server.terminate()
        server.wait(timeout=10)
        hosts.down(log=lambda *_: None)


def _served_port(server: subprocess.Popen) -> int:
    line = server.stdout.readline()  # "Serving HTTP on ADDRESS port PORT (http://...) ..."
    return int(line.split(" port ", 1)[1].split()[0])


def write_inventory(fleet, dcgm_data: dict, bare_data: dict) -> Path:
    path = fleet.inventory.with_name("releases_inventory.py")
    path.write_text(INVENTORY.format(sim=str(fleet.inventory), dcgm=DCGM_HOST, bare=BARE_HOST,
                                     dcgm_data=repr({**COMMON, **dcgm_data}),
                                     bare_data=repr({**COMMON, "gpufleet_driver_repo_url": fleet.bare_repo,
                                                     **bare_data})))
    return path


def deploy(fleet, dcgm_data: dict, bare_data: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    inventory = write_inventory(fleet, dcgm_data, bare_data or {})
    result = subprocess.run([str(BIN / "pyinfra"), "-y", str(inventory), "deploys/gpu_node.py"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, cwd=REPO)
    if check and result.returncode != 0:
        raise AssertionError(f"gpu_node deploy failed:\n{result.stdout}")
    return result


def metrics(fleet, host: str, timeout: float = 60) -> set[str]:
    """The metric names the GPU exporter of ``host`` answers with (waited for: it collects once started)."""
    token = base64.b64encode(f"{web_auth.USER}:{web_auth.password('exporters')}".encode()).decode()
    request = urllib.request.Request(f"http://{fleet.host(host).address}:9400/metrics",
                                     headers={"Authorization": f"Basic {token}"})
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                names = {line.split()[2] for line in response.read().decode().splitlines()
                         if line.startswith("# TYPE ")}
            if names:
                return names
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{host}: the GPU exporter does not answer on :9400")
        time.sleep(0.5)


def counters_file(fleet, host: str) -> list[tuple[str, str]]:
    text = ssh(fleet, host, f"cat {exporters.DCGM_COUNTERS}").stdout
    return [(row.split(",")[0].strip(), row.split(",")[1].strip()) for row in text.splitlines()
            if row.strip() and not row.startswith("#")]


def with_values(fleet, host: str, fields: list[tuple[str, str]]) -> set[str]:
    """The fields of a counters file the simulated GPU 0 has a value for (the simulator's own state: a blank DCGM
    field is left out of the exposition, as dcgm-exporter leaves it out)."""
    state = simstate.read_state(str(fleet.host(host).dir / "hw/gpus.state"))
    values = simdcgm.field_values(simstate.gpu(state, 0))
    return {field for field, kind in fields if kind != "label" and values.get(field) is not None}


def installed(fleet, host: str) -> tuple[str, str]:
    """(version, dpkg's selection) of the exporter package."""
    out = ssh(fleet, host, f"dpkg-query -W -f='${{Version}} ${{db:Status-Abbrev}}' {EXPORTER}").stdout
    version, status = out.split(" ", 1)
    return version, status.strip()


def wanted_for(tag: str) -> list[str]:
    known = upstream.dcgm_exporter_field_names(tag)
    return [field for field, _, _ in exporters.HEALTH_COUNTERS + exporters.PROFILING_COUNTERS if field in known]


def test_the_older_release_pinned_runs_with_every_field_it_knows_and_a_second_run_changes_nothing(fleet):
    first = deploy(fleet, {"gpufleet_dcgm_exporter_version": OLD})
    assert installed(fleet, DCGM_HOST) == (f"1:{OLD}-1", "hi")  # the pinned release, held
    fields = counters_file(fleet, DCGM_HOST)
    assert [field for field, _ in fields] == wanted_for(OLD)
    assert "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION" not in dict(fields)
    assert f"dcgm-exporter {OLD}: counters its field map does not know left out: " \
           "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION" in first.stdout
    answered = metrics(fleet, DCGM_HOST)
    expected = with_values(fleet, DCGM_HOST, fields)
    assert len(expected) > 20 and expected <= answered, expected - answered
    assert ssh(fleet, DCGM_HOST, "systemctl is-active nvidia-dcgm-exporter.service").stdout.strip() == "active"

    second = deploy(fleet, {"gpufleet_dcgm_exporter_version": OLD})
    total = grand_total(second.stdout)
    assert total["success"] == "-" and total["error"] == "-", second.stdout


def test_the_newest_release_answers_with_the_full_set(fleet):
    deploy(fleet, {"gpufleet_dcgm_exporter_version": NEW})
    assert installed(fleet, DCGM_HOST) == (f"1:{NEW}-1", "hi")
    fields = counters_file(fleet, DCGM_HOST)
    assert [field for field, _ in fields] == [field for field, _, _ in (*exporters.HEALTH_COUNTERS,
                                                                        *exporters.PROFILING_COUNTERS)]
    answered = metrics(fleet, DCGM_HOST)
    assert "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION" in answered
    assert with_values(fleet, DCGM_HOST, fields) <= answered


def verify_counters(fleet, out: Path) -> str:
    inventory = write_inventory(fleet, {"gpufleet_dcgm_exporter_version": NEW}, {})
    subprocess.run([str(BIN / "gpufleet"), "verify", str(inventory), "--limit", DCGM_HOST, "--out", str(out)],
                   cwd=REPO, capture_output=True, text=True, timeout=300)
    report = json.loads((out / "report.json").read_text())
    return next(c["verdict"] for h in report["hosts"] for c in h["checks"]
                if c["check"] == "config.exporter.gpu_counters")


def test_verify_checks_that_the_exporter_answers_with_the_configured_counters(fleet, tmp_path):
    assert verify_counters(fleet, tmp_path / "own") == "pass"
    # the exporter running another counters file than the one on disk (a field dropped from the file, no restart):
    # verify sees the exporter answer with a counter its file does not have
    ssh(fleet, DCGM_HOST, f"sed -i '/^DCGM_FI_DEV_SM_CLOCK,/d' {shlex.quote(exporters.DCGM_COUNTERS)}")
    assert verify_counters(fleet, tmp_path / "other") == "fail"
    deploy(fleet, {"gpufleet_dcgm_exporter_version": NEW})  # the file restored, the exporter restarted
    metrics(fleet, DCGM_HOST)
    assert verify_counters(fleet, tmp_path / "again") == "pass"


def test_a_host_without_dcgm_exporter_gets_the_nvml_exporter_and_the_reason(fleet):
    result = deploy(fleet, {})
    assert (f"{BARE_HOST}: GPU exporter nvml: auto: no dcgm-exporter for this host (the NVIDIA repository "
            f"{fleet.bare_repo} has no {EXPORTER}): the NVML exporter") in result.stdout
    assert f"{DCGM_HOST}: GPU exporter dcgm: auto: datacenter GPUs and apt has dcgm-exporter" in result.stdout
    assert ssh(fleet, BARE_HOST, "systemctl is-active gpufleet-exporter.service").stdout.strip() == "active"
    assert ssh(fleet, BARE_HOST, f"dpkg-query -W {EXPORTER}", check=False).returncode != 0
    assert "DCGM_FI_DEV_GPU_TEMP" in metrics(fleet, BARE_HOST)


def test_explicit_dcgm_where_no_repository_has_it_is_refused_before_any_change(fleet):
    before = ssh(fleet, DCGM_HOST, f"stat -c %Y {shlex.quote(exporters.DCGM_COUNTERS)}").stdout
    result = deploy(fleet, {"gpufleet_exporters_collect_interval": "2s"}, {"gpufleet_exporters_gpu": "dcgm"},
                    check=False)
    assert result.returncode != 0
    assert (f"{BARE_HOST}: gpufleet_exporters_gpu='dcgm': no dcgm-exporter for this host: the NVIDIA repository "
            f"{fleet.bare_repo} has no {EXPORTER}") in result.stdout
    assert "no host was changed" in result.stdout
    assert ssh(fleet, DCGM_HOST, f"stat -c %Y {shlex.quote(exporters.DCGM_COUNTERS)}").stdout == before
