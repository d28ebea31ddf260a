"""gpufleet as a user gets it from pip: the wheel built from this checkout, installed into a fresh virtualenv, run
from a directory outside the checkout against one simulated host (converge twice, then verify).

Judged by the simulator (its nvidia-smi, the files on the host), not by gpufleet's facts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import REPO, bring_up, grand_total, ssh

from gpufleet.sim import hosts

NCCL = {"NCCL_DEBUG": "WARN", "NCCL_IB_DISABLE": 1}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv bin directory, a working directory outside the checkout) with the wheel installed."""
    root = tmp_path_factory.mktemp("wheel")
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(root / "dist"), str(REPO)],
                   check=True, capture_output=True, text=True, timeout=300)
    wheels = list((root / "dist").glob("gpufleet-*.whl"))
    assert len(wheels) == 1, wheels
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=120)
    venv_bin = root / "venv" / "bin"
    subprocess.run([str(venv_bin / "pip"), "install", "-q", str(wheels[0])], check=True, capture_output=True,
                   text=True, timeout=600)
    print(f"wheel built and installed in {time.monotonic() - started:.1f} s")
    work = root / "work"
    work.mkdir()
    return venv_bin, work


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = bring_up(tmp_path_factory, ["rtx4090-1"], driver="preinstalled")
    yield fleet
    hosts.down(log=lambda *_: None)


def run(installed, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    venv_bin, work = installed
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv_bin}:{env.get('PATH', '/usr/bin:/bin')}"
    return subprocess.run([str(venv_bin / args[0]), *args[1:]], cwd=work, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def inventory(fleet, installed):
    """The simulator's inventory plus a small profile of settings, in the directory outside the checkout."""
    _, work = installed
    path = work / "inventory.py"
    path.write_text(fleet.inventory.read_text() + "\n" + "\n".join([
        "gpu_nodes = (gpu_nodes, {",
        "    'gpufleet_stages': ['driver', 'persistence', 'power', 'nccl'],",
        "    'gpufleet_power_limit': '80%',",
        f"    'gpufleet_nccl': {NCCL!r},",
        "})",
    ]) + "\n")
    return path


def test_the_installed_package_is_the_one_that_runs(installed):
    result = run(installed, "python", "-c", "import gpufleet, gpufleet.resources as r; print(gpufleet.__file__); "
                                            "print(r.template_names())")
    assert result.returncode == 0, result.stdout
    location, names = result.stdout.splitlines()
    assert location.startswith(str(installed[0].parent)) and not location.startswith(str(REPO)), location
    assert "nccl.conf.j2" in names and "systemd/gpufleet-gpu-settings.service.j2" in names, names


def test_converge_twice_then_verify(installed, fleet, inventory):
    first = run(installed, "pyinfra", "-y", str(inventory), "gpufleet.deploys.gpu_node.gpu_node")
    assert first.returncode == 0, first.stdout
    assert grand_total(first.stdout)["error"] == "-", first.stdout
    smi = ssh(fleet, "node01", "nvidia-smi --query-gpu=persistence_mode,power.limit,power.default_limit "
                               "--format=csv,noheader,nounits").stdout
    persistence, limit, default = (cell.strip() for cell in smi.strip().split(","))
    assert persistence == "Enabled" and float(limit) == round(float(default) * 0.8), smi
    assert ssh(fleet, "node01", "cat /etc/nccl.conf").stdout.splitlines()[-2:] == ["NCCL_DEBUG=WARN",
                                                                                  "NCCL_IB_DISABLE=1"]
    assert ssh(fleet, "node01", "systemctl is-enabled gpufleet-power-limits.service").stdout.strip() == "enabled"

    second = run(installed, "pyinfra", "-y", str(inventory), "gpufleet.deploys.gpu_node.gpu_node")
    assert second.returncode == 0, second.stdout
    totals = grand_total(second.stdout)
    assert totals["success"] == "-" and totals["error"] == "-", second.stdout

    verify = run(installed, "gpufleet", "verify", str(inventory), "--out", "verify-out")
    assert verify.returncode == 0, verify.stdout
    assert (installed[1] / "verify-out" / "report.json").is_file()


def test_python_dash_m_gpufleet_is_the_cli(installed):
    result = run(installed, "python", "-m", "gpufleet", "--help")
    assert result.returncode == 0, result.stdout
    assert "Usage: python -m gpufleet" in result.stdout and "rollout" in result.stdout


def test_rollout_runs_the_packaged_default_deploy_with_pyinfras_data(installed, fleet, inventory):
    """``gpufleet rollout INVENTORY`` without DEPLOY, outside the checkout: the deploy is the wheel's
    gpufleet.deploys.gpu_node.gpu_node; ``--data`` reaches the converge and the verify gate alike."""
    result = run(installed, "gpufleet", "rollout", "-y", str(inventory), "--data", "gpufleet_power_limit=70%",
                 "--canary", "0", "--out", "rollout-out")
    assert result.returncode == 0, result.stdout
    assert "changed (1): node01" in result.stdout, result.stdout
    smi = ssh(fleet, "node01", "nvidia-smi --query-gpu=power.limit,power.default_limit --format=csv,noheader,nounits")
    limit, default = (float(cell) for cell in smi.stdout.split(","))
    assert limit == round(default * 0.7, 2), smi.stdout  # 315 W of an RTX 4090's 450
    state = json.loads((installed[1] / "rollout-out" / "state.json").read_text())
    assert state["deploy"] == "gpufleet.deploys.gpu_node.gpu_node"
