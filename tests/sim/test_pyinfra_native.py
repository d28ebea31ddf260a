"""What pyinfra users expect of gpufleet's deploys, end to end on two simulated hosts: ``--diff`` shows the files and
units the GPU-settings stages write, ``--json`` output is JSON, ``--limit`` selects the hosts both configuration
validation and preflight look at.

Host state is judged through the hosts themselves (files, systemctl), never through gpufleet's facts.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from conftest import BIN, REPO, bring_up, check_path, grand_total, ssh

from gpufleet.sim import hosts

DEPLOY = REPO / "deploys" / "gpu_node.py"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
DROP_IN = "/etc/systemd/system/nvidia-persistenced.service.d/gpufleet.conf"
POWER_UNIT = "/etc/systemd/system/gpufleet-power-limits.service"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = bring_up(tmp_path_factory, ["rtx4090-1", "rtx4090-1"], driver="preinstalled")
    yield fleet
    hosts.down(log=lambda *_: None)


def inventory(fleet, nccl_debug: str = "WARN", node02: dict | None = None):
    """The simulator's inventory with a small profile of settings (and host data for node02)."""
    path = fleet.inventory.with_name(f"inventory_{nccl_debug}_{len(node02 or {})}.py")
    text = fleet.inventory.read_text()
    if node02:
        text = re.sub(r"\('node02', \{", "('node02', {" + "".join(f"{k!r}: {v!r}, " for k, v in node02.items()), text)
        assert text != fleet.inventory.read_text()
    path.write_text(text + "\n" + "\n".join([
        "gpu_nodes = (gpu_nodes, {",
        "    'gpufleet_stages': ['persistence', 'power', 'nccl'],",
        "    'gpufleet_power_limit': '80%',",
        f"    'gpufleet_nccl': {{'NCCL_DEBUG': {nccl_debug!r}}},",
        "})",
    ]) + "\n")
    return path


def pyinfra(*args, deploy=DEPLOY) -> subprocess.CompletedProcess:
    """pyinfra ARGS... DEPLOY; stdout and stderr kept apart (``--json`` writes its document on stdout)."""
    result = subprocess.run([str(BIN / "pyinfra"), *map(str, args), str(deploy)], capture_output=True, text=True,
                            timeout=600, cwd=REPO)
    result.stderr = ANSI.sub("", result.stderr)
    if deploy == DEPLOY:
        check_path(result.stderr, "GPUFLEET_FACT_MEMO")
    return result


def test_diff_before_the_first_run_shows_every_file_to_be_created_and_changes_nothing(fleet):
    result = pyinfra("--dry", "--diff", "--limit", "node01", inventory(fleet))
    assert result.returncode == 0, result.stderr
    out = result.stderr
    for path in ("/etc/nccl.conf", DROP_IN, POWER_UNIT, "/etc/gpufleet/power-limits.conf"):
        assert f"[node01] Will create {path}" in out, out
    assert "  + NCCL_DEBUG=WARN" in out
    # the preinstalled driver is Ubuntu-style (nvidia-driver-580-server-open): its packaged unit runs the daemon as root
    assert "  + ExecStart=/usr/bin/nvidia-persistenced --verbose --persistence-mode" in out
    assert "  + Type=oneshot" in out
    assert ssh(fleet, "node01", f"ls /etc/nccl.conf {DROP_IN}", check=False).returncode != 0  # --dry: nothing


def test_converge_then_diff_shows_the_changed_line_and_a_second_run_changes_nothing(fleet):
    result = pyinfra("-y", inventory(fleet))
    assert result.returncode == 0 and grand_total(result.stdout + result.stderr)["error"] == "-", result.stderr
    assert ssh(fleet, "node01", "tail -n1 /etc/nccl.conf").stdout == "NCCL_DEBUG=WARN\n"
    again = pyinfra("-y", inventory(fleet))
    totals = grand_total(again.stdout + again.stderr)
    assert totals["success"] == "-" and totals["error"] == "-", again.stderr

    diff = pyinfra("--dry", "--diff", inventory(fleet, nccl_debug="INFO"))
    assert diff.returncode == 0, diff.stderr
    for name in ("node01", "node02"):
        assert f"[{name}] Will modify /etc/nccl.conf" in diff.stderr
    assert "  - NCCL_DEBUG=WARN" in diff.stderr and "  + NCCL_DEBUG=INFO" in diff.stderr
    assert "Will modify " + DROP_IN not in diff.stderr and "Will create" not in diff.stderr
    assert ssh(fleet, "node01", "tail -n1 /etc/nccl.conf").stdout == "NCCL_DEBUG=WARN\n"


def test_json_output_of_the_fleet_inventory_is_json_and_the_table_goes_to_stderr(fleet):
    result = pyinfra("-y", "--json", inventory(fleet), deploy=REPO / "deploys" / "fleet_inventory.py")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert isinstance(document, dict) and document, result.stdout
    assert re.search(r"^HOST +GPUS +MODEL", result.stderr, re.M), result.stderr
    assert re.search(r"^node02 +1 +NVIDIA GeForce RTX 4090", result.stderr, re.M), result.stderr


def test_limit_selects_the_hosts_validated_and_preflighted(fleet):
    bad = inventory(fleet, nccl_debug="INFO", node02={"gpufleet_driver_flavour": "opne"})
    everyone = pyinfra("-y", bad)
    assert everyone.returncode != 0
    assert "node02: gpufleet_driver_flavour='opne': unknown choice" in everyone.stderr, everyone.stderr
    assert ssh(fleet, "node01", "tail -n1 /etc/nccl.conf").stdout == "NCCL_DEBUG=WARN\n"  # nothing changed

    limited = pyinfra("-y", "--limit", "node01", bad)
    assert limited.returncode == 0, limited.stderr
    assert ssh(fleet, "node01", "tail -n1 /etc/nccl.conf").stdout == "NCCL_DEBUG=INFO\n"
    assert ssh(fleet, "node02", "tail -n1 /etc/nccl.conf").stdout == "NCCL_DEBUG=WARN\n"

    # preflight of node02 alone: a power limit outside its GPU's range stops the run, node01 is not looked at
    out_of_range = inventory(fleet, nccl_debug="TRACE", node02={"gpufleet_power_limit": 5000})
    preflight = pyinfra("-y", "--limit", "node02", out_of_range)
    assert preflight.returncode != 0 and "node02: gpufleet_power_limit=5000" in preflight.stderr, preflight.stderr
    assert "node01" not in preflight.stderr.split("preflight failed")[-1]
    assert ssh(fleet, "node02", "tail -n1 /etc/nccl.conf").stdout == "NCCL_DEBUG=WARN\n"
