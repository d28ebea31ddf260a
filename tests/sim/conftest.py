"""End-to-end tests on a simulated fleet of our own (separate state dir and network from a user's fleet)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("GPUFLEET_SIM_DIR", "/tmp/gpufleet-test-sim")
os.environ.setdefault("GPUFLEET_SIM_NET", "10.77.9")
# pytest-xdist (make test runs the end-to-end modules on parallel workers): one fleet per worker, each with its own
# state directory and /24, so that the workers' fleets never meet
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw"):
    _net = os.environ["GPUFLEET_SIM_NET"].split(".")
    os.environ["GPUFLEET_SIM_DIR"] += f"-{_WORKER}"
    os.environ["GPUFLEET_SIM_NET"] = ".".join([*_net[:2], str((int(_net[2]) + 100 + int(_WORKER[2:])) % 256)])
# the monitoring plane's generated passwords (gpufleet.web_auth): the test fleets', not the user's ~/.config
os.environ.setdefault("GPUFLEET_CREDENTIALS_DIR", os.environ["GPUFLEET_SIM_DIR"] + "-credentials")

from gpufleet.sim import hosts, image  # noqa: E402
from gpufleet.sim.repo import packages as sim_packages  # noqa: E402

SIM_PACKAGES = {name for name, *_ in sim_packages()}  # the simulator's repository's own: rebuilt, never cached

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DEPLOYS = Path(__file__).with_name("deploys")


def _can_simulate() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    missing = [cmd for cmd in hosts.REQUIRED_COMMANDS if shutil.which(cmd) is None]
    return f"missing {missing}" if missing else None


def bring_up(tmp_path_factory, profiles: list[str], driver: str | None = None):
    """A fresh simulated fleet for one test module (bring-up takes seconds); down it when done."""
    reason = _can_simulate()
    if reason:
        pytest.fail(f"the simulated fleet cannot run here: {reason} (make test installs the system packages)")
    inventory = tmp_path_factory.mktemp("sim") / "inventory.py"
    hosts.down(log=lambda *_: None)
    fleet = hosts.up(len(profiles), profiles, driver=driver, inventory=inventory, force=True, log=lambda *_: None)
    fleet.inventory = inventory
    prime_deb_cache(fleet)
    return fleet


def prime_deb_cache(fleet) -> None:
    """Put the cached Debian .debs into every host's apt archive, so apt installs them without downloading."""
    for h in fleet.hosts:
        cache = image.deb_cache_dir(h.os)  # the .debs from Debian (node_exporter...)
        if not cache.is_dir():
            continue
        archives = h.dir / "root/var/cache/apt/archives"
        archives.mkdir(parents=True, exist_ok=True)
        for deb in cache.glob("*.deb"):
            shutil.copy(deb, archives / deb.name)


def save_deb_cache(fleet) -> None:
    """Keep the Debian .debs the hosts downloaded, per release (atomically: test modules may run in parallel)."""
    for h in fleet.hosts:
        cache = image.deb_cache_dir(h.os)  # the .debs from Debian (node_exporter...)
        cache.mkdir(parents=True, exist_ok=True)
        for deb in (h.dir / "root/var/cache/apt/archives").glob("*.deb"):
            if not (cache / deb.name).exists() and deb.name.split("_")[0] not in SIM_PACKAGES:
                partial = cache / f".{deb.name}.{os.getpid()}"
                shutil.copy(deb, partial)
                os.replace(partial, cache / deb.name)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = bring_up(tmp_path_factory, ["h100-sxm-8", "a100-40gb-1"])
    yield fleet
    save_deb_cache(fleet)
    hosts.down(log=lambda *_: None)


def ssh(fleet, name: str, command: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    result = hosts.run_on(fleet.host(name), ["sh", "-c", command], timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{name}: {command!r} exited {result.returncode}: {result.stdout}{result.stderr}")
    return result


def gpufleet(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([str(BIN / "gpufleet"), *args], capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"gpufleet {' '.join(args)} exited {result.returncode}: {result.stdout}{result.stderr}")
    return result


def pyinfra(fleet, deploy: str | Path, *extra: str) -> subprocess.CompletedProcess:
    result = subprocess.run([str(BIN / "pyinfra"), "-y", *extra, str(fleet.inventory), str(deploy)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, cwd=REPO)
    if result.returncode != 0:
        raise AssertionError(f"pyinfra {deploy} failed:\n{result.stdout}")
    return result


def grand_total(output: str) -> dict[str, str]:
    """pyinfra's result line: 'Grand total  <hosts> <success> <error> <no change>'."""
    match = re.search(r"Grand total\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", output)
    assert match, output
    return dict(zip(("hosts", "success", "error", "no_change"), match.groups(), strict=True))


EXPORTER_UNITS = ("gpufleet-exporter", "nvidia-dcgm-exporter", "nvidia-dcgm",
                  "prometheus-node-exporter")


def exporter_units(fleet, names) -> str:
    """The exporter units' state and recent journal on ``names``: printed when a no-op run changed a host, so a CI log
    says why (an exporter found not running)."""
    command = ("systemctl show -p Id,ActiveState,SubState,NRestarts,ExecMainStatus " + " ".join(EXPORTER_UNITS)
               + "; journalctl -b --no-pager -n 40 " + " ".join(f"-u {u}" for u in EXPORTER_UNITS))
    return "\n".join(f"--- {n}:\n{ssh(fleet, n, command, check=False).stdout}" for n in sorted(names))
